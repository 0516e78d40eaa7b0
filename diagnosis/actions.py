"""State changes of sessions, as do_* functions. Each documents the locks it takes; pushes
go out after commit (append_event), never from model signals."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from aero.models import audit
from aero.text import MAX_LIFT_NOTE, MAX_MESSAGE, MAX_REASON, TextRefused, check_text
from diagnosis.agent.extraction import detect_language
from diagnosis.events import append_event, lock_session, set_status
from diagnosis.jobs import enqueue_advance
from diagnosis.models import Restriction, Session, SessionStatus, ToolCall, ToolCallStatus
from scenarios_admin.models import Scenario


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


def clean_text(text: str) -> str:
    return checked_text(
        text,
        limit=MAX_MESSAGE,
        what="message",
        required="Please describe the incident: the message is empty.",
    )


def do_create_session(
    user: Any, scenario: Scenario, text: str, *, producer: str = "web"
) -> Session:
    """Create a session pinned to the scenario's newest published version and queue it."""
    text = clean_text(text)
    version = scenario.latest_version()
    if version is None or not scenario.is_active:
        raise ActionError(f"Scenario {scenario.slug} has no published version to run.")
    with transaction.atomic():
        session = Session.objects.create(
            scenario=scenario,
            scenario_version=version,
            title=text[:120],
            language=detect_language(text),
            created_by=user,
        )
        append_event(
            session.pk,
            "session.created",
            {
                "scenario": scenario.slug,
                "version": version.number,
                "created_by": user.get_username(),
            },
            producer=producer,
        )
        append_event(
            session.pk,
            "user.message",
            {"text": text, "author": user.get_username()},
            producer=producer,
        )
        audit(
            "session.created",
            obj=session,
            actor=user,
            session_id=session.pk,
            detail={"scenario": scenario.slug, "version": version.number},
        )
        enqueue_advance(session.pk)
    return session


def do_answer(session_id: Any, user: Any, text: str, *, producer: str = "web") -> None:
    """Record the operator's answer to the agent's question and queue a resume.
    Locks the session row. Only an open question can be answered: a chat message never
    decides an approval."""
    text = clean_text(text)
    with transaction.atomic():
        session = lock_session(session_id)
        if session.is_ended:
            raise ActionError(f"This session is {session.get_status_display().lower()}.")
        if not session.snapshot.get("question"):
            raise ActionError("The agent has not asked anything; there is nothing to answer.")
        append_event(
            session.pk,
            "user.message",
            {
                "text": text,
                "author": user.get_username(),
                "answers": session.snapshot["question"].get("key"),
            },
            producer=producer,
            # Answered: the page stops asking at once and a second answer is refused,
            # instead of both waiting for the job to pick the first one up.
            snapshot={"question": None},
        )
        set_status(session.pk, SessionStatus.QUEUED, producer=producer, strict=False)
        enqueue_advance(session.pk)


def do_cancel(session_id: Any, user: Any, reason: str = "") -> None:
    reason = checked_text(reason, limit=MAX_REASON, what="reason")
    with transaction.atomic():
        session = lock_session(session_id)
        if session.is_ended:
            raise ActionError(f"This session is already {session.get_status_display().lower()}.")
        set_status(
            session.pk,
            SessionStatus.CANCELED,
            producer="web",
            reason=reason or f"canceled by {user.get_username()}",
        )
        audit(
            "session.canceled",
            obj=session,
            actor=user,
            session_id=session.pk,
            detail={"reason": reason},
        )


def do_retry(session_id: Any, user: Any) -> None:
    """Re-queue a failed session: the agent resumes from its last checkpoint."""
    with transaction.atomic():
        session = lock_session(session_id)
        if session.status != SessionStatus.FAILED:
            raise ActionError("Only a failed session can be retried.")
        set_status(
            session.pk,
            SessionStatus.QUEUED,
            producer="web",
            reason=f"retry requested by {user.get_username()}",
        )
        audit("session.retried", obj=session, actor=user, session_id=session.pk)
        enqueue_advance(session.pk)


OUTCOMES = {
    "approved": ToolCallStatus.APPROVED,
    "rejected": ToolCallStatus.REJECTED,
    "timeout": ToolCallStatus.TIMEOUT,
}


def do_apply_decision(
    tool_call_id: int,
    user: Any,
    outcome: str,
    reason: str,
    *,
    producer: str = "web",
    extra: dict[str, Any] | None = None,
) -> ToolCall:
    """Record the final outcome of an awaiting tool call (approved, rejected, or timed out
    into a manual to-do) and queue a resume. Locks the session row, then the tool call.
    The approvals app calls this once its policy is met; nothing else decides."""
    with transaction.atomic():
        tool_call = ToolCall.objects.get(pk=tool_call_id)
        session = lock_session(tool_call.session_id)
        tool_call = ToolCall.objects.select_for_update().get(pk=tool_call_id)
        if tool_call.status != ToolCallStatus.AWAITING_APPROVAL:
            raise ActionError("This action has already been decided.")
        if session.is_ended:
            raise ActionError(f"This session is {session.get_status_display().lower()}.")
        tool_call.status = OUTCOMES[outcome]
        tool_call.decided_by = user
        tool_call.decided_at = timezone.now()
        tool_call.decision_reason = reason
        tool_call.save(update_fields=["status", "decided_by", "decided_at", "decision_reason"])
        append_event(
            session.pk,
            f"approval.{outcome}",
            {
                "tool_call": tool_call.pk,
                "tool_name": tool_call.tool_name,
                "args": tool_call.request_payload,
                "risk_level": tool_call.risk_class,
                "by": user.get_username() if user else "system",
                "reason": reason,
                **(extra or {}),
            },
            producer=producer,
        )
        if session.status == SessionStatus.WAITING_USER:
            set_status(session.pk, SessionStatus.QUEUED, producer=producer)
        enqueue_advance(session.pk)
    return tool_call


def do_lift_restriction(restriction_id: int, user: Any, note: str) -> Restriction:
    """Lift a closure or suspension. Locks the restriction row."""
    note = checked_text(
        note,
        limit=MAX_LIFT_NOTE,
        what="note",
        required="Say why the restriction is lifted (a note is required).",
    )
    with transaction.atomic():
        restriction = Restriction.objects.select_for_update().get(pk=restriction_id)
        if restriction.lifted_at is not None:
            raise ActionError(f"{restriction} was already lifted.")
        restriction.lifted_at = timezone.now()
        restriction.lifted_by = user
        restriction.lift_note = note
        restriction.save(update_fields=["lifted_at", "lifted_by", "lift_note"])
        append_event(
            restriction.session_id,
            "timeline.appended",
            {
                "kind": "restriction_lifted",
                "restriction": restriction.kind,
                "target": restriction.target,
                "by": user.get_username(),
                "note": note,
            },
            producer="web",
        )
        audit(
            "restriction.lifted",
            obj=restriction,
            actor=user,
            session_id=restriction.session_id,
            detail={"kind": restriction.kind, "target": restriction.target, "note": note},
        )
    return restriction
