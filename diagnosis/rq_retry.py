"""Run an RQ worker through Redis outages.

rq's work loop quits when Redis goes away while it watches a job ("found an unhandled
exception, quitting"), and its teardown then raises too. Here the worker process lives
on: it waits for Redis with a backoff (1 s doubling to 30 s, every wait logged), then
starts a fresh worker on the same queues. Redis refusing writes (at `maxmemory` with
`noeviction`, or a read-only replica) is an outage too: rq's first write (the worker's
registration) raised, unhandled, and the process exited; it waits the same way until a
write goes through. Nothing is lost meanwhile: the session state is
in PostgreSQL, and the reconciler re-enqueues whatever Redis forgot. A stop request
(SIGTERM, SIGINT) during the wait ends the process, as it would have. A worker with a
`waiting_for_redis()` context (AeroWorker) is inside it while it waits: it keeps its
PostgreSQL heartbeat."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

import redis
from rq.worker import BaseWorker

logger = logging.getLogger("diagnosis.worker")

MAX_BACKOFF = 30.0
REDIS_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    # Redis answers but refuses writes: full (noeviction) or a replica.
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
)
# Written (and expiring) to tell that Redis takes writes again: a ping answers even when
# every write is refused.
WRITE_PROBE_KEY = "aero:rq-retry:write-probe"


def work_through_outages(
    make_worker: Callable[[], BaseWorker],
    *,
    burst: bool = False,
    stopping: threading.Event | None = None,
    max_backoff: float = MAX_BACKOFF,
) -> int:
    """Run `make_worker().work()` until it stops on request (or, with `burst`, empties
    the queue); after a Redis outage, wait for Redis and start a new worker. Returns how
    many times it restarted."""
    stopping = stopping or threading.Event()
    restarts = 0
    while not stopping.is_set():
        worker = make_worker()
        try:
            worker.work(burst=burst)
        except REDIS_ERRORS as exc:  # the teardown's own Redis calls failed too
            logger.warning(
                "worker %s: Redis is unreachable or refuses writes (%s)", worker.name, exc
            )
        if burst or _stop_was_requested(worker):
            return restarts
        _stop_on_signals(stopping)
        waiting = getattr(worker, "waiting_for_redis", None)
        with waiting() if waiting is not None else contextlib.nullcontext():
            if not _wait_for_redis(worker.connection, stopping, max_backoff):
                return restarts
        restarts += 1
        logger.warning("Redis answers again: starting a new worker (restart %d)", restarts)
    return restarts


def _stop_was_requested(worker: BaseWorker) -> bool:
    """rq notes the time of a SIGTERM/SIGINT (an idle worker stops without setting its
    `_stop_requested` flag): work() returned because it was asked to."""
    return bool(
        getattr(worker, "_stop_requested", False)
        or getattr(worker, "_shutdown_requested_date", None)
    )


def _stop_on_signals(stopping: threading.Event) -> None:
    """rq's handlers belong to the worker that quit: a stop request while we wait for
    Redis sets the event instead."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be installed from the main thread

    def stop(signum: int, frame: Any) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def _wait_for_redis(connection: Any, stopping: threading.Event, max_backoff: float) -> bool:
    """Try a write until Redis takes it (True) or a stop is requested (False)."""
    delay = 1.0
    while True:
        try:
            connection.set(WRITE_PROBE_KEY, "1", ex=60)
            return True
        except REDIS_ERRORS as exc:
            logger.warning(
                "Redis is unreachable or refuses writes (%s: %s): trying again in %g s",
                type(exc).__name__,
                exc,
                delay,
            )
        if stopping.wait(delay):
            return False
        delay = min(delay * 2, max_backoff)
