"""The django-rq worker AERO runs: jobs run in the worker process itself (no fork per
job), the compiled agent graph and its checkpointer connection are reused across jobs,
and the reconciler runs in the worker's heartbeat thread.

Not forking is safe here because a job's effects live in PostgreSQL, never in worker
memory, and a crash is contained by the lease (docs/jobs-and-leases.md): an
exception fails the job (rq records it; the session's retry/failed state is an event), a
timeout raises inside the job (rq's SIGALRM death penalty works in the main thread), and
a worker that dies outright stops renewing its lease, which runs out within
AERO_LEASE_SECONDS, after which any worker's reconciler re-enqueues the session from its
last checkpoint.

SIGTERM: rq's warm shutdown, plus: the running job finishes the graph step it
is in, starts no other, and lets its lease go; the next reconciler pass gives the
session to another worker. A second SIGTERM is rq's cold shutdown.

Heartbeat: a thread writes this worker's `WorkerBeat` row every
AERO_HEARTBEAT_SECONDS (/healthz reads those rows from PostgreSQL) and runs the periodic
tasks every AERO_RECONCILE_SECONDS, busy or not. A job's start is written at once; the
worker's return to idle once it stayed idle IDLE_SETTLE_SECONDS. While the
process waits for Redis after an outage (diagnosis.rq_retry), it keeps beating (no
periodic tasks: they enqueue): /healthz then says Redis is down and the worker alive."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import langgraph.graph  # noqa: F401  (import langgraph once, at start)
import mcp.client.stdio  # noqa: F401  (the code tool's MCP client: imported at its first call)
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections
from django.utils import timezone
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.rate_limit import release_slot
from rq.utils import now
from rq.version import VERSION as RQ_VERSION
from rq.worker import SimpleWorker, WorkerStatus

from aero.compiled import Arg, CompiledUpdate
from diagnosis import shutdown
from diagnosis.conn_health import check_django_connections
from diagnosis.jobs import warm_up_worker
from diagnosis.maintenance import run_periodic_tasks
from diagnosis.models import WorkerBeat

logger = logging.getLogger("diagnosis.worker")


# How long a worker that finished a job stays idle before its row says so: a
# worker with jobs waiting starts the next one within milliseconds, and that job's beat
# names its session; the "idle again" write is for a worker that has nothing to do.
IDLE_SETTLE_SECONDS = 1.0


# Once per job: compiled once per connection.
_beat_job = CompiledUpdate(
    WorkerBeat,
    lambda: WorkerBeat.objects.filter(name=Arg(0)),
    {
        "beat_at": Arg(1, WorkerBeat._meta.get_field("beat_at")),
        "session_id": Arg(2, WorkerBeat._meta.get_field("session_id")),
        "stopping": Arg(3, WorkerBeat._meta.get_field("stopping")),
    },
)


class WorkerHeartbeat:
    """Writes the worker's WorkerBeat row from a thread of its own, so a long job does
    not silence it; a worker that dies stops beating and /healthz sees it go stale."""

    def __init__(self, name: str, *, reconciling: bool = True) -> None:
        self.name = name
        self.reconciling = reconciling  # off while waiting for Redis: beat only
        self.started_at = timezone.now()
        self.session_id: str | None = None
        # Since when the worker is idle with its row still naming its last job's session
        # (monotonic), or None: the beat thread writes "idle" once it has settled.
        self.idle_since: float | None = None
        # A job started and its row is not written yet: the beat thread writes it.
        self.job_unwritten = False
        # Held while the row is written from what this object says, so the beat thread
        # never writes a state the job thread has changed meanwhile over a newer one.
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="aero-worker-beat")

    def start(self) -> None:
        if self.reconciling:
            self.reconcile()  # at once: a worker started after a crash picks its sessions up
            # Rows of workers killed long ago (they never removed theirs) would only
            # clutter /healthz's count of registered workers.
            WorkerBeat.objects.filter(beat_at__lt=timezone.now() - timedelta(hours=1)).delete()
        self.beat_now()
        self.thread.start()

    def beat(self) -> None:
        WorkerBeat.objects.update_or_create(
            name=self.name,
            defaults={
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started_at": self.started_at,
                "beat_at": timezone.now(),
                "session_id": self.session_id,
                "stopping": shutdown.stopping(),
            },
        )

    def job_started(self, session_id: str | None) -> None:
        """/healthz shows what the worker runs from its start: the beat thread writes it
        at once, off the job's path (the job's own UPDATE was a round trip per
        job, on the path of every session behind it). It also says the worker is no
        longer idle, so a pending "idle" write is dropped."""
        with self.lock:
            self.session_id = session_id
            self.idle_since = None
            self.job_unwritten = True
        self.wake.set()

    def job_ended(self) -> None:
        """Idle again: written by the beat thread once the worker stayed idle for
        IDLE_SETTLE_SECONDS, not here: with jobs waiting, the next job's
        start overwrites the row within milliseconds, and the "idle" UPDATE in between
        was one statement per job that nobody could see. A job over before its row was
        written is not written at all."""
        with self.lock:
            self.session_id = None
            self.idle_since = time.monotonic()
            self.job_unwritten = False
        self.wake.set()

    def write_started_job(self) -> None:
        """The running job's row, if not written yet (the beat thread's turn)."""
        with self.lock:
            if self.job_unwritten:
                self.job_unwritten = False
                self.beat_job()

    def beat_job(self) -> None:
        """The beat around each job (what the worker runs, or idle again): one UPDATE of
        the row start() created, not update_or_create's transaction, row lock and write
        (four statements twice per job, on the path every resume takes). A row
        deleted meanwhile (a sweep of stale rows) is written again in full."""
        try:
            updated = _beat_job.run(self.name, timezone.now(), self.session_id, shutdown.stopping())
            if not updated:
                self.beat()
        except DatabaseError:
            logger.warning("worker %s: heartbeat failed", self.name)
            connections["default"].close()  # reconnect on the next use

    def beat_now(self) -> None:
        try:
            self.beat()
        except DatabaseError:
            logger.warning("worker %s: heartbeat failed", self.name)
            connections["default"].close()  # reconnect on the next use

    def _settled_idle(self) -> float | None:
        """Seconds until a pending "idle" write is due (0: now), or None if none is."""
        idle_since = self.idle_since
        if idle_since is None:
            return None
        return max(0.0, idle_since + IDLE_SETTLE_SECONDS - time.monotonic())

    def write_settled_idle(self) -> None:
        """The "idle" write, if the worker has been idle long enough. Decided under the
        lock job_started() takes: a job that started meanwhile is never overwritten."""
        with self.lock:
            if self._settled_idle() == 0.0:
                self.idle_since = None
                self.beat_job()

    def _run(self) -> None:
        last_reconcile = time.monotonic()
        next_beat = time.monotonic() + settings.AERO_HEARTBEAT_SECONDS
        try:
            while not self.done.is_set():
                timeout = max(0.0, next_beat - time.monotonic())
                idle_due = self._settled_idle()
                self.wake.wait(timeout if idle_due is None else min(timeout, idle_due))
                self.wake.clear()
                if self.done.is_set():
                    break
                self.write_started_job()
                if time.monotonic() < next_beat:
                    self.write_settled_idle()
                    continue
                next_beat = time.monotonic() + settings.AERO_HEARTBEAT_SECONDS
                try:
                    with self.lock:
                        self.idle_since = None  # the full beat writes the idle state too
                        self.job_unwritten = False  # ... and the running job
                        self.beat()
                except DatabaseError:
                    # PostgreSQL restarting: the next beat reconnects.
                    logger.warning("worker %s: heartbeat failed", self.name)
                    connections.close_all()
                if (
                    self.reconciling
                    and time.monotonic() - last_reconcile >= settings.AERO_RECONCILE_SECONDS
                ):
                    last_reconcile = time.monotonic()
                    self.reconcile()
        finally:
            connections.close_all()

    def reconcile(self) -> None:
        """The periodic tasks (re-enqueue stalled sessions, ...) from this thread, not
        rq's maintenance loop: that runs only between jobs, so with every worker busy a
        killed worker's session waited for a job to end before anyone noticed."""
        try:
            run_periodic_tasks()
        finally:
            connections.close_all()  # this thread's; the next pass reconnects

    def stop(self) -> None:
        self.done.set()
        self.wake.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        try:
            WorkerBeat.objects.filter(name=self.name).delete()
        except DatabaseError:
            logger.warning("worker %s: could not remove its heartbeat row", self.name)


# rq beats its worker key around every job: after it, before the suspension check, before
# and after each dequeue, each beat three round trips. A beat that sets the TTL
# the last one set, this soon after it, is skipped: the key still has over worker_ttl +
# 55 s to live, and a dequeue blocks for at most worker_ttl - 15 s.
REDIS_BEAT_SECONDS = 5.0


# rq's start and end of a job in one transaction each (AeroWorker.prepare_execution,
# handle_job_success) use rq's own calls, some private, in the order rq 3.0 makes them;
# any other minor version gets rq's own handling until checked (an upgrade then fails
# tests/test_worker_overhead.py's round-trip count, which also compares what both leave
# in Redis).
LEAN_RQ = RQ_VERSION.split(".")[:2] == ["3", "0"]


class AeroWorker(SimpleWorker):
    _redis_beat: tuple[int, float] = (0, -1e9)  # (the TTL it set, when)
    _suspension_checked = -1e9  # when (monotonic)
    # The job's start, queued by prepare_execution, sent by prepare_job_execution.
    _starting: Any = None
    # The job whose end's beat goes with its outcome (handle_execution_ended).
    _ended: Job | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("maintenance_interval", settings.AERO_RECONCILE_SECONDS)
        # The maintenance check runs between dequeues, which block for worker_ttl - 15 s.
        kwargs.setdefault("worker_ttl", max(20, settings.AERO_RECONCILE_SECONDS + 15))
        kwargs.setdefault(
            "name", f"aero-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        super().__init__(*args, **kwargs)
        self.beats = WorkerHeartbeat(self.name)

    def work(self, *args: Any, **kwargs: Any) -> bool:
        # rq's own lines (three or four per job: started, completed, "Job OK", "result
        # discarded") at AERO's level, not INFO: with AERO_LOG_LEVEL=WARNING a worker
        # formatted and wrote them for every job.
        kwargs.setdefault("logging_level", logging.getLogger("diagnosis").getEffectiveLevel())
        # Before the first beat says the worker is up: the model clients, the agent graph
        # and its checkpointer, which the first job paid for otherwise.
        warm_up_worker()
        self.beats.start()
        # With its first reconcile pass done: the fault suite's per-kill timeline reads
        # when replaced workers became able to pick sessions up.
        logger.info("worker %s: ready", self.name)
        try:
            return bool(super().work(*args, **kwargs))
        finally:
            self.beats.stop()

    @contextlib.contextmanager
    def waiting_for_redis(self) -> Iterator[None]:
        """rq's loop quit on a Redis error and the process waits for Redis
        (diagnosis.rq_retry): the worker is alive, so it keeps beating to PostgreSQL
        meanwhile, under the same name, and removes its row when the wait ends (the
        next worker registers its own)."""
        beats = WorkerHeartbeat(self.name, reconciling=False)
        beats.start()
        try:
            yield
        finally:
            beats.stop()

    def handle_warm_shutdown_request(self) -> None:
        super().handle_warm_shutdown_request()
        shutdown.request_stop()  # the running job stops after its current step

    def execute_job(self, job: Job, queue: Queue) -> None:
        # Django closes stale or broken connections around each request; a worker has
        # no requests, so do it before each job (CONN_MAX_AGE keeps healthy ones). Once,
        # not before and after: nothing runs on the connection in between. Its
        # health check is a poll of the socket, not a SELECT 1 (diagnosis.conn_health).
        close_old_connections()
        check_django_connections()
        self.beats.job_started(job.args[0] if job.args else None)
        logger.info("worker %s: job %s started", self.name, job.id)
        try:
            super().execute_job(job, queue)
        finally:
            self.beats.job_ended()  # written once the worker stays idle

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """rq's worker beat (its key's TTL), in one round trip and not again within
        REDIS_BEAT_SECONDS unless the TTL changes (a job's start sets a longer one, its
        end the usual one again)."""
        ttl = timeout or self.worker_ttl + 60
        if pipeline is not None:
            super().heartbeat(ttl, pipeline=pipeline)  # sent with the caller's commands
        elif self._redis_beat[0] == ttl and time.monotonic() - self._redis_beat[1] < (
            REDIS_BEAT_SECONDS
        ):
            return
        else:
            with self.connection.pipeline(transaction=False) as beat:
                super().heartbeat(ttl, pipeline=beat)
                beat.execute()
        self._redis_beat = (ttl, time.monotonic())

    def set_state(self, state: str, pipeline: Any = None) -> None:
        # rq sets "idle" after each job and again before each dequeue: only this worker
        # writes its state, so the same state is not written twice (a round trip each).
        if pipeline is None and state == self._state:
            return
        super().set_state(state, pipeline=pipeline)

    # rq 3.0 pays eleven Redis round trips around each job (the execution's record, the
    # job marked started, the job's last beat, a WATCH and a read of its dependents
    # before its end's transaction, the state back to idle, the worker's beat, the
    # suspension check, the dequeue and the job's read): on the path of every session
    # queued behind. AERO's jobs have no dependents, callbacks or repeats: a job's start
    # is one transaction, its end another, the suspension is checked once per
    # REDIS_BEAT_SECONDS; four round trips a job with the dequeue and the job's read.

    def check_for_suspension(self, burst: bool) -> None:
        # `rq suspend` is seen within REDIS_BEAT_SECONDS, not before the next job.
        if LEAN_RQ and time.monotonic() - self._suspension_checked < REDIS_BEAT_SECONDS:
            return
        super().check_for_suspension(burst)
        self._suspension_checked = time.monotonic()

    def prepare_execution(self, job: Job) -> Execution:
        """The execution's record and the state "busy", queued for prepare_job_execution's
        transaction (rq sends them in one of their own just before)."""
        if not LEAN_RQ:
            return super().prepare_execution(job)
        self._ended = None  # a job's end is written before the next one starts
        pipeline = self.connection.pipeline()
        execution = Execution.create(
            job, self.get_heartbeat_ttl(job), pipeline=pipeline, worker_name=self.name
        )
        self.executions[execution.id] = execution
        self.set_state(WorkerStatus.BUSY, pipeline=pipeline)
        self._starting = pipeline
        return execution

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        starting, self._starting = self._starting, None
        if starting is None:
            super().prepare_job_execution(job, remove_from_intermediate_queue)
            return
        with starting:  # rq's own commands for the job's start, in the same transaction
            ttl = self.get_heartbeat_ttl(job)
            self.heartbeat(ttl, pipeline=starting)
            job.heartbeat(now(), ttl, pipeline=starting)
            job.prepare_for_execution(self.name, pipeline=starting)
            starting.persist(job.key)
            if remove_from_intermediate_queue:
                queue = Queue(job.origin, connection=self.connection)
                starting.lrem(queue.intermediate_queue_key, 1, job.id)
            starting.execute()

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        """The job's last beat goes with its outcome's transaction (below), not in a
        round trip of its own."""
        if not LEAN_RQ:
            super().handle_execution_ended(job, queue, heartbeat_ttl)
            return
        job.ended_at = now()
        self._ended = job

    def _beat_ended(self, pipeline: Any) -> None:
        ended, self._ended = self._ended, None
        if ended is not None:
            ended.heartbeat(now(), 0, pipeline=pipeline)  # the TTL is not used (rq 3.0)

    def increment_failed_job_count(self, pipeline: Any = None) -> None:
        # In the failure's (or a retry's) transaction: the job's last beat with it.
        if pipeline is not None:
            self._beat_ended(pipeline)
        super().increment_failed_job_count(pipeline)

    def handle_job_success(
        self, job: Job, queue: Queue, started_job_registry: Any, execution: Execution
    ) -> None:
        """rq's success handling in one transaction, without the WATCH and the read of
        the job's dependents (AERO enqueues none), with the job's last beat, the state
        back to idle and the worker's beat at its usual TTL (the next two rq asks for are
        then unchanged: not sent)."""
        if not LEAN_RQ or job.repeats_left:
            self._beat_ended(self.connection)
            super().handle_job_success(job, queue, started_job_registry, execution)
            return
        assert job.started_at is not None and job.ended_at is not None
        with self.connection.pipeline() as pipeline:
            self._beat_ended(pipeline)
            self.increment_successful_job_count(pipeline=pipeline)
            self.increment_total_working_time(job.ended_at - job.started_at, pipeline)
            result_ttl = job.get_result_ttl(self.default_result_ttl)
            if result_ttl != 0:
                job._handle_success(
                    result_ttl,
                    pipeline=pipeline,
                    worker_name=self.name,
                    execution_id=execution.id,
                    execution_started_at=execution.created_at,
                    execution_ended_at=job.ended_at,
                )
            job.cleanup(result_ttl, pipeline=pipeline, remove_from_queue=False)
            job._status = JobStatus.FINISHED
            self.cleanup_execution(job, pipeline=pipeline, execution=execution)
            state, beat = self._state, self._redis_beat
            self.set_state(WorkerStatus.IDLE, pipeline=pipeline)
            self.heartbeat(pipeline=pipeline)
            try:
                pipeline.execute()
            except BaseException:
                # Not written: the state and the beat rq sends next go to Redis (with
                # Redis gone, they raise and the worker waits for it: rq_retry).
                self._state, self._redis_beat = state, beat
                raise
        release_slot(job)

    def run_maintenance_tasks(self) -> None:
        # rq's registry cleaning only: AERO's periodic tasks run in the heartbeat thread.
        super().run_maintenance_tasks()
