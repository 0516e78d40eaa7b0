"""The embedded backend's worker: job threads in the web process, and a thread running
the periodic tasks (the reconciler among them) as an rq worker's maintenance loop does."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.db import connections

from diagnosis.jobs.job import advance_session
from diagnosis.maintenance import run_periodic_tasks

logger = logging.getLogger("diagnosis.jobs")


class EmbeddedWorker:
    """In-process job threads plus the periodic tasks (embedded mode)."""

    def __init__(self, workers: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="aero-job")
        self.waiting: set[str] = set()  # submitted, not started: never submitted twice
        self.lock = threading.Lock()
        self.reconciler = threading.Thread(
            target=self._reconcile_forever, daemon=True, name="aero-reconciler"
        )
        self.reconciler.start()

    def submit(self, session_id: Any) -> bool:
        with self.lock:
            if str(session_id) in self.waiting:
                return False
            self.waiting.add(str(session_id))
        self.pool.submit(self._run, str(session_id))
        return True

    def _run(self, session_id: str) -> None:
        with self.lock:
            self.waiting.discard(session_id)
        try:
            advance_session(session_id)
        except Exception:
            logger.exception("job for session %s crashed", session_id)
        finally:
            connections.close_all()

    def _reconcile_forever(self) -> None:
        while True:
            try:
                run_periodic_tasks()
            finally:
                connections.close_all()
            time.sleep(settings.AERO_RECONCILE_SECONDS)
