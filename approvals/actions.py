"""Decisions on approvals (diagnosis tech plan §5.5).

R1: one approval. R2: an approval, then a separate confirmation of the exact action.
R3: a confirmation with a written reason. With the two-person rule (settings) R2 and R3
take two different approvers, neither of them the session's creator. A rejection always
needs a reason. Every decision is single-use, bound to the digest it was shown with,
and audited. A timeout never approves: it becomes a manual to-do."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from aero.models import audit
from aero.packs import action_tool
from aero.templatetags.aero_text import when
from aero.text import MAX_NOTE, MAX_REASON
from approvals.models import (
    Approval,
    ApprovalStatus,
    ManualTodo,
    action_digest_of,
    state_digest_for,
)
from approvals.push import notify_queue
from diagnosis import restrictions
from diagnosis.actions import do_apply_decision
from diagnosis.decisions import ActionError, checked_text
from diagnosis.eventlog.names import (
    APPROVAL_ARGS_EDITED,
    APPROVAL_FIRST_APPROVED,
    APPROVAL_TIMEOUT,
    TIMELINE_APPENDED,
)
from diagnosis.events import append_event, lock_session
from diagnosis.lifts import lock_lift_sessions
from diagnosis.push import notify_board
from scenarios_admin.definition import below_floor, floor_message, restriction_of

logger = logging.getLogger("approvals")

APPROVE = "approve"
CONFIRM = "confirm"
REJECT = "reject"
DECISIONS = (APPROVE, CONFIRM, REJECT)


def do_decide(
    approval_id: int,
    user: Any,
    decision: str,
    reason: str = "",
    *,
    digest: str,
    producer: str = "web",
) -> Approval:
    """Record one decision step. Locks the session row, then the approval row, so double
    clicks and concurrent approvers produce exactly one recorded decision per step: the
    step must match the approval's state (a second "approve" is not a confirmation).
    `digest` is the request the decider was shown; a missing one is refused, never
    skipped."""
    reason = checked_text(reason, limit=MAX_REASON, what="reason")
    if decision not in DECISIONS:
        raise ActionError(_("Unknown decision: choose approve, confirm or reject."))
    with transaction.atomic():
        approval = Approval.objects.select_related("tool_call").get(pk=approval_id)
        if approval.is_lift:
            lock_lift_sessions(approval.tool_call)  # its own session among them, in order
        session = lock_session(approval.session_id)
        approval = _lock_approval(approval_id)
        # The deadline is enforced here, under the row lock, and not only by the sweeper:
        # with every worker down a late decision must still not execute.
        if approval.is_open and approval.is_past_deadline():
            _time_out(approval, session)
            timed_out = approval
        else:
            _check_still_valid(approval, session, digest)
            return _decide_locked(approval, session, user, decision, reason, producer)
    # Refused after the commit: the timeout (status, manual to-do, event) stays recorded.
    raise ActionError(
        _(
            "The deadline for this decision passed at %(deadline)s; your decision was not "
            "recorded and the action became a manual to-do."
        )
        % {"deadline": when(timed_out.deadline)}
    )


def _lock_approval(approval_id: int) -> Approval:
    """The approval row, locked after its session's (docs/lock-order.md), its tool call
    read with it but not locked: a duplicate decision, refused once it sees the row,
    never waits for a tool call the running job holds."""
    return (
        Approval.objects.select_for_update(of=("self",))
        .select_related("tool_call")
        .get(pk=approval_id)
    )


def _decide_locked(
    approval: Approval, session: Any, user: Any, decision: str, reason: str, producer: str
) -> Approval:
    """The decision step itself; the caller holds the session and approval row locks."""
    if decision == REJECT:
        if not reason:
            raise ActionError(_("A rejection needs a reason."))
        return _finish(approval, user, ApprovalStatus.REJECTED, reason, producer)
    _check_approver(approval, session, user, decision)
    if (
        approval.risk_class == "R3"
        and not reason
        and (decision == CONFIRM or not approval.needs_two_steps())
    ):
        raise ActionError(_("An R3 action needs a written reason to be confirmed."))
    if decision == APPROVE and approval.needs_two_steps():
        approval.status = ApprovalStatus.CONFIRMING
        approval.first_approved_by = user
        approval.first_approved_at = timezone.now()
        approval.save(update_fields=["status", "first_approved_by", "first_approved_at"])
        append_event(
            session.pk,
            APPROVAL_FIRST_APPROVED,
            {
                "tool_call": approval.tool_call_id,
                "call_id": approval.tool_call.call_id,
                "tool_name": approval.action_name,
                "args": approval.tool_call.request_payload,
                "by": user.get_username(),
                "at": approval.first_approved_at.isoformat(),
                "risk_level": approval.risk_class,
                "reason": reason,
            },
            producer=producer,
        )
        _audit_and_notify(APPROVAL_FIRST_APPROVED, approval, user, reason)
        return approval
    return _finish(approval, user, ApprovalStatus.APPROVED, reason, producer)


def do_edit_args(
    approval_id: int,
    user: Any,
    args: dict[str, str],
    reason: str,
    *,
    digest: str,
    producer: str = "web",
) -> Approval:
    """An approver corrects an action's arguments before deciding it: "close
    taxiway B, not A". The tool and its risk class stay (never below the tool's floor);
    every argument is checked against the world by the action's pack; the edit is an
    event with before and after, and the approval is re-digested, so a decision shown
    the old arguments is refused and an approve-once on them starts over. Locks the
    session row, then the approval row. Lift requests are not editable (they name one
    restriction)."""
    reason = checked_text(
        reason, limit=MAX_REASON, what="reason", required=_("Say why the arguments change.")
    )
    with transaction.atomic():
        approval = Approval.objects.select_related("tool_call").get(pk=approval_id)
        session = lock_session(approval.session_id)
        approval = _lock_approval(approval_id)
        _check_still_valid(approval, session, digest)
        if approval.is_lift:
            raise ActionError(_("A lift request names one restriction; reject it instead."))
        tool_call = approval.tool_call
        before = dict(tool_call.request_payload)
        after = checked_args(tool_call.tool_name, before, args)
        if after == before:
            raise ActionError(_("Nothing changed: the arguments are the same."))
        if below_floor(tool_call.tool_name, tool_call.risk_class):
            raise ActionError(floor_message(tool_call.tool_name, tool_call.risk_class))
        tool_call.request_payload = after
        tool_call.save(update_fields=["request_payload"])
        approval.action_digest = action_digest_of(tool_call)
        approval.digest = Approval.digest_for(tool_call, approval.state_digest)
        approval.status = ApprovalStatus.PENDING
        approval.first_approved_by = None
        approval.first_approved_at = None
        edited_at = timezone.now()
        approval.edited_by = user
        approval.edited_at = edited_at
        approval.args_before_edit = before
        approval.edit_reason = reason
        approval.save(
            update_fields=[
                "action_digest",
                "digest",
                "status",
                "first_approved_by",
                "first_approved_at",
                "edited_by",
                "edited_at",
                "args_before_edit",
                "edit_reason",
            ]
        )
        append_event(
            session.pk,
            APPROVAL_ARGS_EDITED,
            {
                "tool_call": tool_call.pk,
                "call_id": tool_call.call_id,
                "tool_name": tool_call.tool_name,
                "before": before,
                "args": after,
                "risk_level": tool_call.risk_class,
                "digest": approval.digest,
                "by": user.get_username(),
                "at": edited_at.isoformat(),
                "reason": reason,
            },
            producer=producer,
        )
        audit(
            APPROVAL_ARGS_EDITED,
            obj=approval,
            actor=user,
            session_id=session.pk,
            detail={
                "tool": tool_call.tool_name,
                "before": before,
                "after": after,
                "reason": reason,
            },
        )
        notify_queue()
    return approval


def checked_args(tool: str, before: dict[str, Any], edited: dict[str, str]) -> dict[str, Any]:
    """The call's arguments with the edited ones, each checked against the world by the
    pack that declares the action; one without such a check has nothing to edit."""
    declared = action_tool(tool)
    if declared is None or declared.check_args is None:
        return dict(before)
    return declared.check_args(before, edited)


def do_decide_r1_batch(
    session_id: Any,
    user: Any,
    decision: str,
    reason: str,
    shown: list[tuple[int, str]],
    *,
    producer: str = "web",
) -> list[Approval]:
    """Approve or reject all the R1 actions of one incident the approver was shown, at
    once: all or none, each recorded and audited as its own decision. Never
    R2/R3 (their confirmation and reason are per action) and never a lift. `shown` is
    the (approval id, digest) pairs on the page: an approval added since is not swept
    in. One transaction: the first refusal rolls every decision of the batch back."""
    if decision not in (APPROVE, REJECT):
        raise ActionError(_("A batch can only approve or reject."))
    if not shown:
        raise ActionError(_("No actions were selected."))
    ids = [pk for pk, _digest in shown]
    approvals = {a.pk: a for a in Approval.objects.filter(pk__in=ids, session_id=session_id)}
    for pk in ids:
        approval = approvals.get(pk)
        if approval is None:
            raise ActionError(_("An action of this batch belongs to another incident; refused."))
        if approval.risk_class != "R1" or approval.is_lift or approval.is_budget:
            raise ActionError(
                _(
                    "%(action)s is %(risk)s: only R1 actions are decided in a batch; decide "
                    "it on its own."
                )
                % {"action": approval.action_name, "risk": approval.risk_class}
            )
    with transaction.atomic():
        return [
            do_decide(pk, user, decision, reason, digest=digest, producer=producer)
            for pk, digest in shown
        ]


def _check_still_valid(approval: Approval, session: Any, digest: str | None) -> None:
    if not digest:
        raise ActionError(
            _(
                "This decision does not say which request it is for (no digest); "
                "reload and decide again."
            )
        )
    if not approval.is_open:
        if approval.status == ApprovalStatus.CANCELED:
            # Closed without a decision: say by what (its session's end, or a correction).
            if session.is_ended:
                raise ActionError(
                    _(
                        "This action was closed when the session was %(status)s; your "
                        "decision was not recorded."
                    )
                    % {"status": session.get_status_display().lower()}
                )
            raise ActionError(
                _("This action was withdrawn (%(reason)s); your decision was not recorded.")
                % {"reason": approval.reason}
            )
        raise ActionError(
            _("This action was already %(status)s; your decision was not recorded.")
            % {"status": approval.get_status_display().lower()}
        )
    # A lift request outlives the session that closed the runway or taxiway.
    if session.is_ended and not approval.is_lift:
        raise ActionError(
            _("The session is %(status)s; nothing can be decided in it any more.")
            % {"status": session.get_status_display().lower()}
        )
    if action_digest_of(approval.tool_call) != approval.action_digest:
        raise ActionError(_("The action's arguments changed after it was requested; refused."))
    if state_digest_for(approval.tool_call, session) != approval.state_digest:
        if approval.is_lift:
            raise ActionError(_("The restriction is no longer in force; nothing to lift."))
        raise ActionError(
            _(
                "The session's state moved on since this was requested "
                "(fields, risk or impact changed); refused."
            )
        )
    if digest != approval.digest:
        raise ActionError(_("This request is not the one you were shown; reload and decide again."))


def _check_approver(approval: Approval, session: Any, user: Any, decision: str) -> None:
    two_steps = approval.needs_two_steps()
    if decision == CONFIRM and approval.status != ApprovalStatus.CONFIRMING:
        raise ActionError(_("There is nothing to confirm yet: approve first."))
    if decision == APPROVE and approval.status == ApprovalStatus.CONFIRMING:
        raise ActionError(_("This action is already approved once; confirm it explicitly."))
    if decision == APPROVE and two_steps is False and approval.status != ApprovalStatus.PENDING:
        raise ActionError(_("This action is not pending."))
    if approval.is_lift and approval.tool_call.request_payload.get("requested_by") == (
        user.get_username()
    ):
        raise ActionError(_("You requested this lift: another approver must decide it."))
    if settings.AERO_TWO_PERSON_RULE and approval.risk_class in ("R2", "R3"):
        if user.pk == session.created_by_id:
            raise ActionError(
                _("Two-person rule: the session's creator cannot approve R2/R3 actions.")
            )
        if decision == CONFIRM and approval.first_approved_by_id == user.pk:
            raise ActionError(_("Two-person rule: a different approver must confirm."))


def _finish(approval: Approval, user: Any, status: str, reason: str, producer: str) -> Approval:
    approval.status = status
    approval.approver = user
    approval.reason = reason
    approval.decided_at = timezone.now()
    approval.save(update_fields=["status", "approver", "reason", "decided_at"])
    # Audited first: executing checks that the decision it runs on was audited.
    _audit_and_notify(f"approval.{status}", approval, user, reason)
    do_apply_decision(
        approval.tool_call_id, user, status, reason, producer=producer, at=approval.decided_at
    )
    return approval


def _audit_and_notify(action: str, approval: Approval, user: Any, reason: str) -> None:
    """Audit who decided what, when, why, on exactly which request (its digest); then
    tell open queue pages to re-read (after commit)."""
    audit(
        action,
        obj=approval,
        actor=user,
        session_id=approval.session_id,
        detail={
            "tool": approval.action_name,
            "args": approval.tool_call.request_payload,
            "risk_class": approval.risk_class,
            "reason": reason,
            "digest": approval.digest,
        },
    )
    notify_queue()


# --- timeouts -------------------------------------------------------------------------


def sweep_expired_approvals(batch: int | None = None) -> int:
    """Turn open approvals past their deadline into `timeout` plus a manual to-do, the
    `batch` (AERO_TIMEOUT_BATCH) longest expired this pass, the rest at the next passes:
    900 approvals created together expire together, and each timeout queues its
    session's job, so one pass for all of them was a burst of hundreds of jobs in a
    second. Never approves. Returns how many it handled."""
    batch = batch or settings.AERO_TIMEOUT_BATCH
    expired = Approval.objects.expired().order_by("deadline", "pk").values_list("pk", flat=True)
    handled = 0
    for approval_id in list(expired[:batch]):
        try:
            if do_timeout(approval_id):
                handled += 1
        except ActionError:
            continue  # decided or ended meanwhile
        except Exception:
            # One approval that cannot be timed out this pass (a lock wait, a bad row) is
            # retried at the next; the others' deadlines do not wait for it.
            logger.exception("approval %s: timeout failed; the next pass retries", approval_id)
    return handled


def do_timeout(approval_id: int) -> bool:
    """Locks the session row, then the approval row."""
    with transaction.atomic():
        approval = Approval.objects.select_related("tool_call").get(pk=approval_id)
        if approval.is_lift:
            lock_lift_sessions(approval.tool_call)  # as do_decide: the same lock order
        session = lock_session(approval.session_id)
        approval = _lock_approval(approval_id)
        if not approval.is_open or not approval.is_past_deadline():
            return False
        _time_out(approval, session)
    return True


def _time_out(approval: Approval, session: Any) -> None:
    """The approval becomes `timeout` plus a manual to-do, with its event and audit entry.
    Never approves. The caller holds the session and approval row locks."""
    approval.status = ApprovalStatus.TIMEOUT
    approval.decided_at = timezone.now()
    approval.save(update_fields=["status", "decided_at"])
    todo: ManualTodo | None = None
    if not approval.is_budget:
        # Continuing past the model budget is nothing people could do by hand: undecided,
        # the agent stops and reports.
        args = ", ".join(f"{k}={v}" for k, v in approval.tool_call.request_payload.items())
        todo = ManualTodo.objects.create(
            approval=approval,
            session_id=session.pk,
            title=f"{approval.action_name} ({args}) was not decided in time: handle it by hand",
        )
        notify_board()  # the to-dos page lists it
    # Logged even when the session has ended (failed, say): nothing changes unseen.
    do_apply_decision(
        approval.tool_call_id,
        None,
        "timeout",
        "no decision before the deadline",
        producer="sweeper",
        extra={"todo": todo.pk, "todo_title": todo.title} if todo else {},
        at=approval.decided_at,
        ended_ok=True,
    )
    assert approval.deadline is not None
    audit(
        APPROVAL_TIMEOUT,
        obj=approval,
        actor_label="sweeper",
        session_id=session.pk,
        detail={
            "tool": approval.action_name,
            "risk_class": approval.risk_class,
            "deadline": approval.deadline.isoformat(),
            "todo": todo.pk if todo else None,
            "digest": approval.digest,
        },
    )
    notify_queue()


def do_resolve_todo(todo_id: int, user: Any, note: str, *, in_force: bool = False) -> ManualTodo:
    """Locks the session row, then the to-do row. `in_force`: the people did what the
    timed-out action would have done ("closed by phone"); for a closure or suspension the
    restriction goes on the airport board, in the same transaction as the event that says
    so. When the same restriction is already in force (another session), the
    board is left as it is and the event names the one in force."""
    note = checked_text(
        note, limit=MAX_NOTE, what="note", required=_("Say what was done (a note is required).")
    )
    with transaction.atomic():
        session_id = ManualTodo.objects.values_list("session_id", flat=True).get(pk=todo_id)
        lock_session(session_id)
        todo = (
            ManualTodo.objects.select_for_update()
            .select_related("approval__tool_call")
            .get(pk=todo_id)
        )
        if todo.resolved_at is not None:
            raise ActionError(_("This to-do was already resolved."))
        todo.resolved_at = timezone.now()
        todo.resolved_by = user
        todo.note = note
        todo.save(update_fields=["resolved_at", "resolved_by", "note"])
        payload: dict[str, Any] = {
            "kind": "todo_resolved",
            "todo": todo.pk,
            "title": todo.title,
            "by": user.get_username(),
            "note": note,
            "in_force": in_force,
        }
        tool_call = todo.approval.tool_call
        effect = restriction_of(tool_call.tool_name, tool_call.request_payload)
        if in_force and effect is not None:
            kind, target = effect
            model = restrictions.model()
            existing = model.objects.filter(
                kind=kind, target=target, lifted_at__isnull=True
            ).first()
            if existing is None:
                model.objects.create(
                    kind=kind, target=target, session_id=todo.session_id, tool_call=tool_call
                )
                payload["restriction"] = {
                    "kind": kind,
                    "target": target,
                    "call_id": tool_call.call_id,
                }
            else:
                payload["already_in_force"] = {
                    "kind": kind,
                    "target": target,
                    "session": str(existing.session_id),
                }
        append_event(todo.session_id, TIMELINE_APPENDED, payload, producer="web")
        audit(
            "todo.resolved",
            obj=todo,
            actor=user,
            session_id=todo.session_id,
            detail={"title": todo.title, "note": note, "in_force": in_force},
        )
        notify_board()  # the to-dos page drops it; a closure done by hand shows on the board
    return todo
