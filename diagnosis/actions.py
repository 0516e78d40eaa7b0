"""State changes of sessions, as do_* functions. Each documents the locks it takes; pushes
go out after commit (append_event), never from model signals."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from aero.models import audit
from aero.packs import Reading, pack_for
from aero.text import MAX_MESSAGE, MAX_REASON
from diagnosis import suggest
from diagnosis.agent.reading import detect_language
from diagnosis.decisions import ActionError, checked_text, record_decision
from diagnosis.eventlog.names import (
    AGENT_NOTE,
    SESSION_CANCELED,
    SESSION_CREATED,
    SESSION_DELETED,
    TIMELINE_APPENDED,
    USER_MESSAGE,
)
from diagnosis.events import append_event, event_batch, lock_session, set_status
from diagnosis.jobs import enqueue_advance, request_opening_extraction
from diagnosis.jobs.world import world_of
from diagnosis.lifts import apply_lift_decision
from diagnosis.models import (
    Event,
    Session,
    SessionStatus,
    ToolCall,
    ToolCallStatus,
)
from diagnosis.outbox import enqueue_effect
from diagnosis.reporting import display_value, write_report
from diagnosis.signals import session_closing
from scenarios_admin.definition import LIFT_TOOL, decision_only
from scenarios_admin.models import Scenario

logger = logging.getLogger("diagnosis.actions")


def clean_text(text: str) -> str:
    return checked_text(
        text,
        limit=MAX_MESSAGE,
        what="message",
        required=_("Please describe the incident: the message is empty."),
    )


def do_create_session(
    user: Any,
    scenario: Scenario,
    text: str,
    *,
    producer: str = "web",
    title: str = "",
    attach: Callable[[Session], None] | None = None,
) -> Session:
    """Create a session pinned to the scenario's newest published version and queue it.
    `attach`: what the scenario's pack keeps with a new session (a diagnosis's bundle),
    called in the transaction that creates it, before its first job is queued."""
    text = clean_text(text)
    version = scenario.latest_version()
    if version is None or not scenario.is_active:
        raise ActionError(
            _("Scenario %(slug)s has no published version to run.") % {"slug": scenario.slug}
        )
    with transaction.atomic():
        session = Session.objects.create(
            scenario=scenario,
            scenario_version=version,
            title=(title or text)[:120],
            language=detect_language(text),
            created_by=user,
        )
        # The first events in one write: one lock, one insert, one notice.
        with event_batch(session.pk, locked=session):
            append_event(
                session.pk,
                SESSION_CREATED,
                {
                    "scenario": scenario.slug,
                    "version": version.number,
                    "created_by": user.get_username(),
                    "title": session.title,
                    "language": session.language,
                },
                producer=producer,
            )
            message = append_event(
                session.pk,
                USER_MESSAGE,
                {"text": text, "author": user.get_username()},
                producer=producer,
            )
            if pack_for(version.definition["kind"]).opens_from_message:
                note_scenario_mismatch(session, scenario, text, producer)
        if attach is not None:
            attach(session)
        # A model reads the opening message first: its request is recorded now and the
        # runner enqueues the first job with the reply. Inline (the CLI,
        # tests), the job is also the runner: it runs now and makes the call.
        requested = request_opening_extraction(session, message)
        if not requested or settings.AERO_JOB_BACKEND == "inline":
            enqueue_advance(session.pk)
        # Last: the audit trail's chain lock is held from here to the commit, and every
        # creation, decision and admin change waits for it. Written first, it would be
        # held while the request is built, and sessions opened at once would be created
        # one after the other.
        audit(
            SESSION_CREATED,
            obj=session,
            actor=user,
            session_id=session.pk,
            detail={"scenario": scenario.slug, "version": version.number},
        )
    return session


def do_answer(session_id: Any, user: Any, text: str, *, producer: str = "web") -> None:
    """Record the operator's answer to the agent's question and queue a resume.
    Locks the session row. Only an open question can be answered: a chat message never
    decides an approval."""
    text = clean_text(text)
    with transaction.atomic():
        session = lock_session(session_id)
        if session.is_ended:
            raise ActionError(
                _("This session is %(status)s.") % {"status": session.get_status_display().lower()}
            )
        if not session.snapshot.get("question"):
            raise ActionError(_("The agent has not asked anything; there is nothing to answer."))
        append_event(
            session.pk,
            USER_MESSAGE,
            {
                "text": text,
                "author": user.get_username(),
                "answers": session.snapshot["question"].get("key"),
            },
            # Answered ("answers" closes the question in the snapshot): the page stops
            # asking at once and a second answer is refused, instead of both waiting for
            # the job to pick the first one up.
            producer=producer,
        )
        set_status(session.pk, SessionStatus.QUEUED, producer=producer, strict=False)
        enqueue_advance(session.pk)


def do_cancel(session_id: Any, user: Any, reason: str = "", *, producer: str = "web") -> None:
    """Cancel a session: its status, its open approvals (closed with events, out of the
    queue, never swept into to-dos) and a report of what was done, in one transaction.
    Locks the session row, then the approval rows."""
    reason = checked_text(reason, limit=MAX_REASON, what="reason")
    with transaction.atomic():
        session = lock_session(session_id)
        if session.is_ended:
            raise ActionError(
                _("This session is already %(status)s.")
                % {"status": session.get_status_display().lower()}
            )
        why = reason or f"canceled by {user.get_username()}"
        by = user.get_username()
        set_status(session.pk, SessionStatus.CANCELED, producer=producer, reason=why, by=by)
        closed = closed_by_receivers(session, user, why)
        session.refresh_from_db(fields=["snapshot"])
        write_report(
            session.pk,
            session.scenario_version.definition,
            session.snapshot,
            producer=producer,
            notes=[{"kind": "canceled", "by": by, "reason": reason}],
        )
        audit(
            SESSION_CANCELED,
            obj=session,
            actor=user,
            session_id=session.pk,
            detail={"reason": reason, "approvals_closed": closed},
        )


def do_close(session_id: Any, user: Any, summary: str) -> None:
    """Close a session with the operator's summary: a normal end (completed, not
    canceled), the summary in `session.completed` (`closed_by`, `summary`), noted at the
    top of the report and its conclusion (the last section); open approvals close as a
    cancel closes them. Locks the session row, then the approval rows."""
    summary = checked_text(
        summary,
        limit=MAX_REASON,
        what="summary",
        required=_("Please write a summary: it goes into the log and the report."),
    )
    with transaction.atomic():
        session = lock_session(session_id)
        if session.is_ended:
            raise ActionError(
                _("This session is already %(status)s.")
                % {"status": session.get_status_display().lower()}
            )
        by = user.get_username()
        set_status(
            session.pk,
            SessionStatus.COMPLETED,
            producer="web",
            reason=summary,
            by=by,
            ended={"closed_by": by, "summary": summary},
        )
        closed = closed_by_receivers(session, user, summary)
        session.refresh_from_db(fields=["snapshot"])
        # The operator's summary heads the report and is its conclusion (its last section).
        write_report(
            session.pk,
            session.scenario_version.definition,
            session.snapshot,
            producer="web",
            notes=[{"kind": "closed", "by": by, "summary": summary}],
        )
        audit(
            "session.closed",
            obj=session,
            actor=user,
            session_id=session.pk,
            detail={"summary": summary, "approvals_closed": closed},
        )


def do_add_update(session_id: Any, user: Any, text: str, *, producer: str = "web") -> None:
    """A free-text update from the operator ("fire brigade on site"): in the log and on
    the timeline, never read as an answer. Locks the session row."""
    text = checked_text(
        text, limit=MAX_MESSAGE, what="update", required="Please type the update: it is empty."
    )
    with transaction.atomic():
        session = lock_session(session_id)
        if session.is_ended:
            raise ActionError(f"This session is {session.get_status_display().lower()}.")
        append_event(
            session.pk,
            TIMELINE_APPENDED,
            {"kind": "operator_update", "text": text, "by": user.get_username()},
            producer=producer,
        )


def corrected_value(spec: dict[str, Any], raw: str, reading: Reading | None, world: Any) -> Any:
    """The operator's corrected value in the form the agent stores; ActionError when the
    field cannot take it. A type of the pack's own is read by the pack (`reading`)."""
    raw = raw.strip()
    kind = spec["type"]
    if not raw:
        raise ActionError("Give the corrected value: it is empty.")
    if kind == "enum":
        if raw not in (spec.get("values") or {}):
            raise ActionError(f"{raw} is not one of this field's values.")
        return raw
    if kind == "bool":
        if raw not in ("true", "false"):
            raise ActionError("Choose yes or no.")
        return raw == "true"
    if kind == "number":
        try:
            return float(raw)
        except ValueError:
            raise ActionError(f"{raw} is not a number.") from None
    if kind != "text" and reading is not None and reading.corrected is not None:
        return reading.corrected(spec, raw, world)
    return raw[:MAX_MESSAGE]


def do_correct_fact(
    session_id: Any, user: Any, field: str, raw: str, *, producer: str = "web"
) -> None:
    """The operator corrects an extracted fact whenever the agent waits for people:
    a message carrying the correction, which the agent's input parser
    applies as said (evidence: corrected by the operator); in the log like an answer. With
    a question open it answers it; while approvals wait, the agent re-runs the rules, the
    impact and the proposals on the corrected facts. Locks the session row."""
    with transaction.atomic():
        session = lock_session(session_id)
        if session.is_ended:
            raise ActionError(
                _("This session is %(status)s.") % {"status": session.get_status_display().lower()}
            )
        if session.status != SessionStatus.WAITING_USER:
            raise ActionError(
                _("The agent is working on this session; correct the fact once it waits.")
            )
        question = session.snapshot.get("question") or {}
        definition = session.scenario_version.definition
        spec = definition["fields"].get(field)
        if spec is None:
            raise ActionError(f"This scenario has no field {field}.")
        pack = pack_for(definition["kind"])
        value = corrected_value(spec, raw, pack.reading, world_of(definition["kind"]))
        label = spec["label"].get(session.language, field)
        shown = display_value(spec, value, session.language)
        append_event(
            session.pk,
            USER_MESSAGE,
            {
                "text": f"{label}: {shown}",
                "author": user.get_username(),
                # With a question open the correction answers it; else it stands alone.
                **({"answers": question["key"]} if question.get("key") else {}),
                "correction": {"field": field, "value": value},
            },
            producer=producer,
        )
        set_status(session.pk, SessionStatus.QUEUED, producer=producer, strict=False)
        enqueue_advance(session.pk)


MISMATCH_NOTE = {
    "zh": "这条消息更像“{name}”（提到：{words}），而不是“{chosen}”。可以切换场景，原文会带过去。",
    "en": "This message reads more like {name} (it mentions {words}) than {chosen}. You can "
    "switch scenario; the text is carried over.",
}


def note_scenario_mismatch(session: Session, scenario: Scenario, text: str, producer: str) -> None:
    """The agent says so when the message fits another scenario better (synonym score),
    once, in the creating transaction; the session page then offers the switch."""
    fit = suggest.better_fit(scenario, text)
    if fit is None:
        return
    lang = session.language if session.language in MISMATCH_NOTE else "en"
    name = fit.scenario.name_zh if lang == "zh" else fit.scenario.name_en
    chosen = scenario.name_zh if lang == "zh" else scenario.name_en
    words = ("、" if lang == "zh" else ", ").join(fit.words)
    append_event(
        session.pk,
        AGENT_NOTE,
        {
            "kind": "scenario_mismatch",
            "suggested": {
                "slug": fit.scenario.slug,
                "name_zh": fit.scenario.name_zh,
                "name_en": fit.scenario.name_en,
                "score": fit.score,
                "words": fit.words,
            },
            "text": MISMATCH_NOTE[lang].format(name=name, words=words, chosen=chosen),
        },
        producer=producer,
    )


def first_message(session: Session) -> str:
    event = Event.objects.filter(session=session, type=USER_MESSAGE).order_by("seq").first()
    return str(event.payload.get("text", "")) if event else ""


def do_switch_scenario(session_id: Any, user: Any, scenario: Scenario) -> Session:
    """Reopen the incident under another scenario: a new session with the same
    first message, and the old one canceled with a reason naming the new one; each log
    says where the other went. One transaction; locks the old session row first."""
    with transaction.atomic():
        old = lock_session(session_id)
        if old.is_ended:
            raise ActionError(f"This session is already {old.get_status_display().lower()}.")
        if scenario.pk == old.scenario_id:
            raise ActionError("The session already runs this scenario.")
        text = first_message(old)
        new = do_create_session(user, scenario, text)
        append_event(
            new.pk,
            TIMELINE_APPENDED,
            {
                "kind": "scenario_switched_from",
                "session": str(old.pk),
                "scenario": old.scenario.slug,
                "by": user.get_username(),
            },
            producer="web",
        )
        reason = f"switched to scenario {scenario.slug}: continued in session {new.pk}"
        append_event(
            old.pk,
            TIMELINE_APPENDED,
            {
                "kind": "scenario_switched_to",
                "session": str(new.pk),
                "scenario": scenario.slug,
                "by": user.get_username(),
            },
            producer="web",
        )
        do_cancel(old.pk, user, reason)
    return new


def closed_by_receivers(session: Session, user: Any, reason: str) -> list[int]:
    """Send session_closing (the approvals app closes the open approvals, with events);
    returns the ids of the approvals closed, for the audit entry."""
    closed: list[int] = []
    for _receiver, response in session_closing.send(
        sender=Session, session=session, user=user, reason=reason
    ):
        if isinstance(response, dict):
            closed.extend(response.get("approvals_closed", []))
    return closed


def do_delete_session(session_id: Any, user: Any, reason: str) -> Session:
    """Soft-delete a session (admins): it leaves every list, keeps its events and audit
    entries and stays replayable. A session still running is canceled first (its open
    approvals close with events, a report is written). Locks the session row."""
    reason = checked_text(
        reason,
        limit=MAX_REASON,
        what="reason",
        required=_("Say why the session is deleted (a reason is required)."),
    )
    with transaction.atomic():
        session = lock_session(session_id)
        if session.is_deleted:
            raise ActionError(_("This session was already deleted."))
        if not session.is_ended:
            do_cancel(session.pk, user, f"deleted: {reason}")
        # A failed session may still hold open approvals: close them too.
        closed = closed_by_receivers(session, user, f"deleted: {reason}")
        at = timezone.now()
        Session.objects.filter(pk=session.pk).update(deleted_at=at, deleted_by=user)
        append_event(
            session.pk,
            SESSION_DELETED,
            {"by": user.get_username(), "at": at.isoformat(), "reason": reason},
            producer="web",
        )
        audit(
            SESSION_DELETED,
            obj=session,
            actor=user,
            session_id=session.pk,
            detail={"reason": reason, "status": session.status, "approvals_closed": closed},
        )
        forget = pack_for(session.scenario_version.definition["kind"]).on_deleted
        if forget is not None:
            # What the pack keeps outside the log (a diagnosis's bundle) goes with the
            # delete, once it has committed.
            transaction.on_commit(lambda: forget(session.pk))
    session.refresh_from_db()
    return session


def do_retry(session_id: Any, user: Any, *, producer: str = "web") -> None:
    """Re-queue a failed session: the agent resumes from its last checkpoint."""
    with transaction.atomic():
        session = lock_session(session_id)
        if session.is_deleted:
            raise ActionError(_("This session was deleted."))
        if session.status != SessionStatus.FAILED:
            raise ActionError(_("Only a failed session can be retried."))
        set_status(
            session.pk,
            SessionStatus.QUEUED,
            producer=producer,
            reason=f"retry requested by {user.get_username()}",
        )
        audit("session.retried", obj=session, actor=user, session_id=session.pk)
        enqueue_advance(session.pk)


def do_apply_decision(
    tool_call_id: int,
    user: Any,
    outcome: str,
    reason: str,
    *,
    producer: str = "web",
    extra: dict[str, Any] | None = None,
    at: datetime | None = None,
    ended_ok: bool = False,
) -> ToolCall:
    """Record the final outcome of an awaiting tool call (approved, rejected, timed out
    into a manual to-do, or canceled with its session) and queue a resume. Locks the
    session row, then the tool call. The approvals app calls this once its policy is met;
    nothing else decides. `at` is the decision time the Approval row also stores (one
    time for both). `ended_ok` lets a timeout or a cancel close the call of a session that
    has ended (it is logged; nothing is resumed)."""
    at = at or timezone.now()
    with transaction.atomic():
        tool_call = ToolCall.objects.get(pk=tool_call_id)
        session = lock_session(tool_call.session_id)
        tool_call = ToolCall.objects.select_for_update().get(pk=tool_call_id)
        if tool_call.status != ToolCallStatus.AWAITING_APPROVAL:
            raise ActionError(_("This action has already been decided."))
        if tool_call.tool_name == LIFT_TOOL:
            # Not the agent's: nothing to resume, and the session may have ended.
            return apply_lift_decision(tool_call, user, outcome, reason, producer, at)
        if session.is_ended and not ended_ok:
            raise ActionError(
                _("This session is %(status)s.") % {"status": session.get_status_display().lower()}
            )
        # The decision's events (and the outbox's) are written together, in one go.
        with event_batch(session.pk):
            record_decision(tool_call, user, outcome, reason, producer, at, extra)
            if session.is_ended:
                return tool_call
            if outcome == "approved" and not decision_only(
                tool_call.tool_name, tool_call.is_action
            ):
                # The effect's outbox row commits with the decision; the
                # session's job executes it after the commit. (Continuing past the
                # budget or running a skill has no effect outside AERO: the agent
                # reads the decision.)
                enqueue_effect(tool_call, producer=producer, fresh=True)
            if session.status == SessionStatus.WAITING_USER:
                set_status(session.pk, SessionStatus.QUEUED, producer=producer)
        enqueue_advance(session.pk)
    return tool_call
