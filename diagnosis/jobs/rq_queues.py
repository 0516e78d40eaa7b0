"""rq's side of AERO's jobs: the queues (one client per process) and deleting a job that
can no longer run. Used by the session's dispatch and by child agents' jobs alike."""

from __future__ import annotations

import logging
import os
from typing import Any

from django.conf import settings

logger = logging.getLogger("diagnosis.jobs")


def drop_job(job: Any) -> None:
    """Delete a job that can no longer run. rq's delete() reads every execution the
    job's registry lists and raises when one's record is gone: when two reconcilers
    drop the same dead job at once (the second reads a record the first just deleted;
    seen in the fault suite's worker logs), and for a minute after a killed worker's
    execution record expires (it lives 90 s, its registry entry 60 s longer, rq 3.0).
    The entries whose record is gone are removed first, then rq's delete does the
    rest."""
    from rq.executions import Execution

    try:
        job.delete()
        return
    except ValueError:
        pass
    redis = job.connection
    registry = job.execution_registry
    for raw in redis.zrange(registry.key, 0, -1):
        execution = Execution(id=raw.decode(), job_id=job.id, connection=redis)
        if not redis.exists(execution.key):
            redis.zrem(registry.key, execution.id)
            redis.zrem(job.started_job_registry.key, execution.composite_key)
    logger.warning("job %s: dropped the records of executions that had expired", job.id)
    job.delete()


_queues: dict[tuple[int, str, str], Any] = {}


def queue_named(name: str) -> Any:
    """The rq queue, one per process and connection settings: django_rq.get_queue builds
    a new Redis client (a new connection) per call, and the LLM runner enqueues a session
    at every reply (a third of its CPU for enqueues was connecting). redis-py's
    pool is thread-safe and reconnects after an outage."""
    import django_rq

    key = (os.getpid(), name, repr(sorted(settings.RQ_QUEUES.get(name, {}).items())))
    queue = _queues.get(key)
    if queue is None:
        queue = _queues[key] = django_rq.get_queue(name)
    return queue
