"""The folded session: what a session's events say, as plain data (the fold's state).

The reducers (each event type's step, diagnosis.eventlog.types) change it in place;
diagnosis.fold walks the events."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

from diagnosis.eventlog import registry


class EventLike(Protocol):
    seq: int
    type: str
    payload: dict[str, Any]
    ts: datetime
    producer: str


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
    # What the report is worded from in each reader's language (None: logged before
    # reports kept their facts; the text reads as written).
    facts: dict[str, Any] | None = None


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
    optional: bool = False
    # An optional question still open when every action was decided: closed unanswered.
    unanswered_seq: int | None = None


@dataclass
class RestrictionState:
    kind: str
    target: str
    call_id: str
    lifted_by: str | None = None
    lifted_note: str = ""
    lifted_seq: int | None = None


@dataclass
class RunState:
    """A child agent run as its `agent.run_started` / `agent.run_ended` events tell it."""

    run: int
    agent: str
    parent: int | None = None
    mode: str = ""
    status: str = "running"
    started_at: datetime | None = None
    ended_at: datetime | None = None
    tokens_in: int = 0
    tokens_out: int = 0


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
    tokens_estimated: bool = False  # some of the tokens are AERO's estimate
    llm_calls: int = 0
    deleted_at: datetime | None = None
    deleted_by: str | None = None
    deleted_reason: str = ""
    closed_by: str = ""  # closed by the operator with a summary (session.completed)
    closed_summary: str = ""
    # Child agent runs (specialists) by run id, as their start and end events tell them.
    agent_runs: dict[int, RunState] = field(default_factory=dict)

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
        apply_event(self, event)
        return self


def parse_ts(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def tool_call_of(state: FoldState, payload: dict[str, Any]) -> ToolCallState:
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


def approval_of(state: FoldState, payload: dict[str, Any]) -> ApprovalState:
    call = tool_call_of(state, payload)
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


def decide(state: FoldState, event: EventLike, step: str) -> None:
    payload = event.payload
    call = tool_call_of(state, payload)
    approval = approval_of(state, payload)
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


def apply_event(state: FoldState, event: EventLike) -> None:
    """One event's step of the fold: where the fold stands, the snapshot, then what the
    event's type declares (registry)."""
    state.seq = event.seq
    state.ts = event.ts
    state.events += 1
    snapshot = registry.reduce_snapshot(state.snapshot, event.type, event.payload)
    if snapshot is not None:
        state.snapshot = snapshot
    reduce = registry.get(event.type).reduce
    if reduce is not None:
        reduce(state, event)
