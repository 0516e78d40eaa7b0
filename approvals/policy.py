"""The decision policy, checked again when an approved call is about to run.

do_decide enforces the policy as people decide; this module re-reads what was decided
and refuses to let a call run when the rows do not add up to a valid decision (a row
edited by hand, a forged status, a lowered risk class). Called through
diagnosis.signals.execution_check, with the call row locked."""

from __future__ import annotations

from django.conf import settings

from aero.models import AuditLog
from approvals.models import Approval, ApprovalStatus, action_digest_of
from diagnosis.eventlog.names import APPROVAL_APPROVED
from diagnosis.models import ToolCall
from scenarios_admin.definition import (
    LIFT_TOOL,
    RISK_CLASSES,
    below_floor,
    floor_message,
)


def decision_problems(tool_call: ToolCall) -> list[str]:
    """Every reason the call must not run; empty when its decision satisfies the policy."""
    problems: list[str] = []
    if below_floor(tool_call.tool_name, tool_call.risk_class):
        problems.append(floor_message(tool_call.tool_name, tool_call.risk_class))
    if tool_call.risk_class == "R0" and not problems:
        return []  # R0 runs without a decision
    approval = (
        Approval.objects.filter(tool_call=tool_call)
        .select_related("session", "first_approved_by", "approver")
        .first()
    )
    if approval is None:
        return [*problems, "no approver's decision exists for this call"]
    if approval.status != ApprovalStatus.APPROVED or approval.approver_id is None:
        problems.append(f"its approval is {approval.get_status_display().lower()}, not approved")
    if approval.risk_class not in RISK_CLASSES or approval.risk_class != tool_call.risk_class:
        problems.append(
            f"it was decided as {approval.risk_class} but is recorded as {tool_call.risk_class}"
        )
    if approval.action_digest != action_digest_of(tool_call):
        problems.append("its tool or arguments changed after the decision")
    if approval.digest != Approval.digest_for(tool_call, approval.state_digest):
        problems.append("its decision is bound to a different request (digest mismatch)")
    if tool_call.decided_by_id != approval.approver_id:
        problems.append("the call names a different approver than its decision")
    if approval.needs_two_steps() and approval.first_approved_by_id is None:
        problems.append(f"an {approval.risk_class} action needs an approval and a confirmation")
    if approval.risk_class == "R3" and not approval.reason.strip():
        problems.append("an R3 action needs a written reason")
    if settings.AERO_TWO_PERSON_RULE and approval.risk_class in ("R2", "R3"):
        if approval.first_approved_by_id == approval.approver_id:
            problems.append("two-person rule: one approver approved and confirmed")
        if approval.session.created_by_id in (approval.first_approved_by_id, approval.approver_id):
            problems.append("two-person rule: the session's creator decided")
    if tool_call.tool_name == LIFT_TOOL:
        requester = tool_call.request_payload.get("requested_by")
        deciders = {u.get_username() for u in (approval.first_approved_by, approval.approver) if u}
        if requester in deciders:
            problems.append("the person who requested the lift also decided it")
    # The audit log is append-only (and chained): a decision that was never audited was
    # never made through do_decide.
    audited = AuditLog.objects.filter(
        action=APPROVAL_APPROVED,
        object_type=Approval._meta.label_lower,
        object_id=str(approval.pk),
        detail__digest=approval.digest,
    ).exists()
    if not audited:
        problems.append("no audit entry records this decision")
    return problems
