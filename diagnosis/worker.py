"""The django-rq worker AERO runs: jobs run in the worker process itself (no fork per
job), the compiled agent graph and its checkpointer connection are reused across jobs,
and the reconciler runs in the worker's heartbeat thread.

Not forking is safe here because a job's effects live in PostgreSQL, never in worker
memory, and a crash is contained by the lease (docs/decisions.md, ADR 83, ADR 100): an
exception fails the job (rq records it; the session's retry/failed state is an event), a
timeout raises inside the job (rq's SIGALRM death penalty works in the main thread), and
a worker that dies outright stops renewing its lease, which runs out within
AERO_LEASE_SECONDS, after which any worker's reconciler re-enqueues the session from its
last checkpoint.

SIGTERM (ADR 102): rq's warm shutdown, plus: the running job finishes the graph step it
is in, starts no other, and lets its lease go; the next reconciler pass gives the
session to another worker. A second SIGTERM is rq's cold shutdown.

Heartbeat (ADR 102): a thread writes this worker's `WorkerBeat` row every
AERO_HEARTBEAT_SECONDS (/healthz reads those rows from PostgreSQL) and runs the periodic
tasks every AERO_RECONCILE_SECONDS, busy or not. While the process waits for Redis
after an outage (diagnosis.rq_retry), it keeps beating (no periodic tasks: they enqueue):
/healthz then says Redis is down and the worker alive (ADR 108)."""

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

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections
from django.utils import timezone
from rq.job import Job
from rq.queue import Queue
from rq.worker import SimpleWorker

import diagnosis.agent.graph  # noqa: F401  (import langgraph once, at start)
from diagnosis import shutdown
from diagnosis.maintenance import run_periodic_tasks
from diagnosis.models import WorkerBeat

logger = logging.getLogger("diagnosis.worker")


class WorkerHeartbeat:
    """Writes the worker's WorkerBeat row from a thread of its own, so a long job does
    not silence it; a worker that dies stops beating and /healthz sees it go stale."""

    def __init__(self, name: str, *, reconciling: bool = True) -> None:
        self.name = name
        self.reconciling = reconciling  # off while waiting for Redis: beat only
        self.started_at = timezone.now()
        self.session_id: str | None = None
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

    def beat_job(self) -> None:
        """The beat around each job (what the worker runs, or idle again): one UPDATE of
        the row start() created, not update_or_create's transaction, row lock and write
        (ADR 150: four statements twice per job, on the path every resume takes). A row
        deleted meanwhile (a sweep of stale rows) is written again in full."""
        try:
            updated = WorkerBeat.objects.filter(name=self.name).update(
                beat_at=timezone.now(), session_id=self.session_id, stopping=shutdown.stopping()
            )
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

    def _run(self) -> None:
        last_reconcile = time.monotonic()
        try:
            while not self.done.wait(settings.AERO_HEARTBEAT_SECONDS):
                try:
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
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        try:
            WorkerBeat.objects.filter(name=self.name).delete()
        except DatabaseError:
            logger.warning("worker %s: could not remove its heartbeat row", self.name)


class AeroWorker(SimpleWorker):
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
        # no requests, so do it around each job (CONN_MAX_AGE keeps healthy ones).
        close_old_connections()
        self.beats.session_id = job.args[0] if job.args else None
        self.beats.beat_job()  # /healthz shows what the worker runs from the start
        logger.info("worker %s: job %s started", self.name, job.id)
        try:
            super().execute_job(job, queue)
        finally:
            self.beats.session_id = None
            close_old_connections()
            self.beats.beat_job()  # idle again, at once

    def run_maintenance_tasks(self) -> None:
        # rq's registry cleaning only: AERO's periodic tasks run in the heartbeat thread.
        super().run_maintenance_tasks()
