"""The policy, checked again where an action executes: the row's status is not trusted
on its own (ARCHITECTURE: risky actions only after a decision)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from aero.models import audit
from aero.packs import action_tool
from diagnosis.eventlog.names import (
    APPROVAL_REQUIRED,
    TOOL_CALL_COMPLETED,
    TOOL_CALL_FAILED,
    TOOL_CALL_REFUSED,
)
from diagnosis.events import append_event, append_event_once
from diagnosis.models import AgentRun, ToolCall, ToolCallStatus
from diagnosis.signals import approval_required, execution_check
from scenarios_admin.definition import below_floor, floor_message


def execution_problems(tool_call: ToolCall) -> list[str]:
    """Why this call must not run now, checked against the policy rather than trusted
    from its status: a proposed call runs only as R0 at or above its floor; an approved
    one only on a decision the approvals app vouches for (fail closed without it)."""
    if below_floor(tool_call.tool_name, tool_call.risk_class):
        return [floor_message(tool_call.tool_name, tool_call.risk_class)]
    declared = action_tool(tool_call.tool_name)
    if declared is not None and declared.problems is not None:
        # The pack's own policy (a diagnosis fix only on the root cause's service).
        found = declared.problems(tool_call)
        if found:
            return found
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
        TOOL_CALL_REFUSED,
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


def open_approval(
    tool_call: ToolCall, *, producer: str, run: AgentRun | None = None, fresh: bool = False
) -> None:
    """A call awaiting approval enters the queue (the approvals app opens its Approval on
    the signal) and the log, with what the approval was opened with (digest, deadline), in
    the caller's transaction. Keyed: a re-run step logs it once. `fresh`: the call was
    inserted in this transaction, so no approval of it can exist yet (no lookup)."""
    opened: dict[str, Any] = {}
    for _, response in approval_required.send(sender=ToolCall, tool_call=tool_call, fresh=fresh):
        if isinstance(response, dict):
            opened.update(response)
    log_approval_required(tool_call, opened, producer=producer, run=run)


def log_approval_required(
    tool_call: ToolCall, opened: dict[str, Any], *, producer: str, run: AgentRun | None = None
) -> None:
    """The `approval.required` event of a call whose approval was opened (keyed)."""
    append_event_once(
        tool_call.session_id,
        APPROVAL_REQUIRED,
        f"approval:{tool_call.pk}",
        {
            "tool_call": tool_call.pk,
            "call_id": tool_call.call_id,
            "tool_name": tool_call.tool_name,
            "args": tool_call.request_payload,
            "risk_level": tool_call.risk_class,
            "is_action": tool_call.is_action,
            "position": tool_call.position,
            **opened,
        },
        producer=producer,
        run=run,
    )


def record_call_finished(
    tool_call: ToolCall,
    *,
    response: dict[str, Any],
    error: str,
    producer: str,
    run: AgentRun | None = None,
) -> None:
    """The call's `tool.call_completed` (or `_failed`) event, from the row as just saved:
    the agent's calls and the lifts an approver decided write the same payload."""
    assert tool_call.completed_at is not None
    append_event(
        tool_call.session_id,
        TOOL_CALL_FAILED if error else TOOL_CALL_COMPLETED,
        {
            "tool_call": tool_call.pk,
            "call_id": tool_call.call_id,
            "tool_name": tool_call.tool_name,
            "args": tool_call.request_payload,
            "risk_level": tool_call.risk_class,
            "duration_ms": tool_call.duration_ms,
            "completed_at": tool_call.completed_at.isoformat(),
            "response": response,
            "error": error,
            "agent_run_id": run.pk if run else None,
        },
        producer=producer,
        run=run,
    )
