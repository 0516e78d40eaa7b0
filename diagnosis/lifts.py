"""Lifting a closure or suspension: an R2 action of its own, decided through the same
approvals, sent to the system that put the restriction in force through the outbox (its
own job, or the embedded worker), and recorded once."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from aero.models import audit
from aero.packs import restricting_action
from aero.text import MAX_LIFT_NOTE
from diagnosis import external, restrictions
from diagnosis import outbox as outbox_module
from diagnosis.decisions import ActionError, checked_text, record_decision
from diagnosis.eventlog.names import TIMELINE_APPENDED
from diagnosis.events import append_event, lock_session
from diagnosis.execution import (
    execution_problems,
    open_approval,
    record_call_finished,
    refuse_execution,
)
from diagnosis.jobs import drop_job, embedded_worker
from diagnosis.models import (
    Outbox,
    OutboxStatus,
    Session,
    ToolCall,
    ToolCallStatus,
)
from diagnosis.outbox import enqueue_effect
from diagnosis.push import notify_board
from scenarios_admin.definition import LIFT_TOOL, risk_floor

logger = logging.getLogger("diagnosis.actions")


def lift_calls(restriction: Any) -> Any:
    return ToolCall.objects.filter(
        session_id=restriction.session_id,
        tool_name=LIFT_TOOL,
        request_payload__restriction=restriction.pk,
    )


def do_request_lift(restriction_id: int, user: Any, note: str) -> ToolCall:
    """Ask for a closure or suspension to be lifted. Lifting is an action like closing:
    R2 (its floor), in the approval queue, bound to a digest, decided by an approver who
    is not the requester, audited. Locks the restriction's session row, then the
    restriction row; one open request per restriction."""
    note = checked_text(
        note,
        limit=MAX_LIFT_NOTE,
        what="note",
        required=_("Say why the restriction is lifted (a note is required)."),
    )
    with transaction.atomic():
        model = restrictions.model()
        restriction = model.objects.get(pk=restriction_id)
        lock_session(restriction.session_id)
        restriction = model.objects.select_for_update().get(pk=restriction_id)
        if restriction.lifted_at is not None:
            raise ActionError(
                _("%(restriction)s was already lifted.") % {"restriction": restriction}
            )
        earlier = lift_calls(restriction)
        if earlier.filter(status=ToolCallStatus.AWAITING_APPROVAL).exists():
            raise ActionError(
                _("A lift of %(restriction)s already waits for an approver.")
                % {"restriction": restriction}
            )
        call_id = f"lift:{restriction.pk}:{earlier.count() + 1}"
        tool_call = ToolCall.objects.create(
            session_id=restriction.session_id,
            call_id=call_id,
            idempotency_key=f"{restriction.session_id}:{call_id}",
            tool_name=LIFT_TOOL,
            risk_class=risk_floor(LIFT_TOOL),
            # Not one of the agent's planned actions: the agent neither waits for it
            # nor reports it; the queue and the timeline show it.
            is_action=False,
            request_payload={
                "restriction": restriction.pk,
                "kind": restriction.kind,
                "target": restriction.target,
                "note": note,
                "requested_by": user.get_username(),
            },
            status=ToolCallStatus.AWAITING_APPROVAL,
        )
        open_approval(tool_call, producer="web")
        notify_board()  # the board shows the lift as waiting for an approver
        audit(
            "restriction.lift_requested",
            obj=restriction,
            actor=user,
            session_id=restriction.session_id,
            detail={
                "kind": restriction.kind,
                "target": restriction.target,
                "note": note,
                "tool_call": tool_call.pk,
            },
        )
    return tool_call


def touched_sessions(restriction: Any) -> list[Any]:
    """The sessions whose live map showed the restriction: every session not ended
    before it was put in force (they list the airport's restrictions in force), and the
    session that put it in force. Ordered by id, the order their rows are locked in."""
    ids = set(
        Session.objects.filter(
            Q(ended_at__isnull=True) | Q(ended_at__gte=restriction.created_at)
        ).values_list("pk", flat=True)
    )
    ids.add(restriction.session_id)
    return sorted(ids, key=str)


def lock_lift_sessions(tool_call: ToolCall) -> None:
    """Lock, in id order, every session a lift will write to, before anything else of the
    decision: its audit entry takes the audit chain's lock, and every other path takes
    session rows before that lock, never after (no deadlock)."""
    restriction = restrictions.model().objects.get(pk=tool_call.request_payload["restriction"])
    for session_id in touched_sessions(restriction):
        lock_session(session_id)


def apply_lift_decision(
    tool_call: ToolCall, user: Any, outcome: str, reason: str, producer: str, at: datetime
) -> ToolCall:
    """The decided lift: recorded in the requesting session; approved, it lifts the
    restriction (after the policy check at execution time) with an event in every
    session that showed it. The caller holds the session and call row locks."""
    record_decision(tool_call, user, outcome, reason, producer, at)
    if outcome != "approved":
        return tool_call
    problems = execution_problems(tool_call)
    if problems:
        refuse_execution(tool_call, problems, producer=producer)
        return tool_call
    restriction = (
        restrictions.model()
        .objects.select_for_update()
        .get(pk=tool_call.request_payload["restriction"])
    )
    if restriction.lifted_at is not None:
        raise ActionError(_("%(restriction)s was already lifted.") % {"restriction": restriction})
    # Lifting reaches the airport operations system like closing does: through the
    # outbox. The row commits with the decision; a background job sends the
    # request after the commit with the call's idempotency key (never in the
    # deciding request, whose approver would wait out the retries), and the lift is
    # recorded when it is accepted. A crash in between leaves the row pending for the
    # sweeper, never a lift recorded twice nor one done remotely and lost here.
    outbox = enqueue_effect(tool_call, producer=producer, fresh=True)
    if outbox is not None:
        outbox_id = outbox.pk
        transaction.on_commit(lambda: dispatch_lift(outbox_id, producer=producer))
        notify_board()  # the board shows the lift as being sent
    return tool_call


def lift_job_id(outbox_id: int) -> str:
    """A lift's job has this fixed id: a second enqueue of the same row finds the first."""
    return f"aero-lift-{outbox_id}"


def dispatch_lift(outbox_id: int, *, producer: str = "web") -> None:
    """Hand a decided lift to the background (after the decision's commit): an rq job,
    or a thread of the embedded worker; the inline backend (the CLI, tests) sends it
    here. A queue that cannot take it (Redis down) is logged, not raised: the decision
    committed, and the sweeper (resume_pending_lifts) sends rows left pending."""
    backend = settings.AERO_JOB_BACKEND
    if backend == "inline":
        execute_lift(outbox_id, producer=producer)
        return
    try:
        if backend == "rq":
            _enqueue_lift(outbox_id, producer)
        else:
            embedded_worker().pool.submit(_execute_lift_in_thread, outbox_id, producer)
    except Exception as exc:
        logger.warning(
            "lift outbox %s: not handed to a worker (%s: %s); the sweeper will send it",
            outbox_id,
            type(exc).__name__,
            exc,
        )


def _enqueue_lift(outbox_id: int, producer: str) -> None:
    """The lift's rq job under its fixed id. A job already waiting or running sends the
    row; an old one that ended (finished, failed: a row decided again never is, but a
    Redis that outlived a restored database may hold one) is replaced, as the executor
    checks the row's status anyway."""
    import django_rq
    from rq.exceptions import DuplicateJobError, NoSuchJobError
    from rq.job import Job

    # The priority queue: an approver waits for the board to change; a lift is short.
    queue = django_rq.get_queue(settings.AERO_PRIORITY_QUEUE)
    for _attempt in range(3):
        try:
            queue.enqueue(
                execute_lift,
                outbox_id,
                producer=producer,
                job_id=lift_job_id(outbox_id),
                unique=True,
                job_timeout=600,
                result_ttl=300,
                failure_ttl=86400,
            )
            return
        except DuplicateJobError:
            pass
        try:
            job = Job.fetch(lift_job_id(outbox_id), connection=queue.connection)
        except NoSuchJobError:
            continue
        if job.get_status() in ("queued", "deferred", "scheduled", "started"):
            return  # it sends the row
        drop_job(job)


def _execute_lift_in_thread(outbox_id: int, producer: str) -> None:
    try:
        execute_lift(outbox_id, producer=producer)
    except Exception:
        logger.exception("lift outbox %s: sending failed; the sweeper will retry", outbox_id)
    finally:
        connections.close_all()  # this pool thread's own


def execute_lift(outbox_id: int, *, producer: str = "web") -> str:
    """Send a decided lift to the system that put the restriction in force (outside any
    transaction), retrying a transient failure with the same key (AERO_TOOL_RETRIES, linear
    AERO_TOOL_BACKOFF), and record the result once. Returns the row's final status."""
    outbox = Outbox.objects.select_related("tool_call").get(pk=outbox_id)
    if outbox.status != OutboxStatus.PENDING:
        return outbox.status
    tool_call = outbox.tool_call
    args = tool_call.request_payload
    restriction = restrictions.model().objects.get(pk=args["restriction"])
    body = {"restriction": restriction.kind, "target": restriction.target, "note": args["note"]}
    # The system of the action that put it in force lifts it.
    restricting = restricting_action(restriction.kind)
    if restricting is None:
        return _record_lift(
            outbox_id, producer, error=f"no installed action lifts {restriction.kind}"
        )
    system = restricting.system
    attempt = 1
    while True:
        try:
            remote = external.request(system, LIFT_TOOL, outbox.idempotency_key, body)
            break
        except Exception as exc:  # unreachable, 5xx, timeout: the same key may be re-sent
            error = str(exc) or type(exc).__name__
            if attempt > settings.AERO_TOOL_RETRIES:
                return _record_lift(
                    outbox_id, producer, error=f"gave up after {attempt} attempts: {error}"
                )
            delay = settings.AERO_TOOL_BACKOFF * attempt
            with transaction.atomic():
                lock_session(tool_call.session_id)  # before the row: docs/lock-order.md
                row = Outbox.objects.select_for_update().get(pk=outbox_id)
                if row.status != OutboxStatus.PENDING:
                    return row.status
                outbox_module.record_retry(row, tool_call, attempt, error, delay, producer=producer)
            outbox_module.sleep(delay)
            attempt += 1
    return _record_lift(outbox_id, producer, remote=remote)


def _record_lift(
    outbox_id: int, producer: str, *, remote: dict[str, Any] | None = None, error: str = ""
) -> str:
    """The lift's outcome, once: claimed by a conditional UPDATE of the pending row under
    every touched session's lock (the order do_decide takes them in)."""
    with transaction.atomic():
        tool_call = ToolCall.objects.get(outbox__pk=outbox_id)
        lock_lift_sessions(tool_call)
        at = timezone.now()
        claimed = Outbox.objects.filter(pk=outbox_id, status=OutboxStatus.PENDING).update(
            status=OutboxStatus.FAILED if error else OutboxStatus.DONE,
            last_error=error,
            completed_at=at,
        )
        if not claimed:
            return str(Outbox.objects.values_list("status", flat=True).get(pk=outbox_id))
        tool_call = ToolCall.objects.select_for_update().get(pk=tool_call.pk)
        if error:
            _finish_lift_call(tool_call, at, {}, error, producer)
            notify_board()  # no longer being sent: the closure stays, a lift may be asked again
            return OutboxStatus.FAILED
        _complete_lift(tool_call, at, (remote or {}).get("reference", ""), producer)
    return OutboxStatus.DONE


def resume_pending_lifts(older_than: float = 30.0) -> int:
    """The sweeper's part (every worker's maintenance pass and the web ticker): lifts
    whose request may not have gone out (a crash after the decision's commit) are sent
    again with their key; the operations system answers a repeat without a second
    effect."""
    cutoff = timezone.now() - timedelta(seconds=older_than)
    pending = Outbox.objects.filter(
        status=OutboxStatus.PENDING, tool_call__tool_name=LIFT_TOOL, created_at__lt=cutoff
    ).values_list("pk", flat=True)
    ids = list(pending[:100])
    for outbox_id in ids:
        try:
            execute_lift(outbox_id, producer="sweeper")
        except Exception:
            # Retried at the next pass; the other lifts are not held up by this one.
            logger.exception("lift outbox %s: resuming failed; the next pass retries", outbox_id)
    return len(ids)


def _finish_lift_call(
    tool_call: ToolCall, at: datetime, response: dict[str, Any], error: str, producer: str
) -> None:
    tool_call.status = ToolCallStatus.FAILED if error else ToolCallStatus.COMPLETED
    tool_call.completed_at = at
    tool_call.response_payload = response
    tool_call.error = error
    # From the decision to the operations system's answer (retries included).
    tool_call.duration_ms = int((at - (tool_call.decided_at or at)).total_seconds() * 1000)
    tool_call.save(
        update_fields=["status", "completed_at", "response_payload", "error", "duration_ms"]
    )
    record_call_finished(tool_call, response=response, error=error, producer=producer)


def _complete_lift(tool_call: ToolCall, at: datetime, reference: str, producer: str) -> None:
    """The operations system lifted it: our board follows, with an event in every
    session that showed the restriction and an audit entry for the decider."""
    restriction = (
        restrictions.model()
        .objects.select_for_update()
        .get(pk=tool_call.request_payload["restriction"])
    )
    user = tool_call.decided_by
    note = tool_call.request_payload["note"]
    if restriction.lifted_at is None:  # lifted by hand meanwhile: the remote lift stands
        restriction.lifted_at = at
        restriction.lifted_by = user
        restriction.lift_note = note
        restriction.save(update_fields=["lifted_at", "lifted_by", "lift_note"])
        notify_board()
    # The log's own texts stay in one language whoever acted (the kind's label is
    # translated for display); the timeline words them per viewer.
    with translation.override("en"):
        summary = f"{restriction} lifted"
    _finish_lift_call(tool_call, at, {"summary": summary, "reference": reference}, "", producer)
    payload = {
        "kind": "restriction_lifted",
        "restriction": restriction.kind,
        "target": restriction.target,
        "by": user.get_username() if user else "",
        "requested_by": tool_call.request_payload["requested_by"],
        "note": note,
        "origin_session": str(tool_call.session_id),
        "tool_call": tool_call.pk,
    }
    for session_id in touched_sessions(restriction):
        append_event(session_id, TIMELINE_APPENDED, payload, producer=producer)
    audit(
        "restriction.lifted",
        obj=restriction,
        actor=user,
        session_id=restriction.session_id,
        detail={
            "kind": restriction.kind,
            "target": restriction.target,
            "note": note,
            "requested_by": tool_call.request_payload["requested_by"],
            "tool_call": tool_call.pk,
            "reference": reference,
        },
    )
