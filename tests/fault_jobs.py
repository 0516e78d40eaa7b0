"""Jobs the fault tests enqueue into a real worker (imported by the worker process)."""

from __future__ import annotations

import contextlib
import time

import redis
from rq import get_current_job


def stop_redis_while_running() -> str:
    """Shut the worker's own Redis down mid-job: the worker is watching a job when Redis
    disappears, the case where rq's loop quits."""
    job = get_current_job()
    assert job is not None
    kwargs = job.connection.connection_pool.connection_kwargs
    client = redis.Redis(host=kwargs["host"], port=kwargs["port"])
    # The server closes the connection as it goes.
    with contextlib.suppress(redis.exceptions.ConnectionError):
        client.shutdown(nosave=True)
    time.sleep(0.5)
    return "stopped"
