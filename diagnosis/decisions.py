"""What every decision on an action shares: the refusal a person reads, the check of
the texts a person gives, and the decision recorded on the call with its event."""

from __future__ import annotations

from typing import Any

from aero.text import TextRefused, check_text
from diagnosis.events import append_event
from diagnosis.models import ToolCall, ToolCallStatus


class ActionError(Exception):
    """A refused action; the message is shown to the user as it is."""


def checked_text(text: str | None, *, limit: int, what: str, required: str = "") -> str:
    """aero.text.check_text for do_* functions: a refusal is an ActionError. Every text a
    person gives is checked here too, not only in the form (the CLI and later callers
    have no form), and refused, never cut."""
    try:
        return check_text(text, limit=limit, what=what, required=required)
    except TextRefused as exc:
        raise ActionError(str(exc)) from None


OUTCOMES = {
    "approved": ToolCallStatus.APPROVED,
    "rejected": ToolCallStatus.REJECTED,
    "timeout": ToolCallStatus.TIMEOUT,
    "canceled": ToolCallStatus.CANCELED,
}


def record_decision(
    tool_call: ToolCall,
    user: Any,
    outcome: str,
    reason: str,
    producer: str,
    at: Any,
    extra: dict[str, Any] | None = None,
) -> None:
    """The decision on the call's row and its `approval.<outcome>` event, together (the
    caller holds the session and call row locks)."""
    tool_call.status = OUTCOMES[outcome]
    tool_call.decided_by = user
    tool_call.decided_at = at
    tool_call.decision_reason = reason
    tool_call.save(update_fields=["status", "decided_by", "decided_at", "decision_reason"])
    append_event(
        tool_call.session_id,
        f"approval.{outcome}",
        {
            "tool_call": tool_call.pk,
            "call_id": tool_call.call_id,
            "tool_name": tool_call.tool_name,
            "args": tool_call.request_payload,
            "risk_level": tool_call.risk_class,
            "by": user.get_username() if user else "system",
            "at": at.isoformat(),
            "reason": reason,
            **(extra or {}),
        },
        producer=producer,
    )
