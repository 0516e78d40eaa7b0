"""The playbook's data (DIAGNOSIS.md §3): its rules as a pydantic model read from the
pack's `data/playbook.yaml`, the metrics it reads, and what a diagnosis concludes. The
reasoning over them is `packs.diagnosis.playbook`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from packs.diagnosis.bundle import Commit, ConfigChange, Deploy
from packs.diagnosis.evidence import Signature

DATA = Path(__file__).resolve().parent / "data"
STATE_METRICS = (
    "up",
    "tls_cert_days_left",
    "disk_used_ratio",
    "db_connections_in_use",
    "db_connections_max",
    "memory_rss_mb",
    "memory_limit_mb",
    "restarts_total",
)
ANOMALY_METRICS = ("http_error_ratio", "latency_p99_ms", "up")
# Every metric the playbook reads: what a configured metrics source is asked for.
READ_METRICS = tuple(dict.fromkeys((*ANOMALY_METRICS, *STATE_METRICS)))
# At most this many code locations a blamed commit's hunks give.
MAX_CHANGED_LINES = 5
RANKS = {"state": 0, "change_named": 1, "change_by_time": 2, "upstream": 3}


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Threshold(_Data):
    floor: float = Field(default=0.0, ge=0)
    factor: float = Field(gt=0)


class AnomalyRules(_Data):
    consecutive: int = Field(ge=1)
    http_error_ratio: Threshold
    latency_p99_ms: Threshold
    log_errors_per_minute: Threshold


class SignatureRules(_Data):
    new_since_minutes: int = Field(ge=0)
    min_count: int = Field(ge=1)


class StateWindow(_Data):
    before_minutes: int = Field(ge=0)
    after_minutes: int = Field(ge=0)


class Action(_Data):
    tool: str
    risk_class: Literal["R0", "R1", "R2", "R3"]


class Hypothesis(_Data):
    rank: Literal["state", "change", "upstream", "none"]
    threshold: float | None = None
    action: Action | None = None
    text: dict[Literal["zh", "en"], str]


class Confidence(_Data):
    base: float = Field(ge=0, le=1)
    weights: dict[str, float]
    missing_source: float = Field(ge=0, le=1)
    max: float = Field(gt=0, le=1)


RunMode = Literal["react", "plan_execute", "hierarchical"]
RUN_MODES: tuple[RunMode, ...] = ("react", "plan_execute", "hierarchical")


class RunModes(_Data):
    """How a session runs (DIAGNOSIS.md §4): the mode without a preference or a route,
    the routing matrix (problem type -> mode) and the two switches' thresholds. Absent
    from a definition (a version pinned before run modes): these defaults."""

    default: RunMode = "react"
    routing: dict[str, RunMode] = Field(default_factory=dict)
    # ReAct moves to plan-execute after this many steps in a row that add no evidence.
    react_idle_steps: int = Field(default=3, ge=1)
    # Hierarchical degrades to the minimal path when more than this share of its
    # specialists fail.
    specialist_failure_threshold: float = Field(default=0.4, ge=0, lt=1)


class Playbook(_Data):
    window_minutes: int = Field(gt=0)
    anomaly: AnomalyRules
    signature: SignatureRules
    state_window: StateWindow
    change_window_minutes: int = Field(gt=0)
    hypotheses: dict[str, Hypothesis]
    external_actions: list[str]
    confidence: Confidence
    problem_types: dict[str, dict[Literal["zh", "en"], str]]
    modes: RunModes = Field(default_factory=RunModes)

    @model_validator(mode="after")
    def routes_known_problem_types(self) -> Playbook:
        unknown = sorted(set(self.modes.routing) - set(self.problem_types))
        if unknown:
            raise ValueError(
                f"modes.routing names problem types that are not declared: {', '.join(unknown)}"
                f" (declared: {', '.join(sorted(self.problem_types))})"
            )
        return self


@cache
def default_playbook() -> Playbook:
    return Playbook.model_validate(yaml.safe_load((DATA / "playbook.yaml").read_text("utf-8")))


@dataclass(frozen=True)
class Anomaly:
    service: str
    metric: str  # a metric name, or "log_errors_per_minute"
    onset: datetime
    baseline: float
    peak: float


@dataclass
class Finding:
    hypothesis: str
    service: str
    rank: int
    conditions: list[str]
    change: Deploy | ConfigChange | Commit | None = None
    signature: Signature | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CodeLocation:
    path: str
    line: int
    function: str
    commit: str


@dataclass
class Diagnosis:
    hypothesis: str
    service: str | None
    deploy: str | None
    config_key: str | None
    summary: dict[str, str]
    confidence: float
    problem_type: str
    related_services: list[str]
    code_locations: list[CodeLocation]
    action: dict[str, Any] | None
    t0: datetime
    window: tuple[datetime, datetime]
    anomalies: list[Anomaly]
    new_signatures: list[Signature]
    candidates: list[str]
    findings: list[Finding]
    missing: list[str]
    # The commit blamed (a system's repository read without a deploy record), in full.
    commit: str | None = None
