"""A worker asked to stop (SIGTERM) finishes the graph step it is in and starts no other:
the job lets its lease go and the session's next job, on any worker, resumes from the
step's checkpoint."""

from __future__ import annotations

import threading

_stopping = threading.Event()


class WorkerStopping(Exception):
    """Raised at a step's start once the worker is stopping: nothing of the step ran."""


def request_stop() -> None:
    _stopping.set()


def stopping() -> bool:
    return _stopping.is_set()


def reset() -> None:
    """For tests: a process that stopped once may run again."""
    _stopping.clear()
