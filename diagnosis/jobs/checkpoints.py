"""The agent's compiled graph and its LangGraph checkpointer, once per process: a
saver on a long-lived connection of its own, its writes fenced by the job's lease like
the job's other writes; and the periodic sweeps that keep the checkpoint tables small
(the event log is the history)."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection

from aero.packs import UnknownDomain, default_kind, pack_for
from diagnosis import checkpoint_tables
from diagnosis.conn_health import psycopg_quiet
from diagnosis.events import (
    Fence,
    LeaseLost,
    StepsLost,
    active_fence,
)
from diagnosis.models import (
    SessionStatus,
)

if TYPE_CHECKING:  # LangGraph is imported where a saver is made: the sweeps run without it
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import BaseCheckpointSaver

logger = logging.getLogger("diagnosis.jobs")


class _AgentRuntime:
    """The compiled graph bound to a checkpointer on a long-lived connection. Both
    savers serialise their use of the connection with their own lock, so the embedded
    worker's threads share one runtime."""

    def __init__(self, key: str, conn: Any, saver: Any) -> None:
        self.key = key
        self.conn = conn
        self.saver = saver
        # Each domain pack's graph, compiled on first use with this one checkpointer.
        self.graphs: dict[str, Any] = {}
        self.pid = os.getpid()

    def graph(self, kind: str) -> Any:
        compiled = self.graphs.get(kind)
        if compiled is None:
            builder = pack_for(kind).graph
            if builder is None:
                raise UnknownDomain(f"the {kind} pack has no agent graph")
            compiled = self.graphs[kind] = builder().compile(checkpointer=self.saver)
        return compiled

    def healthy(self) -> bool:
        if self.pid != os.getpid():
            return False  # a forked child never uses its parent's socket
        try:
            if isinstance(self.conn, sqlite3.Connection):
                self.conn.execute("SELECT 1")
            else:
                if self.conn.closed or self.conn.broken:
                    return False
                # A quiet socket needs no round trip: a backend that ended
                # (PostgreSQL restarted) left its FATAL message or a hang-up on it.
                if not psycopg_quiet(self.conn):
                    self.conn.execute("SELECT 1")
        except Exception:
            return False
        return True

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            logger.debug("closing a dead checkpointer connection failed", exc_info=True)


_runtime: _AgentRuntime | None = None
_runtime_lock = threading.Lock()


def agent_graph(kind: str | None = None) -> Any:
    """The compiled agent graph of the scenario kind's pack (aero.packs; None: the first
    installed pack's) with the checkpointer every kind shares: built on first use in this
    process, rebuilt only if its connection died or the database changed."""
    global _runtime
    key = _checkpoint_key()
    kind = kind or default_kind()
    with _runtime_lock:
        if _runtime is not None and _runtime.key == key and _runtime.healthy():
            return _runtime.graph(kind)
        if _runtime is not None:
            _runtime.close()
        conn, saver = _postgres_saver() if connection.vendor == "postgresql" else _sqlite_saver()
        _runtime = _AgentRuntime(key, conn, saver)
        return _runtime.graph(kind)


def close_agent_runtime() -> None:
    """Close this process's checkpointer connection (tests dropping their database)."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
            _runtime = None


def _checkpoint_key() -> str:
    if connection.vendor == "postgresql":
        params = connection.settings_dict
        return f"pg:{params['HOST']}:{params['PORT']}:{params['NAME']}"
    return f"sqlite:{settings.AERO_CHECKPOINT_SQLITE}"


def _fenced_saver_class() -> type[Any]:
    """PostgresSaver whose writes are fenced like the job's other writes: in
    the write's own transaction it takes a share lock on the session row and checks the
    job's lease token, so a job paused past its lease cannot save a checkpoint over the
    one the job that took over saved (which would rewind the thread)."""
    from langgraph.checkpoint.base import CheckpointTuple
    from langgraph.checkpoint.postgres import PostgresSaver, _internal
    from psycopg.rows import dict_row

    class FencedPostgresSaver(PostgresSaver):
        # A job reads its thread's latest checkpoint twice in a row: `get_state` (what it
        # waits for, the answer it resumes with), then `invoke` (to run). The first read
        # is kept for the job (by its fence) and handed to the second, once:
        # only the lease holder writes its thread, and any write to the thread drops it.
        # Kept by a weak reference to the fence: what a job read and never asked for
        # again (a job that found nothing to do) goes with the job.
        kept: weakref.WeakKeyDictionary[Fence, dict[tuple[str, str], CheckpointTuple | None]]

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.kept = weakref.WeakKeyDictionary()
            self.kept_lock = threading.Lock()  # the embedded worker's job threads share it
            # A run's exit writes on this thread (`exit_writes`): whether they share one
            # transaction, and the transaction once the first of them opened it.
            self.exit = threading.local()

        def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
            fence = active_fence()
            configurable = config.get("configurable", {})
            if fence is None or configurable.get("checkpoint_id"):
                return super().get_tuple(config)
            key = (str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", "")))
            with self.kept_lock:
                reads = self.kept.setdefault(fence, {})
                if key in reads:
                    return reads.pop(key)
            found = super().get_tuple(config)
            with self.kept_lock:
                reads[key] = found
            return found

        def keep(self, config: RunnableConfig, found: CheckpointTuple | None) -> None:
            """Hand `found` (this job's read of the thread) to its next read, once: a
            caller that passed the kept read on to another reader first (the job's
            `first_state`) keeps it for the run."""
            fence = active_fence()
            if fence is None:
                return
            configurable = config.get("configurable", {})
            key = (str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", "")))
            with self.kept_lock:
                self.kept.setdefault(fence, {})[key] = found

        def _drop_kept(self, thread_id: Any) -> None:
            with self.kept_lock:
                for reads in list(self.kept.values()):
                    for key in [k for k in reads if k[0] == str(thread_id)]:
                        del reads[key]

        def put(self, config: RunnableConfig, *args: Any, **kwargs: Any) -> RunnableConfig:
            self._drop_kept(config["configurable"]["thread_id"])
            with self._may_hold(config):
                return super().put(config, *args, **kwargs)

        def put_writes(self, config: RunnableConfig, *args: Any, **kwargs: Any) -> None:
            self._drop_kept(config["configurable"]["thread_id"])
            with self._may_hold(config):
                super().put_writes(config, *args, **kwargs)

        @contextmanager
        def _may_hold(self, config: RunnableConfig) -> Iterator[None]:
            """Inside `exit_writes`, the write of the job's own graph (the top namespace,
            which with `durability="exit"` writes only at its run's exit) may hold its
            transaction for the next; a subgraph's, written while the run goes on, never
            does (it would hold the saver's lock and the session row through the steps)."""
            exit = self.exit
            top = not config["configurable"].get("checkpoint_ns")
            exit.may_hold = top and getattr(exit, "active", False)
            try:
                yield
            finally:
                exit.may_hold = False

        def delete_thread(self, thread_id: str) -> None:
            self._drop_kept(thread_id)
            super().delete_thread(thread_id)

        def prune(self, thread_ids: Sequence[str], **kwargs: Any) -> None:
            for thread_id in thread_ids:
                self._drop_kept(thread_id)
            super().prune(thread_ids, **kwargs)

        @contextmanager
        def exit_writes(self) -> Iterator[None]:
            """The fenced writes made inside the block on this thread (a job's graph run:
            at its exit, the checkpoint, then its pending writes) share one transaction
            and one check of the lease, committed when the block ends, as soon as any
            other use of the connection on this thread comes, or rolled back when one of
            them fails. A checkpoint and its pending writes are saved together or not at
            all; the job's CPU for a second transaction and lease check saved."""
            exit = self.exit
            exit.active, exit.held, exit.may_hold = True, None, False
            try:
                yield
            finally:
                exit.active = False
                self._end_held(None)

        def _end_held(self, exc: BaseException | None) -> None:
            """Commit the held exit transaction (`exc` None) or roll it back."""
            held, self.exit.held = getattr(self.exit, "held", None), None
            if held is not None:
                if exc is None:
                    held.close()
                else:
                    held.__exit__(type(exc), exc, exc.__traceback__)

        @contextmanager
        def _cursor(self, *, pipeline: bool = False) -> Iterator[Any]:
            fence = active_fence()
            if pipeline and fence is not None and fence.steps_lost:
                refused = StepsLost(f"session {fence.session_id}: checkpoint refused, steps lost")
                self._end_held(refused)
                raise refused
            hold = getattr(self.exit, "may_hold", False)
            if not pipeline or fence is None or not hold:
                self._end_held(None)  # another use of the connection: the held writes first
            if not pipeline or fence is None:
                with super()._cursor(pipeline=pipeline) as cur:
                    yield cur
                return
            if not hold:
                with ExitStack() as stack:
                    yield self._fenced_transaction(stack, fence)
                return
            if self.exit.held is None:
                stack = ExitStack()
                try:
                    cur = self._fenced_transaction(stack, fence)
                except BaseException as exc:
                    stack.__exit__(type(exc), exc, exc.__traceback__)
                    raise
                self.exit.held, self.exit.cur = stack, cur
            try:
                yield self.exit.cur
            except BaseException as exc:
                self._end_held(exc)
                raise

        def _fenced_transaction(self, stack: ExitStack, fence: Fence) -> Any:
            """The saver's lock, a transaction and a cursor on `stack`, the session row
            share-locked and the job's lease checked in it."""
            stack.enter_context(self.lock)
            conn = stack.enter_context(_internal.get_connection(self.conn))
            stack.enter_context(conn.transaction())
            cur = stack.enter_context(conn.cursor(binary=True, row_factory=dict_row))
            # Never wait long for the row: the connection's lock_timeout (set once
            # when it was opened) makes a stuck lock this write's error.
            cur.execute(
                "SELECT lease_token FROM diagnosis_session WHERE id = %s FOR SHARE",
                (fence.session_id,),
            )
            row = cur.fetchone()
            if row is None or row["lease_token"] != fence.token:
                raise LeaseLost(f"session {fence.session_id}: checkpoint write refused")
            return cur

    return FencedPostgresSaver


def exit_writes(saver: Any) -> AbstractContextManager[Any]:
    """The saver's one transaction for a run's exit writes (the fenced PostgreSQL
    saver's `exit_writes`); nothing for a saver without it (SQLite)."""
    held = getattr(saver, "exit_writes", None)
    return held() if held is not None else nullcontext()


def _postgres_saver() -> tuple[Any, BaseCheckpointSaver[Any]]:
    import psycopg
    from psycopg.rows import dict_row

    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "autocommit"):
        params.pop(key, None)
    # autocommit=True, or the saver silently saves nothing.
    conn = psycopg.connect(**params, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    saver = _fenced_saver_class()(conn)
    with conn.cursor() as cursor:
        # Workers starting together must not race the saver's migrations. Try, never
        # wait inside a statement: the migrations create indexes CONCURRENTLY, which
        # wait for every open transaction, a blocked pg_advisory_lock call included
        # (that was a deadlock when workers started together on a new database).
        while not _try_lock(cursor):
            time.sleep(0.1)
        try:
            # The owner creates the tables (db_roles): the app's role cannot create any.
            if not checkpoint_tables.current(conn):
                saver.setup()
        finally:
            cursor.execute("SELECT pg_advisory_unlock(7410001)")
        # For every statement of this connection from now on (not before: the setup's
        # CREATE INDEX CONCURRENTLY may wait longer), rather than a SET LOCAL in each
        # fenced write (two statements per job). Only this job's writes touch
        # its thread's rows, so a wait of 10 s is a stuck lock, never a queue.
        cursor.execute("SET lock_timeout = '10s'")
    return conn, saver


def _try_lock(cursor: Any) -> bool:
    row = cursor.execute("SELECT pg_try_advisory_lock(7410001) AS got").fetchone()
    return bool(row and row["got"])


def _refuse_if_steps_lost() -> None:
    fence = active_fence()
    if fence is not None and fence.steps_lost:
        raise StepsLost(f"session {fence.session_id}: checkpoint refused, steps lost")


def _sqlite_saver() -> tuple[Any, BaseCheckpointSaver[Any]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = settings.AERO_CHECKPOINT_SQLITE
    path.parent.mkdir(parents=True, exist_ok=True)

    class StepsFencedSqliteSaver(SqliteSaver):
        """Refuses the exit checkpoint of a run whose step group failed to commit, like
        the PostgreSQL saver's fence: a resume must redo those steps, not skip them."""

        def put(self, *args: Any, **kwargs: Any) -> Any:
            _refuse_if_steps_lost()
            return super().put(*args, **kwargs)

        def put_writes(self, *args: Any, **kwargs: Any) -> Any:
            _refuse_if_steps_lost()
            return super().put_writes(*args, **kwargs)

    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
    saver = StepsFencedSqliteSaver(conn)
    saver.setup()
    return conn, saver


def prune_checkpoints(saver: BaseCheckpointSaver[Any], thread_id: str) -> None:
    """Keep only the latest checkpoint of a waiting session (what the next job resumes
    from): the event log is the history, and older checkpoints only grow the tables."""
    prune = getattr(saver, "prune", None)
    if prune is None:
        return  # the SQLite saver keeps its history; it is a single-machine store
    try:
        prune([thread_id], strategy="keep_latest")
    except Exception:
        # A concurrent prune of the same thread: the next job's prune catches up.
        logger.warning("session %s: pruning its checkpoints failed", thread_id, exc_info=True)


# A waiting session is pruned once it has waited this long: one that an approver answers
# at once is resumed, not pruned, and its checkpoints go at a later wait or its end.
PRUNE_AFTER_SECONDS = 30
# Threads per pass: a backlog (after a burst) goes over a few passes.
PRUNE_BATCH = 100
# One sweeper at a time across the workers (a session-level advisory lock): two passes
# would prune the same threads.
_PRUNE_LOCK = 0x4145524F_0207  # "AERO" and a number
# When each checkpoint sweep last ran in this process, by name.
_last_sweeps: dict[str, float] = {}


def _checkpoint_sweep_due(name: str, every: float) -> bool:
    """Whether the periodic checkpoint sweep `name` runs now: on PostgreSQL (the SQLite
    saver keeps its history), at most once per `every` seconds per process (the
    reconciler's loop runs every few seconds), with the saver's tables created. Marks it
    run."""
    if connection.vendor != "postgresql":
        return False
    if time.monotonic() - _last_sweeps.get(name, -1e9) < every:
        return False
    _last_sweeps[name] = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('checkpoints') IS NOT NULL")
        return bool(cursor.fetchone()[0])


def prune_waiting_checkpoints(
    *, waited: float = PRUNE_AFTER_SECONDS, every: float = 60.0, batch: int = PRUNE_BATCH
) -> int:
    """Periodic (the maintenance loop, at most once per `every` seconds per process): keep
    only the latest checkpoint (what the next job resumes from) of each session that has
    waited for a person for `waited` seconds, holds no live lease and has more than one.
    Its model waits added one checkpoint each; the event log is the history.
    Not the job that stopped at the wait: a prune's statements would be on the path of
    every session behind it. Returns the threads pruned."""
    if not _checkpoint_sweep_due("prune-waiting", every):
        return 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_PRUNE_LOCK])
        if not cursor.fetchone()[0]:
            return 0  # another process's pass is under way
        try:
            cursor.execute(
                "SELECT s.id::text FROM diagnosis_session s"
                " WHERE s.status = %s AND s.updated_at < now() - make_interval(secs => %s)"
                " AND (s.lease_token IS NULL OR s.lease_expires_at < now())"
                " AND (SELECT count(*) FROM checkpoints c"
                "      WHERE c.thread_id = s.id::text AND c.checkpoint_ns = '') > 1"
                " ORDER BY s.updated_at LIMIT %s",
                [SessionStatus.WAITING_USER, waited, batch],
            )
            threads = [row[0] for row in cursor.fetchall()]
            saver = agent_graph().checkpointer
            for thread_id in threads:
                prune_checkpoints(saver, thread_id)
        finally:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_PRUNE_LOCK])
    return len(threads)


def delete_ended_checkpoints() -> int:
    """Periodic: delete the checkpoints of completed and canceled sessions (a canceled
    session's job may never run again to delete its own). Failed sessions keep theirs:
    a retry resumes from it. At most once a minute per process (the reconciler's loop
    runs every few seconds)."""
    if not _checkpoint_sweep_due("delete-ended", 60):
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT c.thread_id FROM checkpoints c JOIN diagnosis_session s"
            " ON s.id::text = c.thread_id WHERE s.status IN (%s, %s)",
            [SessionStatus.COMPLETED, SessionStatus.CANCELED],
        )
        threads = [row[0] for row in cursor.fetchall()]
    if threads:
        agent_graph().checkpointer.prune(threads, strategy="delete")
    return len(threads)
