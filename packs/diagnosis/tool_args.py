"""The arguments of each evidence tool (DIAGNOSIS.md §2), one pydantic model a tool,
declared once here and registered with the pack (ToolRegistry.evidence_args). A call's
arguments are validated when it runs: a bad one fails that call, recorded with a message
naming the argument, and the diagnosis goes on without it (never a crash)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from packs.diagnosis.knowledge import SimilarCasesArgs

# A service or metric name as the bundle's files write them.
Name = Annotated[
    str, StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.:]*$")
]
# At most this many log lines a log_search answers (the page shows a few samples).
MAX_LINES = 200


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WindowArgs(_Args):
    """A read of one source over the incident's window."""

    since: datetime = Field(description="the window's start (ISO 8601)")
    until: datetime = Field(description="the window's end (ISO 8601)")

    @model_validator(mode="after")
    def ordered(self) -> WindowArgs:
        if self.since > self.until:
            raise ValueError("since is after until")
        return self


class LogSignaturesArgs(WindowArgs):
    """`log_signatures(since, until)`: the ERROR templates with counts, first seen, sample."""


class AnomaliesArgs(WindowArgs):
    """`anomalies(since, until)`: the metrics that left their baseline, with the onset."""


class DeploysArgs(WindowArgs):
    """`deploys(since, until)`: the deploys, those in the window counted."""


class ConfigChangesArgs(WindowArgs):
    """`config_changes(since, until)`: the config changes, those in the window counted."""


class CommitsArgs(WindowArgs):
    """`commits(since, until)`: the system repository's commits (through its MCP git
    server), with the files and lines each changed."""


class LogSearchArgs(_Args):
    """`log_search(service?, level?, contains?, since?, until?, limit)`: log lines."""

    service: Name | None = None
    level: Literal["DEBUG", "INFO", "WARN", "ERROR"] | None = None
    contains: Annotated[str, StringConstraints(min_length=1, max_length=500)] | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = Field(20, ge=1, le=MAX_LINES)


class MetricQueryArgs(_Args):
    """`metric_query(service, metric, since?, until?)`: one metric's samples in time order."""

    service: Name
    metric: Name
    since: datetime | None = None
    until: datetime | None = None


class TopologyArgs(_Args):
    """`topology(service)`: who calls the service and what it depends on."""

    service: Name


class CodeArgs(_Args):
    """`code(commit, path, line)`: the code at a line and the commit's hunk there."""

    # never an option to git (no leading "-"), no spaces
    commit: Annotated[
        str, StringConstraints(min_length=4, max_length=100, pattern=r"^[A-Za-z0-9][-\w./]*$")
    ]
    path: Annotated[str, StringConstraints(min_length=1, max_length=500, pattern=r"^[^\x00]+$")]
    line: int = Field(ge=1, le=10_000_000)

    @field_validator("path")
    @classmethod
    def inside_the_repository(cls, path: str) -> str:
        if path.startswith("/") or ".." in path.split("/"):
            raise ValueError("a path inside the repository: relative, without '..'")
        return path


EVIDENCE_ARGS: dict[str, type[BaseModel]] = {
    "log_search": LogSearchArgs,
    "log_signatures": LogSignaturesArgs,
    "metric_query": MetricQueryArgs,
    "anomalies": AnomaliesArgs,
    "deploys": DeploysArgs,
    "config_changes": ConfigChangesArgs,
    "commits": CommitsArgs,
    "code": CodeArgs,
    "similar_cases": SimilarCasesArgs,
    "topology": TopologyArgs,
}


class BadArguments(ValueError):
    """A call's arguments broke its tool's schema: the call fails with this message."""


def checked(tool: str, args: Any) -> Any:
    """`args` validated by `tool`'s model; BadArguments names each argument at fault."""
    model = EVIDENCE_ARGS.get(tool)
    if model is None:
        raise BadArguments(f"not an evidence tool: {tool}")
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        faults = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        raise BadArguments(f"bad arguments for {tool}: {faults}") from None
