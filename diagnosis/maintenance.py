"""Periodic tasks run by every worker's maintenance loop and by the embedded worker.

Apps to the left of diagnosis register theirs here (approvals: the timeout sweeper), so
the workers that diagnosis owns run them without importing those apps. Tasks registered
with `web=True` also run in each web process (start_web_ticker), so they happen with
every worker down."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from django.conf import settings
from django.db import connections

logger = logging.getLogger("diagnosis.maintenance")

_TASKS: dict[str, Callable[[], object]] = {}
_WEB_TASKS: set[str] = set()


def register(name: str, task: Callable[[], object], *, web: bool = False) -> None:
    _TASKS[name] = task
    if web:
        _WEB_TASKS.add(name)


def run_periodic_tasks(*, web_only: bool = False) -> None:
    """Run every task (or only the web process's); one failing task never stops the
    others."""
    for name, task in list(_TASKS.items()):
        if web_only and name not in _WEB_TASKS:
            continue
        try:
            task()
        except Exception:
            logger.exception("periodic task %s failed", name)


class _WebTicker:
    """A daemon thread per web process. Created after the fork (gunicorn imports the WSGI
    module in each worker; a thread does not survive a fork), so the owner pid is kept:
    a forked child starts its own."""

    def __init__(self, interval: float) -> None:
        self.pid = os.getpid()
        self.interval = interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="aero-web-ticker")
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                run_periodic_tasks(web_only=True)
            finally:
                connections.close_all()  # this thread's own connection: no idle one kept


_ticker: _WebTicker | None = None
_ticker_lock = threading.Lock()


def start_web_ticker() -> bool:
    """Start this process's web ticker once (AERO_WEB_TICK_SECONDS; 0 turns it off).
    Returns whether one runs now."""
    global _ticker
    interval = settings.AERO_WEB_TICK_SECONDS
    if interval <= 0:
        return False
    with _ticker_lock:
        if _ticker is None or _ticker.pid != os.getpid():
            _ticker = _WebTicker(interval)
    return True


def stop_web_ticker() -> None:
    global _ticker
    with _ticker_lock:
        if _ticker is not None:
            _ticker.stop.set()
            _ticker.thread.join(timeout=5)
            _ticker = None
