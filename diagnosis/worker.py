"""The django-rq worker AERO runs: jobs run in the worker process itself (no fork per
job), the compiled agent graph and its checkpointer connection are reused across jobs,
and the reconciler runs in the worker's maintenance loop.

Not forking is safe here because a job's effects live in PostgreSQL, never in worker
memory, and a crash is contained by the lease (docs/decisions.md, ADR 83): an exception
fails the job (rq records it; the session's retry/failed state is an event), a timeout
raises inside the job (rq's SIGALRM death penalty works in the main thread), and a
worker that dies outright leaves a lease that expires, after which any worker's
reconciler re-enqueues the session from its last checkpoint."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import close_old_connections
from rq.job import Job
from rq.queue import Queue
from rq.worker import SimpleWorker

import diagnosis.agent.graph  # noqa: F401  (import langgraph once, at start)
from diagnosis.maintenance import run_periodic_tasks


class AeroWorker(SimpleWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("maintenance_interval", settings.AERO_RECONCILE_SECONDS)
        # The maintenance check runs between dequeues, which block for worker_ttl - 15 s.
        kwargs.setdefault("worker_ttl", max(20, settings.AERO_RECONCILE_SECONDS + 15))
        super().__init__(*args, **kwargs)

    def execute_job(self, job: Job, queue: Queue) -> None:
        # Django closes stale or broken connections around each request; a worker has
        # no requests, so do it around each job (CONN_MAX_AGE keeps healthy ones).
        close_old_connections()
        try:
            super().execute_job(job, queue)
        finally:
            close_old_connections()

    def run_maintenance_tasks(self) -> None:
        super().run_maintenance_tasks()
        close_old_connections()
        try:
            run_periodic_tasks()  # re-enqueue stalled sessions, sweep approval timeouts
        finally:
            close_old_connections()
