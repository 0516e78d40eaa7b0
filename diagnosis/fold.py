"""The state of a session computed from its events alone.

`fold_events(events)` is a pure function: no database, no LLM, no tool, no table but the
events passed in (model instances or anything with the same attributes). It gives the
session as it was at the last event passed, so replay steps through `events[:seq]` and
the export renders the full fold. The tables (`Session.snapshot`, `ToolCall`,
`Approval`, `Report`, the token counters) are projections of the same events kept for
speed; a test rebuilds every session from its events and compares.

`reduce_snapshot` is the one place the snapshot is derived: `append_event` applies it
when it writes an event, and the fold applies it when it reads one, so the live snapshot
and the replayed one cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

from aero.text import MAX_MODEL_TEXT


class EventLike(Protocol):
    seq: int
    type: str
    payload: dict[str, Any]
    ts: datetime
    producer: str


# --- the snapshot (what the agent knows) ----------------------------------------------


def reduce_snapshot(
    snapshot: dict[str, Any], type: str, payload: dict[str, Any]
) -> dict[str, Any] | None:
    """The snapshot after an event of `type` with `payload`, or None when the event does
    not change it. Never mutates `snapshot`."""
    if type == "fields.extracted":
        return {
            **snapshot,
            "fields": {**(snapshot.get("fields") or {}), **payload.get("changed", {})},
            "evidence": {**(snapshot.get("evidence") or {}), **payload.get("evidence", {})},
            "missing": list(payload.get("missing", [])),
            "question": None,
        }
    if type == "agent.question":
        question = {"field": payload["field"], "text": payload["text"], "key": payload["key"]}
        return {**snapshot, "question": question}
    if type == "user.message" and "answers" in payload:
        # An answer closes the question at once (a second answer is refused).
        return {**snapshot, "question": None}
    if type == "timeline.appended" and payload.get("kind") == "enrichment":
        return {**snapshot, "enrichment": payload["enrichment"]}
    if type == "risk.assessed":
        return {**snapshot, "risk": dict(payload)}
    if type == "impact.analyzed":
        return {**snapshot, "impact": dict(payload)}
    if type == "fsm.transition":
        return {**snapshot, "fsm": payload["to"]}
    if type == "report.ready":
        return {**snapshot, "report": True}
    if type == "agent.note" and payload.get("kind") == "scenario_mismatch":
        # The session page offers the switch while the session runs.
        return {**snapshot, "scenario_mismatch": dict(payload["suggested"])}
    if type in ("budget.exhausted", "budget.raised", "budget.stopped"):
        # The model budget: paused with what was spent, raised, or stopped.
        state = {"budget.exhausted": "paused", "budget.raised": "running"}.get(type, "stopped")
        budget = {**(snapshot.get("budget") or {}), **payload, "state": state}
        return {**snapshot, "budget": budget}
    if type == "timeline.appended" and payload.get("kind") == "scenario_switched_to":
        return {**snapshot, "switched_to": payload["session"]}
    if type == "llm.delta":
        # The model's text as it streams; a new attempt starts a new text.
        current = snapshot.get("thinking") or {}
        same = (current.get("request"), current.get("attempt")) == (
            payload.get("request"),
            payload.get("attempt"),
        )
        text = (current.get("text", "") if same else "") + payload.get("text", "")
        thinking = {
            "request": payload.get("request"),
            "attempt": payload.get("attempt"),
            "purpose": payload.get("purpose", ""),
            "status": "pending",
            "text": text[-MAX_MODEL_TEXT:],
        }
        return {**snapshot, "thinking": thinking}
    if type == "llm.call" and payload.get("request") and payload.get("status") == "ok":
        thinking = {
            "request": payload["request"],
            "purpose": payload.get("purpose", ""),
            "status": "done",
            "provider": payload.get("provider", ""),
            "text": payload.get("text", ""),
        }
        return {**snapshot, "thinking": thinking}
    if type == "llm.fallback" and payload.get("request") and payload.get("to") == "offline":
        thinking = {"request": payload["request"], "status": "failed", "text": ""}
        return {**snapshot, "thinking": thinking}
    if type == "session.completed" and payload.get("closed_by"):
        # Closed by the operator with a summary: a normal end, distinct from a cancel.
        closed = {"by": payload["closed_by"], "summary": payload.get("summary", "")}
        return {**snapshot, "closed": closed}
    return None


# --- the projections ------------------------------------------------------------------


@dataclass
class ToolCallState:
    call_id: str
    tool_name: str
    args: dict[str, Any]
    risk_class: str = "R0"
    is_action: bool = False
    position: int = 0
    status: str = "proposed"
    response: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    attempts: int = 0
    duration_ms: int | None = None
    completed_at: datetime | None = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    decision_reason: str = ""
    tool_call: int | None = None  # the ToolCall row's pk, as the events name it


@dataclass
class OutboxState:
    """An action's external effect, as the outbox events tell it (diagnosis/outbox.py)."""

    call_id: str
    outbox: int | None
    idempotency_key: str
    status: str = "pending"  # pending, done, failed, refused
    last_error: str = ""
    completed_at: datetime | None = None


@dataclass
class Decision:
    """One recorded step on an approval: who, when, what, why."""

    seq: int
    step: str  # first_approved | approved | rejected | timeout | canceled
    by: str | None
    at: datetime | None
    reason: str


@dataclass
class ApprovalState:
    call_id: str
    tool_call: int | None
    action_name: str
    risk_class: str
    args: dict[str, Any]
    status: str = "pending"
    deadline: datetime | None = None
    digest: str = ""
    requested_at: datetime | None = None
    decisions: list[Decision] = field(default_factory=list)
    first_approved_by: str | None = None
    first_approved_at: datetime | None = None
    approver: str | None = None
    reason: str = ""
    decided_at: datetime | None = None
    todo: int | None = None
    # The latest argument edit: who, when, the arguments before it, why.
    edited_by: str | None = None
    edited_at: datetime | None = None
    args_before_edit: dict[str, Any] = field(default_factory=dict)
    edit_reason: str = ""

    @property
    def is_open(self) -> bool:
        return self.status in ("pending", "confirming")


@dataclass
class ReportState:
    seq: int
    markdown: str
    sha256: str
    language: str


@dataclass
class Message:
    seq: int
    ts: datetime
    author: str
    text: str
    answers: str | None  # the question key it answers, if any


@dataclass
class Question:
    seq: int
    ts: datetime
    key: str
    field: str
    label: str
    text: str
    answered_seq: int | None = None


@dataclass
class RestrictionState:
    kind: str
    target: str
    call_id: str
    lifted_by: str | None = None
    lifted_note: str = ""
    lifted_seq: int | None = None


@dataclass
class FoldState:
    seq: int = 0
    ts: datetime | None = None
    events: int = 0
    status: str = "queued"
    failure: str = ""
    scenario: str = ""
    version: int | None = None
    created_by: str = ""
    created_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    title: str = ""
    language: str = ""
    snapshot: dict[str, Any] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    tool_calls: dict[str, ToolCallState] = field(default_factory=dict)
    approvals: dict[str, ApprovalState] = field(default_factory=dict)
    outbox: dict[str, OutboxState] = field(default_factory=dict)
    restrictions: list[RestrictionState] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    report: ReportState | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)
    llm_calls: int = 0
    deleted_at: datetime | None = None
    deleted_by: str | None = None
    deleted_reason: str = ""
    closed_by: str = ""  # closed by the operator with a summary (session.completed)
    closed_summary: str = ""

    # Convenience views for templates.
    @property
    def fields(self) -> dict[str, Any]:
        return dict(self.snapshot.get("fields") or {})

    @property
    def evidence(self) -> dict[str, str]:
        return dict(self.snapshot.get("evidence") or {})

    @property
    def risk(self) -> dict[str, Any] | None:
        return self.snapshot.get("risk")

    @property
    def impact(self) -> dict[str, Any] | None:
        return self.snapshot.get("impact")

    @property
    def enrichment(self) -> dict[str, Any] | None:
        return self.snapshot.get("enrichment")

    @property
    def question(self) -> dict[str, Any] | None:
        return self.snapshot.get("question")

    @property
    def fsm(self) -> str:
        return str(self.snapshot.get("fsm") or "")

    @property
    def actions(self) -> list[ToolCallState]:
        """The response actions in the order the agent proposed them."""
        return sorted(
            (c for c in self.tool_calls.values() if c.is_action),
            key=lambda c: (c.position, c.tool_call or 0),
        )

    @property
    def is_deleted(self) -> bool:
        return self.deleted_at is not None

    def apply(self, event: EventLike) -> FoldState:
        """Apply one event in place (events must come in seq order); returns self."""
        _apply(self, event)
        return self


def fold_events(events: Iterable[EventLike], state: FoldState | None = None) -> FoldState:
    """The session at the last event passed. Pass `state` to continue a fold."""
    state = state if state is not None else FoldState()
    for event in events:
        _apply(state, event)
    return state


# --- the reducer ----------------------------------------------------------------------


def parse_ts(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def _tool_call(state: FoldState, payload: dict[str, Any]) -> ToolCallState:
    call_id = str(payload.get("call_id") or f"#{payload.get('tool_call')}")
    call = state.tool_calls.get(call_id)
    if call is None:
        call = ToolCallState(
            call_id=call_id,
            tool_name=payload.get("tool_name", ""),
            args=dict(payload.get("args") or {}),
        )
        state.tool_calls[call_id] = call
    if payload.get("tool_call") is not None:
        call.tool_call = payload["tool_call"]
    for attribute, key in (
        ("risk_class", "risk_level"),
        ("is_action", "is_action"),
        ("position", "position"),
    ):
        if key in payload:
            setattr(call, attribute, payload[key])
    return call


def _approval(state: FoldState, payload: dict[str, Any]) -> ApprovalState:
    call = _tool_call(state, payload)
    approval = state.approvals.get(call.call_id)
    if approval is None:
        approval = ApprovalState(
            call_id=call.call_id,
            tool_call=call.tool_call,
            action_name=call.tool_name,
            risk_class=call.risk_class,
            args=dict(call.args),
        )
        state.approvals[call.call_id] = approval
    return approval


def _decide(state: FoldState, event: EventLike, step: str) -> None:
    payload = event.payload
    call = _tool_call(state, payload)
    approval = _approval(state, payload)
    at = parse_ts(payload.get("at")) or event.ts
    by = payload.get("by") or None
    if by == "system":
        by = None
    reason = payload.get("reason", "")
    approval.decisions.append(Decision(event.seq, step, by, at, reason))
    if step == "first_approved":
        approval.status = "confirming"
        approval.first_approved_by = by
        approval.first_approved_at = at
        return
    call.status = step
    call.decided_by = by
    call.decided_at = at
    call.decision_reason = reason
    approval.status = step
    approval.decided_at = at
    if step in ("approved", "rejected"):
        approval.approver = by
        approval.reason = reason
    elif step == "canceled":
        approval.reason = reason
    if payload.get("todo") is not None:
        approval.todo = payload["todo"]


def _apply(state: FoldState, event: EventLike) -> None:
    t, p = event.type, event.payload
    state.seq = event.seq
    state.ts = event.ts
    state.events += 1
    snapshot = reduce_snapshot(state.snapshot, t, p)
    if snapshot is not None:
        state.snapshot = snapshot

    if t == "session.created":
        state.scenario = p.get("scenario", "")
        state.version = p.get("version")
        state.created_by = p.get("created_by", "")
        state.created_at = event.ts
        state.title = p.get("title", "")
        state.language = p.get("language", "")
    elif t == "session.status_changed":
        state.status = p["to"]
        if p["to"] == "running" and state.started_at is None:
            state.started_at = event.ts
        if p["to"] in ("completed", "failed", "canceled"):
            state.ended_at = event.ts
        if p["to"] == "failed":
            state.failure = p.get("reason", "")
    elif t == "session.completed" and p.get("closed_by"):
        state.closed_by = p["closed_by"]
        state.closed_summary = p.get("summary", "")
    elif t == "session.deleted":
        state.deleted_at = parse_ts(p.get("at")) or event.ts
        state.deleted_by = p.get("by")
        state.deleted_reason = p.get("reason", "")
    elif t == "user.message":
        answers = p.get("answers")
        state.messages.append(
            Message(event.seq, event.ts, p.get("author", ""), p.get("text", ""), answers)
        )
        for question in state.questions:
            if question.key == answers and question.answered_seq is None:
                question.answered_seq = event.seq
    elif t == "agent.question":
        state.questions.append(
            Question(
                event.seq,
                event.ts,
                p["key"],
                p["field"],
                p.get("label", p["field"]),
                p["text"],
            )
        )
    elif t == "llm.call":
        state.llm_calls += 1
        state.tokens_in += int(p.get("tokens_in") or 0)
        state.tokens_out += int(p.get("tokens_out") or 0)
        state.cost += Decimal(str(p.get("cost") or 0))
    elif t == "llm.fallback":
        state.fallbacks.append(dict(p))
    elif t == "approval.required":
        call = _tool_call(state, p)
        call.status = "awaiting_approval"
        approval = _approval(state, p)
        approval.risk_class = call.risk_class
        approval.args = dict(call.args)
        approval.deadline = parse_ts(p.get("deadline"))
        approval.digest = p.get("digest", "")
        approval.requested_at = event.ts
    elif t == "approval.args_edited":
        # An approver corrected the arguments before deciding: the call runs with these,
        # the approval's digest is new and an approve-once on the old ones starts over.
        call = _tool_call(state, p)
        call.args = dict(p["args"])
        approval = _approval(state, p)
        approval.args = dict(p["args"])
        approval.digest = p.get("digest", "")
        approval.status = "pending"
        approval.first_approved_by = None
        approval.first_approved_at = None
        approval.edited_by = p.get("by")
        # Events written before the edit's time was logged: the event's own.
        approval.edited_at = parse_ts(p.get("at")) or event.ts
        approval.args_before_edit = dict(p.get("before") or {})
        approval.edit_reason = str(p.get("reason") or "")
    elif t.startswith("approval.") and t != "approval.required":
        _decide(state, event, t.removeprefix("approval."))
    elif t == "tool.call_queued":
        call = _tool_call(state, p)
        call.status = "executing"
        state.outbox[call.call_id] = OutboxState(
            call.call_id, p.get("outbox"), p.get("idempotency_key", "")
        )
    elif t == "tool.call_started":
        call = _tool_call(state, p)
        call.status = "running"
        call.attempts = int(p.get("attempt") or call.attempts + 1)
    elif t == "tool.call_retrying":
        call = _tool_call(state, p)
        if call.call_id in state.outbox:
            state.outbox[call.call_id].last_error = p.get("error", "")
    elif t in ("tool.call_completed", "tool.call_failed"):
        call = _tool_call(state, p)
        call.status = "failed" if t == "tool.call_failed" else "completed"
        call.response = dict(p.get("response") or {})
        call.error = p.get("error", "")
        call.duration_ms = p.get("duration_ms")
        call.completed_at = parse_ts(p.get("completed_at")) or event.ts
        effect = state.outbox.get(call.call_id)
        if effect is not None and effect.status == "pending":
            effect.status = "failed" if t == "tool.call_failed" else "done"
            effect.last_error = call.error
            effect.completed_at = call.completed_at
        restriction = call.response.get("restriction")
        if restriction and t == "tool.call_completed":
            state.restrictions.append(
                RestrictionState(restriction["kind"], restriction["target"], call.call_id)
            )
    elif t == "tool.call_refused":
        call = _tool_call(state, p)
        call.status = "refused"
        call.error = p.get("error", "")
        call.completed_at = parse_ts(p.get("completed_at")) or event.ts
        effect = state.outbox.get(call.call_id)
        if effect is not None and effect.status == "pending":
            effect.status, effect.last_error = "refused", call.error
            effect.completed_at = call.completed_at
    elif t == "timeline.appended" and p.get("kind") == "todo_resolved" and p.get("restriction"):
        # Done by hand ("closed by phone"): the timed-out action's closure is in force.
        done = p["restriction"]
        state.restrictions.append(RestrictionState(done["kind"], done["target"], done["call_id"]))
    elif t == "timeline.appended" and p.get("kind") == "restriction_lifted":
        for item in state.restrictions:
            same = (item.kind, item.target) == (p.get("restriction"), p.get("target"))
            if same and item.lifted_seq is None:
                item.lifted_by, item.lifted_note = p.get("by"), p.get("note", "")
                item.lifted_seq = event.seq
    elif t == "agent.note":
        state.notes.append(p.get("text", ""))
    elif t == "fsm.violation":
        state.violations.append(dict(p))
    elif t == "report.ready" and "markdown" in p:
        state.report = ReportState(
            event.seq, p["markdown"], p.get("sha256", ""), p.get("language", "")
        )
