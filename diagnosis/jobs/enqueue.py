"""Getting a session's job run: on commit, once, by the configured backend. `rq`
(django-rq workers on Redis, under a fixed job id per session), `embedded` (the
in-process worker threads) or `inline` (run in the caller: the CLI and tests, with the
model calls the job waits for made in between)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from aero import metrics
from aero.supervision import process_gone
from diagnosis.jobs.child_jobs import hand_in, run_children_inline
from diagnosis.jobs.lease import lease_is_live
from diagnosis.jobs.rq_queues import drop_job, queue_named
from diagnosis.llm_runner import run_pending_inline, start_in_thread
from diagnosis.models import Session

if TYPE_CHECKING:
    from diagnosis.jobs.embedded import EmbeddedWorker

# The job, by name: rq stores this path, and a web process that enqueues it need not
# import the job's module (LangGraph with it) to do so.
ADVANCE_SESSION = "diagnosis.jobs.job.advance_session"

logger = logging.getLogger("diagnosis.jobs")


def enqueue_advance(session_id: Any) -> None:
    """Schedule a job for the session once the current transaction commits."""
    transaction.on_commit(lambda: dispatch_after_commit(session_id))


def dispatch_after_commit(session_id: Any, *, lease_read: bool = False) -> bool:
    """dispatch(), for a change that has already committed: a broken queue (Redis down,
    say) is logged and left to the reconciler, which re-enqueues every session that
    should move and has no job. Raising here would answer 500 for something that was
    saved, and a user who retries creates a duplicate. The inline backend
    (tests, the CLI) runs the job itself here, so its failures still surface.
    `lease_read`: see dispatch."""
    if settings.AERO_JOB_BACKEND == "inline":
        return dispatch(session_id, lease_read=lease_read)
    try:
        return dispatch(session_id, lease_read=lease_read)
    except Exception as exc:
        metrics.enqueue_failed()
        logger.warning(
            "session %s: enqueue failed (%s: %s); committed, the reconciler will enqueue it",
            session_id,
            type(exc).__name__,
            exc,
        )
        return False


def job_id(session_id: Any) -> str:
    """A session's job has this fixed id: a second enqueue finds the first."""
    return f"aero-advance-{session_id}"


# rq statuses of a job that will still run from the start (so it sees every input
# committed before it starts).
_WAITING = ("queued", "deferred", "scheduled")


def dispatch(session_id: Any, *, at_front: bool = False, lease_read: bool = False) -> bool:
    """Run or enqueue the session's job unless one is already waiting or running.
    Returns whether a job was enqueued (or run, inline). `at_front`: ahead of the jobs
    waiting in the queue (a session whose job was lost has waited already): the rq
    backend puts it in the priority queue, behind only the sessions re-enqueued before
    it.

    Never twice: a job waiting in the queue will see this input when it starts; a job
    holding the session's lease re-checks the inputs after it lets the lease go
    (advance_session), so an input committed before we read the lease is never missed.
    A lease is read after the caller's commit (dispatch runs on commit). `lease_read`:
    the caller read it instead, under the session's row lock in the transaction that
    committed the input, and found none live (the LLM runner): a job that took
    the lease since started after that commit."""
    session_id = str(session_id)
    backend = settings.AERO_JOB_BACKEND
    if backend == "inline":
        from diagnosis.jobs.job import WAITING_MODEL, advance_session

        # Inline (the CLI, tests): the model calls and child agents a job waits for are
        # run right here, then the job runs again, until the session waits for something else.
        while advance_session(session_id) == WAITING_MODEL:
            # The calls first (a child may wait for one), then the child agents.
            called = run_pending_inline(session_id)
            if not (run_children_inline(session_id) or called):
                break
        return True
    if not lease_read and lease_is_live(session_id):
        return False
    if backend == "rq":
        return _enqueue_rq(session_id, at_front=at_front)
    return embedded_worker().submit(session_id)


def _enqueue_rq(session_id: str, *, at_front: bool = False) -> bool:
    """Enqueue under the fixed id, atomically (rq's unique enqueue: two decisions
    committing together push one job). An old job under that id is replaced only once
    it can no longer run: finished or failed, or started by a worker whose lease expired
    (it crashed). A job that is started but holds no lease is just starting (it will see
    this input) or just finishing (it may not): wait a moment to tell which."""
    from rq.exceptions import DuplicateJobError, NoSuchJobError
    from rq.job import Job

    # Re-enqueued after its job was lost: the priority queue, in order. Pushed at the
    # front of the one queue, a session re-enqueued later went first (last in, first
    # out): one killed over and over kept jumping ahead of one lost a minute before.
    queue = queue_named(settings.AERO_PRIORITY_QUEUE if at_front else settings.AERO_QUEUE)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            queue.enqueue(
                ADVANCE_SESSION,
                session_id,
                job_id=job_id(session_id),
                unique=True,
                job_timeout=600,
                # Kept finished, not deleted at once (result_ttl=0): rq deletes such a job
                # in its success pipeline while the worker still has steps of its own to
                # run on that id, and the next enqueue under the same fixed id (the
                # runner's, at its reply) then let a second worker start it meanwhile.
                # The next enqueue deletes a finished job itself (below).
                result_ttl=300,
                failure_ttl=86400,
            )
            return True
        except DuplicateJobError:
            pass
        try:
            job = Job.fetch(job_id(session_id), connection=queue.connection)
        except NoSuchJobError:
            continue  # expired or deleted meanwhile: enqueue again
        status = job.get_status()
        if status == "queued" and not _in_a_queue(queue.connection, job.id):
            # Popped by a worker: a live one marks it started within milliseconds; one
            # killed before it started the job leaves it "queued" forever: lost.
            time.sleep(0.05)
            if job.get_status() == "queued":
                drop_job(job)
                continue
            status = job.get_status()
        if status in _WAITING:
            return False
        if status == "started":
            lease = Session.objects.filter(pk=session_id).values_list(
                "lease_token", "lease_expires_at"
            )
            token, expires = lease.first() or (None, None)
            if token is not None and expires is not None and expires > timezone.now():
                return False  # the holder re-checks the inputs before it lets go
            if token is None and not _worker_gone(job.worker_name):
                time.sleep(0.02)
                continue
        drop_job(job)  # it can no longer run: the id is free for the next job
    logger.warning("session %s: its job stayed busy; the reconciler will enqueue it", session_id)
    return False


def _in_a_queue(redis: Any, name: str) -> bool:
    """Whether the job id is in one of AERO's rq queues (or rq's list of jobs being
    dequeued): a "queued" job that is in none was taken by a worker killed before it
    started the job, and nothing would ever run it."""
    import django_rq

    for queue_name in (settings.AERO_PRIORITY_QUEUE, settings.AERO_QUEUE):
        queue = django_rq.get_queue(queue_name)
        for key in (queue.key, queue.intermediate_queue_key):
            if redis.lpos(key, name) is not None:
                return True
    return False


def _worker_gone(worker_name: str | None) -> bool:
    """Whether the rq worker that started a job is a process gone from this host (its
    name is aero-<host>-<pid>-<hex>, diagnosis.worker): killed after it dequeued the job
    and before it took the lease, it left the job "started" with no lease, which reads
    as a job just starting, and the session would wait for rq to clean its registry
    (the job's 600 s timeout). Other hosts' workers and other names read as alive."""
    prefix = f"aero-{socket.gethostname()}-"
    if not worker_name or not worker_name.startswith(prefix):
        return False
    pid = worker_name.removeprefix(prefix).split("-", 1)[0]
    return pid.isdigit() and int(pid) != os.getpid() and process_gone(int(pid))


def queued_job_ids() -> set[str]:
    """The sessions whose job waits in the queue (rq backend), one Redis call."""
    if settings.AERO_JOB_BACKEND != "rq":
        return set(embedded_worker().waiting) if settings.AERO_JOB_BACKEND == "embedded" else set()
    import django_rq

    prefix = job_id("")
    return {
        name.removeprefix(prefix)
        for queue in (settings.AERO_PRIORITY_QUEUE, settings.AERO_QUEUE)
        for name in django_rq.get_queue(queue).get_job_ids()
        if name.startswith(prefix)
    }


_embedded: EmbeddedWorker | None = None
_embedded_lock = threading.Lock()


def embedded_worker() -> EmbeddedWorker:
    """This process's embedded worker, started at first use; with model calls as waits,
    the LLM runner too (an event loop on a thread of this process)."""
    global _embedded
    with _embedded_lock:
        if _embedded is None:
            from diagnosis.jobs.embedded import EmbeddedWorker

            _embedded = EmbeddedWorker(settings.AERO_EMBEDDED_WORKERS)
            if settings.AERO_LLM_WAITS:
                start_in_thread(dispatch_after_commit)
        return _embedded


def running_embedded_worker() -> EmbeddedWorker | None:
    """This process's embedded worker if one was started (never starts one)."""
    return _embedded


# Child agents' jobs wake their session and run on the embedded pool through these.
hand_in(dispatch_after_commit, lambda fn, *args: embedded_worker().pool.submit(fn, *args))
