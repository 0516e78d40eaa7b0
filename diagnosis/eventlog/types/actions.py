"""Tool calls (lookups, analyses, actions), their effects through the outbox and the
approvals of actions."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _

from diagnosis.eventlog import names
from diagnosis.eventlog.registry import ByKey, EventType, Payload
from diagnosis.eventlog.state import (
    EventLike,
    FoldState,
    OutboxState,
    RestrictionState,
    approval_of,
    decide,
    parse_ts,
    tool_call_of,
)
from diagnosis.eventlog.types.agent import ACTION_SECRETS, SECRET_RISKS, args_text
from scenarios_admin.definition import shown_as_decision

ACTION_PANELS = frozenset({"session-actions"})


class ToolCallEvent(Payload):
    tool_call: int | None = None
    call_id: str = ""
    tool_name: str = ""
    args: dict[str, Any] | None = None
    risk_level: str = ""


def _queued(state: FoldState, event: EventLike) -> None:
    p = event.payload
    call = tool_call_of(state, p)
    call.status = "executing"
    state.outbox[call.call_id] = OutboxState(
        call.call_id, p.get("outbox"), p.get("idempotency_key", "")
    )


def _started(state: FoldState, event: EventLike) -> None:
    p = event.payload
    call = tool_call_of(state, p)
    call.status = "running"
    call.attempts = int(p.get("attempt") or call.attempts + 1)


def _retrying(state: FoldState, event: EventLike) -> None:
    p = event.payload
    call = tool_call_of(state, p)
    if call.call_id in state.outbox:
        state.outbox[call.call_id].last_error = p.get("error", "")


def _ended(failed: bool) -> Any:
    def reduce(state: FoldState, event: EventLike) -> None:
        p = event.payload
        call = tool_call_of(state, p)
        call.status = "failed" if failed else "completed"
        call.response = dict(p.get("response") or {})
        call.error = p.get("error", "")
        call.duration_ms = p.get("duration_ms")
        call.completed_at = parse_ts(p.get("completed_at")) or event.ts
        effect = state.outbox.get(call.call_id)
        if effect is not None and effect.status == "pending":
            effect.status = "failed" if failed else "done"
            effect.last_error = call.error
            effect.completed_at = call.completed_at
        restriction = call.response.get("restriction")
        if restriction and not failed:
            state.restrictions.append(
                RestrictionState(restriction["kind"], restriction["target"], call.call_id)
            )

    return reduce


def _refused(state: FoldState, event: EventLike) -> None:
    p = event.payload
    call = tool_call_of(state, p)
    call.status = "refused"
    call.error = p.get("error", "")
    call.completed_at = parse_ts(p.get("completed_at")) or event.ts
    effect = state.outbox.get(call.call_id)
    if effect is not None and effect.status == "pending":
        effect.status, effect.last_error = "refused", call.error
        effect.completed_at = call.completed_at


def _call_words(p: dict[str, Any]) -> str:
    tail = f": {p['error']}" if p.get("error") else ""
    return f"{p.get('tool_name', '')}({args_text(p.get('args'))}){tail}"


def _required(state: FoldState, event: EventLike) -> None:
    p = event.payload
    call = tool_call_of(state, p)
    call.status = "awaiting_approval"
    approval = approval_of(state, p)
    approval.risk_class = call.risk_class
    approval.args = dict(call.args)
    approval.deadline = parse_ts(p.get("deadline"))
    approval.digest = p.get("digest", "")
    approval.requested_at = event.ts


class ArgsEdited(ToolCallEvent):
    args: dict[str, Any]


def _args_edited(state: FoldState, event: EventLike) -> None:
    # An approver corrected the arguments before deciding: the call runs with these, the
    # approval's digest is new and an approve-once on the old ones starts over.
    p = event.payload
    call = tool_call_of(state, p)
    call.args = dict(p["args"])
    approval = approval_of(state, p)
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


def _decision(step: str) -> Any:
    def reduce(state: FoldState, event: EventLike) -> None:
        decide(state, event, step)

    return reduce


def _approval_words(p: dict[str, Any]) -> str:
    what = f"{p.get('tool_name', '')} [{p.get('risk_level', '')}]"
    if p.get("by"):
        what = _("%(what)s by %(by)s") % {"what": what, "by": p["by"]}
    reason = f": {p['reason']}" if p.get("reason") else ""
    return f"{what}{reason}"


_TIMEOUT_LINE = ByKey(
    "tool_name", {"continue_budget": "approval-timeout-continue-budget"}, default="approval-timeout"
)
_CANCELED_LINE = ByKey(
    "withdrawn",
    {"not_called_for": "approval-canceled-not-called-for"},
    any_value="approval-canceled-withdrawn",
    default="approval-canceled",
)


def _line(name: str) -> str:
    return name.replace(".", "-").replace("_", "-")


def _call(name: str, **declared: Any) -> EventType:
    fields: dict[str, Any] = {
        "payload": ToolCallEvent,
        "summary": _call_words,
        "line": _line(name),
        "masked": ACTION_SECRETS,
        "masked_at": SECRET_RISKS,
        **declared,
    }
    return EventType(name, **fields)


def _approval(name: str, **declared: Any) -> EventType:
    fields: dict[str, Any] = {
        "payload": ToolCallEvent,
        "summary": _approval_words,
        "line": _line(name),
        "masked": ACTION_SECRETS,
        "masked_at": SECRET_RISKS,
        "panels": ACTION_PANELS,
        **declared,
    }
    return EventType(name, **fields)


TYPES = (
    _call(names.TOOL_CALL_QUEUED, reduce=_queued, internal=True, panels=ACTION_PANELS),
    _call(names.TOOL_CALL_STARTED, reduce=_started, internal=True),
    _call(names.TOOL_CALL_RETRYING, reduce=_retrying),
    _call(
        names.TOOL_CALL_COMPLETED,
        reduce=_ended(failed=False),
        # A lookup or an analysis is internal: its finding has its own entry.
        internal=lambda p: not shown_as_decision(str(p.get("tool_name", ""))),
        panels=frozenset({"session-actions", "session-facts"}),
    ),
    _call(names.TOOL_CALL_FAILED, reduce=_ended(failed=True), panels=ACTION_PANELS),
    _call(names.TOOL_CALL_REFUSED, reduce=_refused, panels=ACTION_PANELS),
    _approval(names.APPROVAL_REQUIRED, reduce=_required),
    _approval(
        names.APPROVAL_ARGS_EDITED,
        payload=ArgsEdited,
        reduce=_args_edited,
        line="cockpit",
        panels=frozenset(),
    ),
    _approval(names.APPROVAL_FIRST_APPROVED, reduce=_decision("first_approved")),
    _approval(names.APPROVAL_APPROVED, reduce=_decision("approved")),
    _approval(names.APPROVAL_REJECTED, reduce=_decision("rejected")),
    _approval(names.APPROVAL_TIMEOUT, reduce=_decision("timeout"), line=_TIMEOUT_LINE),
    _approval(names.APPROVAL_CANCELED, reduce=_decision("canceled"), line=_CANCELED_LINE),
)
