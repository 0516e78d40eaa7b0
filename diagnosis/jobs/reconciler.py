"""The reconciler: PostgreSQL says which sessions must move, and every worker's
maintenance loop re-enqueues those that have no job (a killed worker, a job Redis lost),
after letting go of the leases of this host's dead processes; and a session that failed
with approved actions not executed yet is resumed, not left for a person to find."""

from __future__ import annotations

import logging
import os
import socket
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, Sum
from django.utils import timezone

from aero.supervision import process_gone
from diagnosis.eventlog.names import AGENT_RUN_ENDED, SESSION_STATUS_CHANGED
from diagnosis.eventlog.types.runs import JOB_GONE
from diagnosis.events import append_keyed, lock_session, set_status
from diagnosis.jobs.child_jobs import requeue_children
from diagnosis.jobs.enqueue import dispatch, enqueue_advance, queued_job_ids
from diagnosis.jobs.lease import holder_pid
from diagnosis.models import (
    AgentRun,
    Event,
    LLMCall,
    LLMRequestStatus,
    Session,
    SessionStatus,
    ToolCall,
    ToolCallStatus,
)

logger = logging.getLogger("diagnosis.jobs")


def requeue_stalled_sessions() -> int:
    """Re-enqueue the sessions that should be moving but have no job waiting and no live
    lease. Every worker runs this; the fixed job id makes concurrent passes harmless."""
    release_dead_holders()
    requeue_children()  # child agents whose job was lost (their claim ran out)
    candidates = stalled_sessions()
    if not candidates:
        return 0
    waiting = queued_job_ids()
    enqueued = 0
    for session_id in candidates:
        if session_id in waiting:
            continue  # its job is in the queue, behind others: not stalled, just late
        # At the front: its job was lost (a killed worker, Redis restarted) after it had
        # waited its turn once; behind a long queue it waited minutes more.
        try:
            moved = dispatch(session_id, at_front=True)
        except Exception:
            # Whatever went wrong with this session's job (or its row) this pass, the
            # next pass tries again, and the sessions after it in this pass are not held
            # up: one session's error used to end the pass for all of them.
            logger.exception("session %s: re-enqueue failed; the next pass retries", session_id)
            continue
        if moved:
            logger.info("re-enqueued stalled session %s", session_id)
            enqueued += 1
    return enqueued


def release_dead_holders() -> int:
    """Let go now of the leases held by a job whose worker process is gone from this host
    (kill -9, the OOM killer), instead of waiting for them to run out: the reconciler
    pass that follows re-enqueues those sessions at once. The holder is read
    from the session row, written by the same UPDATE that took the lease: a
    job killed right after taking it (before its run row existed, while a fresh worker
    was still building its graph) was invisible here and its session waited out the
    whole lease. Only the exact lease the dead process took is expired (by its token),
    so a lease another worker has taken since is never touched; a pid reused by a live
    process reads as alive, and then the lease runs out as before. Other hosts'
    processes cannot be checked: their leases run out."""
    host = socket.gethostname()
    now = timezone.now()
    leases = Session.objects.filter(
        lease_token__isnull=False, lease_expires_at__gt=now, lease_holder__startswith=f"{host}:"
    ).values_list("pk", "lease_token", "lease_holder")
    released = 0
    for session_id, token, holder in leases:
        pid = holder_pid(holder, host)
        if pid is None or pid == os.getpid() or not process_gone(pid):
            continue
        if Session.objects.filter(
            pk=session_id, lease_token=token, lease_expires_at__gt=now
        ).update(lease_expires_at=now):
            logger.warning(
                "session %s: its worker (pid %s) is gone, lease released", session_id, pid
            )
            released += 1
    return released


def stalled_sessions() -> list[str]:
    """Sessions that should be moving but hold no live lease (worker killed, Redis lost
    the job). Redis is never the source of truth: PostgreSQL says what must run. No
    grace period: a running job's heartbeat keeps its lease live, and the caller skips
    sessions whose job waits in the queue."""
    now = timezone.now()
    rows = (
        Session.objects.visible()
        .filter(status__in=[SessionStatus.QUEUED, SessionStatus.RUNNING, SessionStatus.RETRYING])
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
        # Waiting for the model: the runner enqueues it when the reply is stored.
        .exclude(llm_requests__status=LLMRequestStatus.PENDING)
    )
    return [str(pk) for pk in rows.values_list("pk", flat=True)]


# Who the reconciler's own status moves are recorded as.
PRODUCER = "reconciler"
# Why the reconciler closes a run (its row says it in words, its event by its code).
ORPHAN_REASON = "its job ended without closing it"
# How many times the reconciler resumes one failed session: one that keeps failing stays
# failed after that, for a person to look at (POST .../resume still resumes it).
RESUME_FAILED_LIMIT = 3
# Approved actions a failed session has not executed yet (handed to the outbox or not).
_UNEXECUTED = (ToolCallStatus.APPROVED, ToolCallStatus.EXECUTING, ToolCallStatus.RUNNING)


def resume_failed_sessions() -> int:
    """Resume (as POST .../resume does) each failed session with approved actions not
    executed yet: a job that gave up midway left what people approved undone. At most
    RESUME_FAILED_LIMIT times per session. Returns how many were resumed."""
    unexecuted = ToolCall.objects.filter(session=OuterRef("pk"), status__in=_UNEXECUTED)
    candidates = (
        Session.objects.visible()
        .filter(status=SessionStatus.FAILED)
        .filter(Exists(unexecuted))
        .values_list("pk", flat=True)
    )
    resumed = 0
    for session_id in candidates:
        with transaction.atomic():
            session = lock_session(session_id)
            if session.status != SessionStatus.FAILED:
                continue  # resumed meanwhile (a person, another worker's pass)
            tries = Event.objects.filter(
                session_id=session_id, type=SESSION_STATUS_CHANGED, producer=PRODUCER
            ).count()
            if tries >= RESUME_FAILED_LIMIT:
                continue
            set_status(
                session_id,
                SessionStatus.QUEUED,
                producer=PRODUCER,
                reason="approved actions were not executed yet: resumed by the reconciler",
            )
            enqueue_advance(session_id)
        logger.warning("session %s: failed with approved actions pending, resumed", session_id)
        resumed += 1
    return resumed


def close_orphaned_runs() -> int:
    """Close the root runs whose job is gone without closing them (its worker killed,
    PostgreSQL restarted under it): a root run is its job's, which holds the lease the
    run names; once that lease is no longer live on its session, the job cannot end the
    run any more (its end is fenced by the lease). Marked failed, with the reason, and
    said by an `agent.run_ended` event in the same transaction: no change without its
    event. The UPDATE finds the run still running, so two passes close it once."""
    now = timezone.now()
    rows = AgentRun.objects.filter(parent__isnull=True, status="running").values_list(
        "pk",
        "session_id",
        "agent_name",
        "started_at",
        "input_snapshot",
        "session__lease_token",
        "session__lease_expires_at",
    )
    orphans = []
    for pk, session_id, agent, started_at, snapshot, token, expires in rows:
        held = token is not None and expires is not None and expires > now
        if not held or str(snapshot.get("lease", "")) != str(token):
            orphans.append((pk, session_id, agent, started_at))
    closed = 0
    for pk, session_id, agent, started_at in orphans:
        try:
            closed += _close_orphan(pk, session_id, agent, started_at, now)
        except Exception:
            # This run's session this pass; the next pass tries again, the others go on.
            logger.exception("run %s: closing it failed; the next pass retries", pk)
    if closed:
        logger.warning("closed %d run(s) their dead jobs left running", closed)
    return closed


def _close_orphan(pk: int, session_id: Any, agent: str, started_at: Any, now: Any) -> int:
    with transaction.atomic():
        lock_session(session_id)  # the event's lock first, as every writer takes it
        closed = AgentRun.objects.filter(pk=pk, status="running").update(
            status="failed",
            ended_at=now,
            output_summary={"status": "interrupted", "reason": ORPHAN_REASON},
        )
        if closed:
            # What its steps' model calls cost, as a child run's end says it.
            used = LLMCall.objects.filter(
                Q(agent_run_id=pk) | Q(agent_run__parent_id=pk)
            ).aggregate(
                tokens_in=Sum("tokens_in", default=0),
                tokens_out=Sum("tokens_out", default=0),
                cost=Sum("cost", default=Decimal(0)),
            )
            append_keyed(
                session_id,
                AGENT_RUN_ENDED,
                f"run:{pk}/run_ended/failed",
                {
                    "run": pk,
                    "agent": agent,
                    "status": "failed",
                    "started_at": started_at.isoformat(),
                    "ended_at": now.isoformat(),
                    "tokens_in": used["tokens_in"],
                    "tokens_out": used["tokens_out"],
                    "cost": str(used["cost"]),
                    "reason": JOB_GONE,
                },
                producer=PRODUCER,
                run=AgentRun(pk=pk, session_id=session_id),
            )
    return closed
