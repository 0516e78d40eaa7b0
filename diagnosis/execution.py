"""The policy, checked again where an action executes: the row's status is not trusted
on its own (ARCHITECTURE: risky actions only after a decision; ADR 40)."""

from __future__ import annotations

from django.utils import timezone

from aero.models import audit
from diagnosis.events import append_event
from diagnosis.models import AgentRun, ToolCall, ToolCallStatus
from diagnosis.signals import execution_check
from scenarios_admin.definition import below_floor, floor_message


def execution_problems(tool_call: ToolCall) -> list[str]:
    """Why this call must not run now, checked against the policy rather than trusted
    from its status: a proposed call runs only as R0 at or above its floor; an approved
    one only on a decision the approvals app vouches for (fail closed without it)."""
    if below_floor(tool_call.tool_name, tool_call.risk_class):
        return [floor_message(tool_call.tool_name, tool_call.risk_class)]
    if tool_call.status == ToolCallStatus.PROPOSED:
        if tool_call.risk_class != "R0":
            return [f"an {tool_call.risk_class} action runs only after an approver's decision"]
        return []
    responses = execution_check.send(sender=ToolCall, tool_call=tool_call)
    if not responses:
        return ["no decision policy is installed (the approvals app registers it)"]
    return [problem for _, found in responses for problem in found or []]


def refuse_execution(
    tool_call: ToolCall, problems: list[str], *, producer: str, run: AgentRun | None = None
) -> None:
    """Record a refused execution: the call ends refused, with an event and an audit
    entry naming every reason. Runs inside the caller's transaction."""
    tool_call.status = ToolCallStatus.REFUSED
    tool_call.error = "refused by the policy: " + "; ".join(problems)
    tool_call.completed_at = timezone.now()
    tool_call.save(update_fields=["status", "error", "completed_at"])
    append_event(
        tool_call.session_id,
        "tool.call_refused",
        {
            "tool_call": tool_call.pk,
            "call_id": tool_call.call_id,
            "error": tool_call.error,
            "completed_at": tool_call.completed_at.isoformat(),
            "tool_name": tool_call.tool_name,
            "args": tool_call.request_payload,
            "risk_level": tool_call.risk_class,
            "problems": problems,
        },
        producer=producer,
        run=run,
    )
    audit(
        "action.refused",
        obj=tool_call,
        actor_label="policy",
        session_id=tool_call.session_id,
        detail={
            "tool": tool_call.tool_name,
            "args": tool_call.request_payload,
            "risk_class": tool_call.risk_class,
            "problems": problems,
        },
    )
