from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from approvals.models import Approval, action_digest_of, state_digest_of
from approvals.push import notify_queue
from diagnosis.models import ToolCall
from diagnosis.signals import approval_required


@receiver(approval_required)
def create_approval(sender: Any, tool_call: ToolCall, **kwargs: Any) -> dict[str, Any]:
    """Open the approval; what it was opened with goes into the `approval.required`
    event (the sender logs it in the same transaction)."""
    state = state_digest_of(tool_call.session)
    approval, created = Approval.objects.get_or_create(
        tool_call=tool_call,
        defaults={
            "session_id": tool_call.session_id,
            "risk_class": tool_call.risk_class,
            "action_name": tool_call.tool_name,
            "action_digest": action_digest_of(tool_call),
            "state_digest": state,
            "digest": Approval.digest_for(tool_call, state),
            "deadline": Approval.deadline_for(tool_call.risk_class),
        },
    )
    if created:
        notify_queue()
    return {
        "approval": approval.pk,
        "digest": approval.digest,
        "deadline": approval.deadline.isoformat() if approval.deadline else None,
    }
