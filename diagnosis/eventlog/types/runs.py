"""Child agent runs (a hierarchical run's specialists): each one's start and end, with
its status, times and tokens, as events. The AgentRun row is the projection the agent
tree reads; these events are its history (the timeline, replay, the export, the fold)."""

from __future__ import annotations

from typing import Any, Literal

from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from diagnosis.eventlog import names
from diagnosis.eventlog.registry import EventType, Payload
from diagnosis.eventlog.state import EventLike, FoldState, RunState
from diagnosis.wording import agent_words

# The reason of a run the reconciler closed (diagnosis.jobs.reconciler).
JOB_GONE = "job_gone"


class RunStarted(Payload):
    run: int
    agent: str
    parent: int | None = None
    mode: str = ""


class RunEnded(Payload):
    run: int
    agent: str
    status: Literal["completed", "failed"]
    started_at: str
    ended_at: str
    tokens_in: int = 0
    tokens_out: int = 0
    cost: str = "0"
    # Why it ended so, when not by its own steps: `job_gone`, a job's run the reconciler
    # closed after its job died without closing it.
    reason: str = ""


def _started(state: FoldState, event: EventLike) -> None:
    p = event.payload
    state.agent_runs[int(p["run"])] = RunState(
        run=int(p["run"]),
        agent=str(p["agent"]),
        parent=p.get("parent"),
        mode=str(p.get("mode") or ""),
        started_at=event.ts,
    )


def _ended(state: FoldState, event: EventLike) -> None:
    p = event.payload
    run = state.agent_runs.setdefault(int(p["run"]), RunState(run=int(p["run"]), agent=p["agent"]))
    run.status = str(p["status"])
    run.started_at = parse_datetime(str(p["started_at"])) or run.started_at
    run.ended_at = parse_datetime(str(p["ended_at"]))
    run.tokens_in = int(p.get("tokens_in") or 0)
    run.tokens_out = int(p.get("tokens_out") or 0)


def _started_words(p: dict[str, Any]) -> str:
    return _("%(agent)s started") % {"agent": agent_words(p.get("agent", ""))}


def _ended_words(p: dict[str, Any]) -> str:
    names_ = {
        "agent": agent_words(p.get("agent", "")),
        "tokens": f"{p.get('tokens_in', 0)}/{p.get('tokens_out', 0)}",
    }
    if p.get("reason") == JOB_GONE:
        return _("%(agent)s failed: its job ended without closing it") % names_
    if p.get("status") == "failed":
        return _("%(agent)s failed (tokens in/out %(tokens)s)") % names_
    return _("%(agent)s completed (tokens in/out %(tokens)s)") % names_


TYPES = (
    EventType(
        names.AGENT_RUN_STARTED,
        RunStarted,
        reduce=_started,
        summary=_started_words,
        line="agent-run-started",
        internal=True,
    ),
    EventType(
        names.AGENT_RUN_ENDED,
        RunEnded,
        reduce=_ended,
        summary=_ended_words,
        line="agent-run-ended",
    ),
)
