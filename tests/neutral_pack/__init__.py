"""A neutral domain pack, registered only in tests: one lookup, one action, one finding
kind, naming nothing of the airport. It proves a tool is one declaration and that the
core's registry-driven paths serve a pack they were not written for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel, ConfigDict

from aero.packs import ActionTool, DomainPack, LookupTool, ToolRegistry
from diagnosis.eventlog.registry import FindingKind, Payload

KIND = "neutral"
SYSTEM = "neutral_ops"


class HostArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str


class NoteFinding(Payload):
    text: str = ""


def lookup_host(args: dict[str, Any]) -> dict[str, Any]:
    return {"host": args["host"], "up": args["host"] != "down-1"}


def restart_request(ctx: Any, tool_call: Any) -> tuple[str, str, dict[str, Any]]:
    return SYSTEM, "restart_host", dict(tool_call.request_payload)


def restart_result(ctx: Any, tool_call: Any, remote: dict[str, Any]) -> dict[str, Any]:
    return {"summary": "Host restarted", "reference": remote.get("reference", "")}


def check_host(before: dict[str, Any], edited: dict[str, str]) -> dict[str, Any]:
    from diagnosis.decisions import ActionError

    host = (edited.get("host") or "").strip()
    if not host.startswith("h"):
        raise ActionError(f"{host} is not a host")
    return {**before, "host": host}


LOOKUP = LookupTool(
    "lookup_host", lookup_host, "host", schema=HostArgs, description="Is a host up."
)
ACTION = ActionTool(
    name="restart_host",
    risk_floor="R2",
    system=SYSTEM,
    request=restart_request,
    result=restart_result,
    args=("host",),
    editable=("host",),
    check_args=check_host,
    plain="Restart %(host)s",
    done="Host restarted",
    schema=HostArgs,
    description="Restart a host (R2).",
)
FINDING = FindingKind("host_note", NoteFinding, summary=lambda p: f"note: {p.get('text', '')}")


def pack() -> DomainPack:
    return DomainPack(
        kind=KIND,
        app_label="neutral_pack",
        label={"zh": "中性", "en": "Neutral"},
        tools=ToolRegistry(
            actions={ACTION.name: ACTION},
            lookups={LOOKUP.name: LOOKUP},
            failures={"no_host": "host %(host)s is unknown"},
            argument_words={"host": "host"},
            target_args=("host",),
        ),
        enrichment_warning=lambda enrichment: (
            "the host is down" if (enrichment or {}).get("host", {}).get("up") is False else ""
        ),
    )


@contextmanager
def installed(pack: DomainPack) -> Iterator[DomainPack]:
    """Register `pack` in every registry a pack touches, and restore them all after:
    the pack is never left installed for another test."""
    from aero import packs
    from diagnosis import external
    from diagnosis.agent import tools
    from diagnosis.eventlog import registry

    registries: list[dict[Any, Any]] = [
        packs._PACKS,
        packs._ACTIONS,
        external.PREFIXES,
        tools.ENRICHMENT_SOURCES,
        tools.ENRICHMENT_KEYS,
        tools.FAILURES,
        registry._KINDS,
    ]
    saved = [dict(r) for r in registries]
    saved_in_process = set(tools.IN_PROCESS_SOURCES)
    packs.register(pack)
    external.register_system(SYSTEM, "NTR")
    tools.register_lookups(pack.tools.lookups, pack.tools.failures)
    registry.register_finding(FINDING)
    try:
        yield pack
    finally:
        for r, s in zip(registries, saved, strict=True):
            r.clear()
            r.update(s)
        tools.IN_PROCESS_SOURCES.clear()
        tools.IN_PROCESS_SOURCES.update(saved_in_process)
