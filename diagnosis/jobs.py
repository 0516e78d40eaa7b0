"""Background jobs. A job advances one session until the graph ends or interrupts, then
returns: it never waits for a human. One job at a time per session (a lease row in the
database); a decision or an answer enqueues another job that resumes the graph.

Backends: `embedded` (in-process worker threads), `rq` (django-rq workers on Redis) and
`inline` (run in the caller: the CLI). All run the same `advance_session`.
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import Q
from django.utils import timezone
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphRecursionError
from langgraph.types import Command

from aero import metrics
from diagnosis.agent.graph import SessionCanceled, build_graph
from diagnosis.agent.providers import configured_providers
from diagnosis.agent.state import AgentContext
from diagnosis.events import set_status, tracing
from diagnosis.maintenance import run_periodic_tasks
from diagnosis.models import AgentRun, Event, Session, SessionStatus, ToolCall, ToolCallStatus
from scenarios_admin.airport import load_active_graph

logger = logging.getLogger("diagnosis.jobs")
PRODUCER = "agent"
RECURSION_LIMIT = 200


# --- dispatch -------------------------------------------------------------------------


def enqueue_advance(session_id: Any) -> None:
    """Schedule a job for the session once the current transaction commits."""
    transaction.on_commit(lambda: dispatch(session_id))


def dispatch(session_id: Any) -> None:
    backend = settings.AERO_JOB_BACKEND
    if backend == "rq":
        import django_rq

        django_rq.get_queue(settings.AERO_QUEUE).enqueue(
            advance_session, str(session_id), job_timeout=600, result_ttl=300, failure_ttl=86400
        )
    elif backend == "embedded":
        embedded_worker().submit(session_id)
    else:
        advance_session(str(session_id))


class EmbeddedWorker:
    """In-process job threads plus the periodic tasks (embedded mode)."""

    def __init__(self, workers: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="aero-job")
        self.reconciler = threading.Thread(
            target=self._reconcile_forever, daemon=True, name="aero-reconciler"
        )
        self.reconciler.start()

    def submit(self, session_id: Any) -> None:
        self.pool.submit(self._run, str(session_id))

    @staticmethod
    def _run(session_id: str) -> None:
        try:
            advance_session(session_id)
        except Exception:
            logger.exception("job for session %s crashed", session_id)
        finally:
            connections.close_all()

    def _reconcile_forever(self) -> None:
        while True:
            try:
                run_periodic_tasks()
            finally:
                connections.close_all()
            time.sleep(settings.AERO_RECONCILE_SECONDS)


_embedded: EmbeddedWorker | None = None
_embedded_lock = threading.Lock()


def embedded_worker() -> EmbeddedWorker:
    global _embedded
    with _embedded_lock:
        if _embedded is None:
            _embedded = EmbeddedWorker(settings.AERO_EMBEDDED_WORKERS)
        return _embedded


def requeue_stalled_sessions() -> None:
    for session_id in stalled_sessions():
        logger.info("re-enqueueing stalled session %s", session_id)
        dispatch(session_id)


def stalled_sessions(grace_seconds: int = 60) -> list[str]:
    """Sessions that should be moving but hold no live lease (worker killed, Redis lost
    the job). Redis is never the source of truth: PostgreSQL says what must run."""
    now = timezone.now()
    rows = (
        Session.objects.visible()
        .filter(
            status__in=[SessionStatus.QUEUED, SessionStatus.RUNNING, SessionStatus.RETRYING],
            updated_at__lt=now - timedelta(seconds=grace_seconds),
        )
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
    )
    return [str(pk) for pk in rows.values_list("pk", flat=True)]


# --- lease ----------------------------------------------------------------------------


def acquire_lease(session_id: Any) -> uuid.UUID | None:
    token = uuid.uuid4()
    now = timezone.now()
    taken = (
        Session.objects.filter(pk=session_id)
        .filter(Q(lease_token__isnull=True) | Q(lease_expires_at__lt=now))
        .update(
            lease_token=token, lease_expires_at=now + timedelta(seconds=settings.AERO_LEASE_SECONDS)
        )
    )
    return token if taken else None


def renew_lease(session_id: Any, token: uuid.UUID) -> None:
    Session.objects.filter(pk=session_id, lease_token=token).update(
        lease_expires_at=timezone.now() + timedelta(seconds=settings.AERO_LEASE_SECONDS)
    )


def release_lease(session_id: Any, token: uuid.UUID) -> None:
    Session.objects.filter(pk=session_id, lease_token=token).update(
        lease_token=None, lease_expires_at=None
    )


# --- checkpointer ---------------------------------------------------------------------

_saver_ready: set[str] = set()


def checkpointer() -> AbstractContextManager[BaseCheckpointSaver[Any]]:
    """PostgreSQL saver in production, SQLite saver in embedded mode."""
    return _postgres_saver() if connection.vendor == "postgresql" else _sqlite_saver()


@contextmanager
def _postgres_saver() -> Iterator[BaseCheckpointSaver[Any]]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "autocommit"):
        params.pop(key, None)
    # autocommit=True, or the saver silently saves nothing.
    with psycopg.connect(
        **params, autocommit=True, prepare_threshold=0, row_factory=dict_row
    ) as conn:
        saver = PostgresSaver(conn)
        key = f"pg:{params.get('dbname')}"
        if key not in _saver_ready:
            with conn.cursor() as cursor:
                # Workers starting together must not race the saver's migrations.
                cursor.execute("SELECT pg_advisory_lock(7410001)")
                try:
                    saver.setup()
                finally:
                    cursor.execute("SELECT pg_advisory_unlock(7410001)")
            _saver_ready.add(key)
        yield saver


@contextmanager
def _sqlite_saver() -> Iterator[BaseCheckpointSaver[Any]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = settings.AERO_CHECKPOINT_SQLITE
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
    try:
        saver = SqliteSaver(conn)
        if str(path) not in _saver_ready:
            saver.setup()
            _saver_ready.add(str(path))
        yield saver
    finally:
        conn.close()


# --- the job --------------------------------------------------------------------------


@metrics.timed_job
def advance_session(session_id: str) -> str:
    """Advance the session as far as the inputs in the database allow. Idempotent: a
    duplicate or late job finds nothing to do. Returns the status it left."""
    while True:
        token = acquire_lease(session_id)
        if token is None:
            return "busy"  # another job holds it; it re-checks inputs before it lets go
        try:
            status = _advance_locked(session_id, token)
        finally:
            release_lease(session_id, token)
        # An answer or decision that arrived while we held the lease found us busy:
        # its job returned "busy", so this job takes the new input.
        if status != SessionStatus.WAITING_USER or not resumable(session_id):
            return status


def resumable(session_id: Any) -> bool:
    session = Session.objects.get(pk=session_id)
    if session.is_ended:
        return False
    with checkpointer() as saver:
        graph = build_graph().compile(checkpointer=saver)
        snapshot = graph.get_state(_config(session_id))
        return resume_value(session_id, snapshot) is not None


def _config(session_id: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": str(session_id)}, "recursion_limit": RECURSION_LIMIT}


def resume_value(session_id: Any, snapshot: Any) -> Any:
    """What to resume an interrupted graph with, or None while it must keep waiting."""
    if not snapshot.interrupts:
        return None
    waiting = snapshot.interrupts[0].value
    if waiting["kind"] == "question":
        consumed = snapshot.values.get("consumed_seq", 0)
        has_answer = Event.objects.filter(
            session_id=session_id, type="user.message", seq__gt=consumed
        ).exists()
        return {"answered": True} if has_answer else None
    if waiting["kind"] == "approval":
        decided = (
            ToolCall.objects.filter(pk__in=waiting["tool_calls"])
            .exclude(status=ToolCallStatus.AWAITING_APPROVAL)
            .exists()
        )
        return {"decided": True} if decided else None
    return None


def _advance_locked(session_id: str, token: uuid.UUID) -> str:
    session = Session.objects.select_related("scenario_version", "scenario").get(pk=session_id)
    if session.is_ended:
        return session.status
    with tracing(), checkpointer() as saver:
        graph = build_graph().compile(checkpointer=saver)
        config = _config(session_id)
        root = AgentRun.objects.create(
            session=session,
            agent_name="incident_agent",
            input_snapshot={
                "status": session.status,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "backend": settings.AERO_JOB_BACKEND,
            },
        )
        context = AgentContext(
            session_id=session.pk,
            definition=session.scenario_version.definition,
            graph=load_active_graph(),
            providers=configured_providers(),
            root_run=root,
            producer=PRODUCER,
        )
        outcome = _drive(session, graph, config, context, token)
        AgentRun.objects.filter(pk=root.pk).update(
            status="completed" if outcome != SessionStatus.FAILED else "failed",
            ended_at=timezone.now(),
            output_summary={"status": outcome},
        )
        if outcome == SessionStatus.COMPLETED:
            saver.delete_thread(str(session_id))  # the event log is the history
        return outcome


def _drive(
    session: Session, graph: Any, config: RunnableConfig, context: AgentContext, token: uuid.UUID
) -> str:
    attempts = 0
    while True:
        snapshot = graph.get_state(config)
        if not snapshot.values:
            graph_input: Any = {
                "session_id": str(session.pk),
                "language": session.language,
                "consumed_seq": 0,
                "fsm": context.definition["compliance"]["states"][0],
            }
        elif snapshot.interrupts:
            value = resume_value(session.pk, snapshot)
            if value is None:
                set_status(session.pk, SessionStatus.WAITING_USER, producer=PRODUCER, strict=False)
                return SessionStatus.WAITING_USER
            graph_input = Command(resume=value)
        elif snapshot.next:
            graph_input = None  # a crashed run: continue from the last checkpoint
        else:
            set_status(session.pk, SessionStatus.COMPLETED, producer=PRODUCER, strict=False)
            return SessionStatus.COMPLETED
        set_status(session.pk, SessionStatus.RUNNING, producer=PRODUCER, strict=False)
        renew_lease(session.pk, token)
        try:
            graph.invoke(graph_input, config, context=context, durability="sync")
        except SessionCanceled:
            return SessionStatus.CANCELED
        except GraphRecursionError as exc:
            _fail(session.pk, f"the agent made no progress: {exc}")
            return SessionStatus.FAILED
        except Exception as exc:
            attempts += 1
            reason = f"{type(exc).__name__}: {exc}"
            logger.exception("session %s: agent step failed (attempt %s)", session.pk, attempts)
            if attempts >= settings.AERO_JOB_ATTEMPTS:
                _fail(session.pk, reason)
                return SessionStatus.FAILED
            set_status(
                session.pk, SessionStatus.RETRYING, producer=PRODUCER, reason=reason, strict=False
            )
            # Linear backoff, then resume from the last checkpoint.
            time.sleep(min(4.0, settings.AERO_JOB_BACKOFF * attempts))


def _fail(session_id: Any, reason: str) -> None:
    set_status(session_id, SessionStatus.FAILED, producer=PRODUCER, reason=reason, strict=False)
