from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from approvals.models import Approval, action_digest_of, state_digest_for
from approvals.push import notify_queue
from diagnosis.models import ToolCall
from diagnosis.signals import approval_required, execution_check
from scenarios_admin.definition import LIFT_TOOL


@receiver(approval_required)
def create_approval(sender: Any, tool_call: ToolCall, **kwargs: Any) -> None:
    state = state_digest_for(tool_call, tool_call.session)
    _, created = Approval.objects.get_or_create(
        tool_call=tool_call,
        defaults={
            "session_id": tool_call.session_id,
            "risk_class": tool_call.risk_class,
            "action_name": tool_call.tool_name,
            "action_digest": action_digest_of(tool_call),
            "state_digest": state,
            "digest": Approval.digest_for(tool_call, state),
            # A lift request never times out: the closure staying in force is the safe
            # state, and a timeout's manual to-do would invite an unapproved lift.
            "deadline": None
            if tool_call.tool_name == LIFT_TOOL
            else Approval.deadline_for(tool_call.risk_class),
        },
    )
    if created:
        notify_queue()


@receiver(execution_check)
def check_decision(sender: Any, tool_call: ToolCall, **kwargs: Any) -> list[str]:
    """Defence in depth at execution time: what must be true of the decision behind
    an approved call, whatever its row says."""
    from approvals.policy import decision_problems

    return decision_problems(tool_call)
