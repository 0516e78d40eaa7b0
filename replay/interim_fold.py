"""INTERIM: a pure fold over events until log-core's `diagnosis.fold.fold_events` lands
(CONTRACTS.md). Same contract: no database, no LLM, no tool; the state at the last event
passed. `fold_events(events, state)` continues from an earlier state, so replay can
checkpoint long sessions."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from diagnosis.models import Event

ENRICHMENT_SOURCES = {
    "lookup_aircraft_info": "aircraft",
    "lookup_flight_plan": "flight_plan",
    "lookup_stand_location": "stand_location",
}
DECISION_EVENTS = {
    "approval.first_approved": "approved once",
    "approval.approved": "approved",
    "approval.rejected": "rejected",
    "approval.timeout": "timed out",
}


@dataclass
class FoldState:
    seq: int = 0
    ts: datetime | None = None
    status: str = "queued"
    fsm: str = "INIT"
    fields: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    risk: dict[str, Any] | None = None
    impact: dict[str, Any] | None = None
    enrichment: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    questions: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: dict[str, dict[str, Any]] = field(default_factory=dict)
    approvals: dict[str, dict[str, Any]] = field(default_factory=dict)
    report: dict[str, Any] | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)
    llm_calls: int = 0

    @property
    def question(self) -> dict[str, Any] | None:
        open_ = [q for q in self.questions if not q["answers"]]
        return open_[-1] if open_ else None


def _decimal(value: Any) -> Decimal:
    try:
        return Decimal(str(value or 0))
    except InvalidOperation:
        return Decimal(0)


def _apply(state: FoldState, event: Event) -> None:
    p = event.payload or {}
    t = event.type
    state.seq, state.ts = event.seq, event.ts
    if t == "session.status_changed":
        state.status = str(p.get("to", state.status))
    elif t == "user.message":
        message = {
            "seq": event.seq,
            "ts": event.ts,
            "author": p.get("author", ""),
            "text": p.get("text", ""),
        }
        state.messages.append(message)
        for question in state.questions:
            if not question["answers"]:
                question["answers"].append(message)
    elif t == "agent.question":
        state.questions.append(
            {
                "seq": event.seq,
                "ts": event.ts,
                "key": p.get("key", ""),
                "field": p.get("field", ""),
                "text": p.get("text", ""),
                "answers": [],
            }
        )
    elif t == "fields.extracted":
        state.fields.update(p.get("changed") or {})
        state.evidence.update(p.get("evidence") or {})
        state.missing = list(p.get("missing") or [])
    elif t == "risk.assessed":
        state.risk = dict(p)
    elif t == "impact.analyzed":
        state.impact = dict(p)
    elif t == "fsm.transition":
        state.fsm = str(p.get("to", state.fsm))
    elif t == "timeline.appended" and p.get("kind") == "enrichment":
        state.enrichment["degraded"] = list(p.get("degraded") or [])
    elif t.startswith("tool.call_"):
        call_id = str(p.get("call_id") or p.get("tool_name"))
        call = state.tool_calls.setdefault(
            call_id,
            {
                "call_id": call_id,
                "tool_name": p.get("tool_name", ""),
                "args": p.get("args") or {},
                "risk_class": p.get("risk_level", "R0"),
                "status": "running",
                "result": None,
                "error": "",
                "seq": event.seq,
                "ts": event.ts,
                "duration_ms": None,
            },
        )
        if t == "tool.call_completed":
            call.update(
                status="completed", result=p.get("response"), duration_ms=p.get("duration_ms")
            )
            source = ENRICHMENT_SOURCES.get(call["tool_name"])
            if source:
                state.enrichment[source] = p.get("response")
        elif t == "tool.call_failed":
            call.update(status="failed", error=p.get("error", ""))
    elif t.startswith("approval."):
        key = str(p.get("tool_call", p.get("tool_name", "")))
        approval = state.approvals.setdefault(
            key,
            {
                "tool_name": p.get("tool_name", ""),
                "args": p.get("args") or {},
                "risk_class": p.get("risk_level", ""),
                "status": "pending",
                "decisions": [],
                "seq": event.seq,
            },
        )
        if t in DECISION_EVENTS:
            approval["status"] = DECISION_EVENTS[t]
            approval["decisions"].append(
                {
                    "decision": DECISION_EVENTS[t],
                    "by": p.get("by", "system" if t == "approval.timeout" else ""),
                    "at": event.ts,
                    "seq": event.seq,
                    "reason": p.get("reason", ""),
                }
            )
    elif t == "report.ready":
        markdown = p.get("markdown")
        state.report = {
            "seq": event.seq,
            "markdown": markdown,
            "sha256": p.get("sha256")
            or (hashlib.sha256(markdown.encode()).hexdigest() if markdown else ""),
            "length": p.get("length", len(markdown or "")),
        }
    elif t == "llm.call":
        state.llm_calls += 1
        state.tokens_in += int(p.get("tokens_in") or 0)
        state.tokens_out += int(p.get("tokens_out") or 0)
        state.cost += _decimal(p.get("cost"))


def fold_events(events: Iterable[Event], state: FoldState | None = None) -> FoldState:
    """The session's state at the last event given (pure: events in, state out). A state
    passed in is copied, never changed."""
    folded = copy.deepcopy(state) if state is not None else FoldState()
    for event in events:
        _apply(folded, event)
    return folded
