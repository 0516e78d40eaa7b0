"""Database calls from async code (the consumers, the sockets' sign-in lookup): on a
bounded pool of threads, each call's connection given back after it (to the process's
connection pool, or closed with the pool off: CONN_MAX_AGE 0 under daphne,
aero/settings.py). Channels' default runs every such call on one
thread (thread-sensitive), so one slow render delayed every other viewer's pull and
sign-in behind it; here AERO_ASGI_DB_THREADS run at once, and that number bounds the
process's connections."""

from __future__ import annotations

import asyncio
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


class _Waiting[K, V]:
    """One event loop's keys asked and not yet looked up, and the task looking up."""

    def __init__(self) -> None:
        self.keys: dict[K, list[asyncio.Future[V]]] = {}
        self.task: asyncio.Task[None] | None = None


class Batched[K, V]:
    """`await lookup(key)`: `func(keys)` (a dict of what it found) run on the pool once
    for every key asked while the previous call ran, `missing` for a key it left out.
    A burst of sockets opening at once then costs a few database calls, not one each:
    one call per socket queued them all on the pool, and every other database call of
    the process (a render, a role check) waited behind the whole burst."""

    def __init__(self, func: Callable[[list[K]], dict[K, V]], missing: V) -> None:
        self.func = func
        self.missing = missing
        self.loops: dict[asyncio.AbstractEventLoop, _Waiting[K, V]] = {}

    async def __call__(self, key: K) -> V:
        loop = asyncio.get_running_loop()
        waiting = self.loops.get(loop)
        if waiting is None:
            for stale in [known for known in self.loops if known.is_closed()]:
                del self.loops[stale]
            waiting = self.loops[loop] = _Waiting()
        future: asyncio.Future[V] = loop.create_future()
        waiting.keys.setdefault(key, []).append(future)
        if waiting.task is None:
            waiting.task = asyncio.ensure_future(self._look_up(waiting))
        return await future

    async def _look_up(self, waiting: _Waiting[K, V]) -> None:
        try:
            await asyncio.sleep(0)  # the others opening in this loop turn join in
            while waiting.keys:
                batch, waiting.keys = waiting.keys, {}
                try:
                    found = await db_call(self.func)(list(batch))
                except Exception as exc:
                    for futures in batch.values():
                        for future in futures:
                            if not future.done():
                                future.set_exception(exc)
                    continue
                for key, futures in batch.items():
                    for future in futures:
                        if not future.done():
                            future.set_result(found.get(key, self.missing))
        finally:
            waiting.task = None
