"""A job's graph run on the job's own thread.

LangGraph's synchronous loop opens a thread pool per `invoke` and hands it its
checkpointer writes (with `durability="exit"`: the pending writes and the checkpoint, at
the run's exit) and a step's second and later tasks. A job waits for those writes
before its invoke returns anyway, and the saver serializes them on its one connection
(its lock), so the pool bought nothing but two new threads per job, their futures and
the switches between them: about 1 ms of a job's CPU. Inside `on_this_thread()` the
loop gets an executor that runs each submitted call at once, on the caller's thread, in
submission order (one of the orders the pool could have run them in). Our graphs' steps
run one task each (a step group's transaction lives on the job's connection), so no
step loses parallelism.

The loop takes its executor from `langchain_core`'s `get_executor_for_config`, imported
by name into `langgraph.pregel._executor`: that one name is wrapped (once, by
`install`), and outside the context it gives what it gave before."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("diagnosis.jobs")

_inline: contextvars.ContextVar[bool] = contextvars.ContextVar("aero_graph_inline", default=False)
_installed = False


class InlineExecutor(Executor):
    """Runs each call when it is submitted; its future is done when submit returns,
    with the call's result or its exception (as a pool's worker would set it)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # a pool's worker keeps any exception in the future
            future.set_exception(exc)
        else:
            future.set_result(result)
        return future


def install() -> bool:
    """Wrap LangGraph's executor factory (once per process). False when this LangGraph
    has no such name: its loop keeps its pool, nothing else changes."""
    global _installed
    if _installed:
        return True
    try:
        from langgraph.pregel import _executor
    except ImportError:
        return False
    original = getattr(_executor, "get_executor_for_config", None)
    if original is None:
        logger.warning("LangGraph's loop has no get_executor_for_config: jobs use its pool")
        return False

    @contextmanager
    def executor_for_config(config: Any) -> Iterator[Executor]:
        if _inline.get():
            yield InlineExecutor()
            return
        with original(config) as executor:
            yield executor

    _executor.get_executor_for_config = executor_for_config
    _installed = True
    return True


@contextmanager
def on_this_thread() -> Iterator[None]:
    """The graph runs invoked inside run their background work on this thread."""
    install()
    token = _inline.set(True)
    try:
        yield
    finally:
        _inline.reset(token)
