"""Database calls from async code (the consumers, the sockets' sign-in lookup): on a
bounded pool of threads, each call's connection given back after it (to the process's
connection pool, or closed with the pool off: CONN_MAX_AGE 0 under daphne,
aero/settings.py). Channels' default runs every such call on one
thread (thread-sensitive), so one slow render delayed every other viewer's pull and
sign-in behind it; here AERO_ASGI_DB_THREADS run at once, and that number bounds the
process's connections."""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connections

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def executor() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                max_workers=settings.AERO_ASGI_DB_THREADS, thread_name_prefix="aero-db"
            )
        return _executor


def db_call[**P, R](func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`await db_call(func)(*args)`: not thread-sensitive, on the bounded pool, and the
    thread's connection closed after the call whatever CONN_MAX_AGE says (a pool thread
    idles between calls: a connection kept there would idle with it)."""

    @functools.wraps(func)
    def closing(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        finally:
            connections.close_all()

    return database_sync_to_async(closing, thread_sensitive=False, executor=executor())
