"""Periodic tasks run by every worker's maintenance loop and by the embedded worker.

Apps to the left of diagnosis register theirs here (approvals: the timeout sweeper), so
the workers that diagnosis owns run them without importing those apps."""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger("diagnosis.maintenance")

_TASKS: dict[str, Callable[[], object]] = {}


def register(name: str, task: Callable[[], object]) -> None:
    _TASKS[name] = task


def run_periodic_tasks() -> None:
    """Run every task; one failing task never stops the others."""
    for name, task in list(_TASKS.items()):
        try:
            task()
        except Exception:
            logger.exception("periodic task %s failed", name)
