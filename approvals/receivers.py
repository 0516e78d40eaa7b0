from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone

from aero import stamps
from aero.compiled import insert_rows
from approvals.models import Approval, ApprovalStatus, action_digest_of, state_digest_for
from approvals.push import notify_queue
from diagnosis.actions import do_apply_decision
from diagnosis.models import Session, ToolCall
from diagnosis.signals import (
    approval_required,
    approval_withdrawn,
    approvals_required,
    execution_check,
    session_closing,
)
from scenarios_admin.definition import LIFT_TOOL


def new_approval(tool_call: ToolCall, session: Session) -> Approval:
    """The approval of a call awaiting one, not saved yet."""
    state = state_digest_for(tool_call, session)
    return Approval(
        tool_call=tool_call,
        session_id=tool_call.session_id,
        risk_class=tool_call.risk_class,
        action_name=tool_call.tool_name,
        action_digest=action_digest_of(tool_call),
        state_digest=state,
        digest=Approval.digest_for(tool_call, state),
        # A lift request never times out: the closure staying in force is the safe
        # state, and a timeout's manual to-do would invite an unapproved lift.
        deadline=None
        if tool_call.tool_name == LIFT_TOOL
        else Approval.deadline_for(tool_call.risk_class),
    )


@receiver(approval_required)
def create_approval(
    sender: Any, tool_call: ToolCall, fresh: bool = False, **kwargs: Any
) -> dict[str, Any]:
    """Open the approval; what it was opened with goes into the `approval.required`
    event (the sender logs it in the same transaction). `fresh`: the call was inserted
    in the sender's transaction, so it has no approval yet. The state digest is taken
    from `tool_call.session` as the sender set it (the agent passes the session as its
    log will read when its step group commits)."""
    # Not get_or_create: its savepoint guards a concurrent insert, and the caller holds
    # the call (the job's lease, or the session's row lock): a duplicate would fail the
    # caller's transaction on the unique tool_call.
    approval = None if fresh else Approval.objects.filter(tool_call=tool_call).first()
    if approval is None:
        approval = new_approval(tool_call, tool_call.session)
        approval.save(force_insert=True)
        notify_queue()
    return {
        "approval": approval.pk,
        "digest": approval.digest,
        "deadline": approval.deadline.isoformat() if approval.deadline else None,
    }


@receiver(approvals_required)
def create_approvals(
    sender: Any, tool_calls: list[ToolCall], session: Session, **kwargs: Any
) -> dict[int, dict[str, Any]]:
    """Open the approvals of calls inserted together in the sender's transaction (none
    has one yet): one INSERT for all, one queue notice."""
    approvals = insert_rows(Approval, [new_approval(t, session) for t in tool_calls])
    notify_queue()
    return {
        approval.tool_call_id: {
            "approval": approval.pk,
            "digest": approval.digest,
            "deadline": approval.deadline.isoformat() if approval.deadline else None,
        }
        for approval in approvals
    }


@receiver(execution_check)
def check_decision(sender: Any, tool_call: ToolCall, **kwargs: Any) -> list[str]:
    """Defence in depth at execution time: what must be true of the decision behind
    an approved call, whatever its row says."""
    from approvals.policy import decision_problems

    return decision_problems(tool_call)


@receiver(session_closing)
def close_open_approvals(
    sender: Any, session: Session, user: Any, reason: str, **kwargs: Any
) -> dict[str, Any]:
    """A canceled or deleted session's open approvals close with it, each with an
    `approval.canceled` event: nobody can decide them and the sweeper never turns them
    into to-dos. The caller holds the session row lock and audits the closing with the
    ids returned."""
    closed: list[int] = []
    for approval in Approval.objects.select_for_update().filter(session=session).open():
        approval.status = ApprovalStatus.CANCELED
        approval.reason = reason
        approval.decided_at = timezone.now()
        approval.save(update_fields=["status", "reason", "decided_at"])
        do_apply_decision(
            approval.tool_call_id,
            user,
            "canceled",
            reason,
            producer="web",
            at=approval.decided_at,
            ended_ok=True,
        )
        closed.append(approval.pk)
    if closed:
        notify_queue()
    return {"approvals_closed": closed}


@receiver(approval_withdrawn)
def withdraw_approval(
    sender: Any, tool_call: ToolCall, reason: str, at: Any, **kwargs: Any
) -> None:
    """The agent withdrew the action (a corrected fact no longer calls for it): its open
    approval closes, out of the queue, never swept into a to-do. In the agent step's
    transaction, which logs it."""
    closed = (
        Approval.objects.filter(tool_call=tool_call)
        .open()
        .update(status=ApprovalStatus.CANCELED, reason=reason, decided_at=at)
    )
    if closed:
        notify_queue()


# Rows a queue card shows that change without an approval notice: a session saved
# whole, a scenario or a user renamed, a restriction or the world edited (the admin, a
# pack's own code). Each moves the queue pages' stamp after its commit.
_SIGN_IN_ONLY = frozenset({"last_login"})


def _card_models() -> frozenset[Any]:
    from django.contrib.auth import get_user_model

    from aero.packs import restriction_model, stamped_pack
    from scenarios_admin.models import Scenario

    pack = stamped_pack()
    found = {Session, Scenario, get_user_model(), restriction_model()}
    if pack is not None:
        found.add(pack.world_stamp)
    return frozenset(m for m in found if m is not None)


@receiver(post_save, dispatch_uid="approvals-queue-stamp-saved")
@receiver(post_delete, dispatch_uid="approvals-queue-stamp-deleted")
def card_row_changed(sender: Any, update_fields: Any = None, **kwargs: Any) -> None:
    if sender not in card_models():
        return
    if update_fields is not None and frozenset(update_fields) <= _SIGN_IN_ONLY:
        return  # a sign-in: nothing a card shows
    stamps.touch(stamps.QUEUE)


_models: list[frozenset[Any]] = []


def card_models() -> frozenset[Any]:
    # Read at the first save (the packs register at start-up, after this module loads).
    if not _models:
        _models.append(_card_models())
    return _models[0]
