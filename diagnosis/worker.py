"""The django-rq worker AERO runs: langgraph imported in the parent before it forks
(~17 ms per job instead of ~0.7 s), and the reconciler in the worker's maintenance loop."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connections
from rq.worker import Worker

import diagnosis.agent.graph  # noqa: F401  (pre-import langgraph before forking)
from diagnosis.maintenance import run_periodic_tasks


class AeroWorker(Worker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("maintenance_interval", settings.AERO_RECONCILE_SECONDS)
        # The maintenance check runs between dequeues, which block for worker_ttl - 15 s.
        kwargs.setdefault("worker_ttl", max(20, settings.AERO_RECONCILE_SECONDS + 15))
        super().__init__(*args, **kwargs)

    def run_maintenance_tasks(self) -> None:
        super().run_maintenance_tasks()
        try:
            run_periodic_tasks()  # re-enqueue stalled sessions, sweep approval timeouts
        finally:
            # Forked job processes must not share the parent's database sockets.
            connections.close_all()
