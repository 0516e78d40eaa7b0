"""Background jobs. A job advances one session until the graph ends or interrupts, then
returns: it never waits for a human. One job at a time per session (a lease row in the
database, renewed by the job's heartbeat and fencing every write the job makes, ADR 100);
a decision or an answer enqueues another job that resumes the graph.

Backends: `embedded` (in-process worker threads), `rq` (django-rq workers on Redis) and
`inline` (run in the caller: the CLI). All run the same `advance_session`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, connections, transaction
from django.db.models import Exists, Q
from django.db.models.sql import UpdateQuery
from django.utils import timezone
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphRecursionError
from langgraph.types import Command

from aero import metrics
from aero.compiled import Arg, Compiled, Statement, cached_sql, insert_values, slot
from diagnosis import checkpoint_tables, shutdown
from diagnosis.agent import waits
from diagnosis.agent.graph import build_graph
from diagnosis.agent.providers import (
    OfflineProvider,
    Provider,
    call_with_fallback,
    configured_providers,
    warm_up,
)
from diagnosis.agent.recording import SessionCanceled, step_group
from diagnosis.agent.state import AgentContext
from diagnosis.conn_health import psycopg_quiet
from diagnosis.events import (
    Fence,
    LeaseLost,
    StepsLost,
    active_fence,
    check_fence,
    current_fence,
    fenced,
    known_keys,
    lock_session,
    set_status,
    tracing,
    unfenced,
)
from diagnosis.maintenance import run_periodic_tasks
from diagnosis.models import (
    ENDED_STATUSES,
    AgentRun,
    Event,
    LLMRequest,
    LLMRequestStatus,
    Session,
    SessionStatus,
    ToolCall,
    ToolCallStatus,
)
from scenarios_admin.airport import load_active_graph
from scenarios_admin.models import ProviderConfig, ScenarioVersion, Topology

logger = logging.getLogger("diagnosis.jobs")
PRODUCER = "agent"
RECURSION_LIMIT = 200
# What a job returns when the session waits for the model (ADR 95): the session stays
# "running" (the agent is thinking) and holds no lease; the runner enqueues it.
WAITING_MODEL = "waiting_model"


# --- dispatch -------------------------------------------------------------------------


def enqueue_advance(session_id: Any) -> None:
    """Schedule a job for the session once the current transaction commits."""
    transaction.on_commit(lambda: dispatch_after_commit(session_id))


def dispatch_after_commit(session_id: Any, *, lease_read: bool = False) -> bool:
    """dispatch(), for a change that has already committed: a broken queue (Redis down,
    say) is logged and left to the reconciler, which re-enqueues every session that
    should move and has no job. Raising here would answer 500 for something that was
    saved, and a user who retries creates a duplicate (ADR 111). The inline backend
    (tests, the CLI) runs the job itself here, so its failures still surface.
    `lease_read`: see dispatch."""
    if settings.AERO_JOB_BACKEND == "inline":
        return dispatch(session_id, lease_read=lease_read)
    try:
        return dispatch(session_id, lease_read=lease_read)
    except Exception as exc:
        metrics.enqueue_failed()
        logger.warning(
            "session %s: enqueue failed (%s: %s); committed, the reconciler will enqueue it",
            session_id,
            type(exc).__name__,
            exc,
        )
        return False


def job_id(session_id: Any) -> str:
    """A session's job has this fixed id: a second enqueue finds the first."""
    return f"aero-advance-{session_id}"


# rq statuses of a job that will still run from the start (so it sees every input
# committed before it starts).
_WAITING = ("queued", "deferred", "scheduled")


def dispatch(session_id: Any, *, at_front: bool = False, lease_read: bool = False) -> bool:
    """Run or enqueue the session's job unless one is already waiting or running.
    Returns whether a job was enqueued (or run, inline). `at_front`: ahead of the jobs
    waiting in the queue (a session whose job was lost has waited already): the rq
    backend puts it in the priority queue, behind only the sessions re-enqueued before
    it (ADR 119).

    Never twice: a job waiting in the queue will see this input when it starts; a job
    holding the session's lease re-checks the inputs after it lets the lease go
    (advance_session), so an input committed before we read the lease is never missed.
    A lease is read after the caller's commit (dispatch runs on commit). `lease_read`:
    the caller read it instead, under the session's row lock in the transaction that
    committed the input, and found none live (the LLM runner, ADR 167): a job that took
    the lease since started after that commit."""
    session_id = str(session_id)
    backend = settings.AERO_JOB_BACKEND
    if backend == "inline":
        # Inline (the CLI, tests): the model calls a job waits for are made right here,
        # then the job runs again, until the session waits for something else.
        while advance_session(session_id) == WAITING_MODEL:
            from diagnosis.llm_runner import run_pending_inline

            if not run_pending_inline(session_id):
                break
        return True
    if not lease_read and lease_is_live(session_id):
        return False
    if backend == "rq":
        return _enqueue_rq(session_id, at_front=at_front)
    return embedded_worker().submit(session_id)


def lease_is_live(session_id: Any) -> bool:
    return Session.objects.filter(
        pk=session_id, lease_token__isnull=False, lease_expires_at__gt=timezone.now()
    ).exists()


def _enqueue_rq(session_id: str, *, at_front: bool = False) -> bool:
    """Enqueue under the fixed id, atomically (rq's unique enqueue: two decisions
    committing together push one job). An old job under that id is replaced only once
    it can no longer run: finished or failed, or started by a worker whose lease expired
    (it crashed). A job that is started but holds no lease is just starting (it will see
    this input) or just finishing (it may not): wait a moment to tell which."""
    from rq.exceptions import DuplicateJobError, NoSuchJobError
    from rq.job import Job

    # Re-enqueued after its job was lost: the priority queue, in order. Pushed at the
    # front of the one queue, a session re-enqueued later went first (last in, first
    # out): one killed over and over kept jumping ahead of one lost a minute before
    # (ADR 119).
    queue = _queue(settings.AERO_PRIORITY_QUEUE if at_front else settings.AERO_QUEUE)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            queue.enqueue(
                advance_session,
                session_id,
                job_id=job_id(session_id),
                unique=True,
                job_timeout=600,
                # Kept finished, not deleted at once (result_ttl=0): rq deletes such a job
                # in its success pipeline while the worker still has steps of its own to
                # run on that id, and the next enqueue under the same fixed id (the
                # runner's, at its reply) then let a second worker start it meanwhile
                # (ADR 166). The next enqueue deletes a finished job itself (below).
                result_ttl=300,
                failure_ttl=86400,
            )
            return True
        except DuplicateJobError:
            pass
        try:
            job = Job.fetch(job_id(session_id), connection=queue.connection)
        except NoSuchJobError:
            continue  # expired or deleted meanwhile: enqueue again
        status = job.get_status()
        if status == "queued" and not _in_a_queue(queue.connection, job.id):
            # Popped by a worker: a live one marks it started within milliseconds; one
            # killed before it started the job leaves it "queued" forever: lost.
            time.sleep(0.05)
            if job.get_status() == "queued":
                drop_job(job)
                continue
            status = job.get_status()
        if status in _WAITING:
            return False
        if status == "started":
            lease = Session.objects.filter(pk=session_id).values_list(
                "lease_token", "lease_expires_at"
            )
            token, expires = lease.first() or (None, None)
            if token is not None and expires is not None and expires > timezone.now():
                return False  # the holder re-checks the inputs before it lets go
            if token is None and not _worker_gone(job.worker_name):
                time.sleep(0.02)
                continue
        drop_job(job)  # it can no longer run: the id is free for the next job
    logger.warning("session %s: its job stayed busy; the reconciler will enqueue it", session_id)
    return False


def drop_job(job: Any) -> None:
    """Delete a job that can no longer run. rq's delete() reads every execution the
    job's registry lists and raises when one's record is gone: when two reconcilers
    drop the same dead job at once (the second reads a record the first just deleted;
    seen in the fault suite's worker logs), and for a minute after a killed worker's
    execution record expires (it lives 90 s, its registry entry 60 s longer, rq 3.0).
    The entries whose record is gone are removed first, then rq's delete does the
    rest (ADR 194)."""
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


def _queue(name: str) -> Any:
    """The rq queue, one per process and connection settings: django_rq.get_queue builds
    a new Redis client (a new connection) per call, and the LLM runner enqueues a session
    at every reply (a third of its CPU for enqueues was connecting; ADR 160). redis-py's
    pool is thread-safe and reconnects after an outage."""
    import django_rq

    key = (os.getpid(), name, repr(sorted(settings.RQ_QUEUES.get(name, {}).items())))
    queue = _queues.get(key)
    if queue is None:
        queue = _queues[key] = django_rq.get_queue(name)
    return queue


def _in_a_queue(redis: Any, name: str) -> bool:
    """Whether the job id is in one of AERO's rq queues (or rq's list of jobs being
    dequeued): a "queued" job that is in none was taken by a worker killed before it
    started the job, and nothing would ever run it."""
    import django_rq

    for queue_name in (settings.AERO_PRIORITY_QUEUE, settings.AERO_QUEUE):
        queue = django_rq.get_queue(queue_name)
        for key in (queue.key, queue.intermediate_queue_key):
            if redis.lpos(key, name) is not None:
                return True
    return False


def _worker_gone(worker_name: str | None) -> bool:
    """Whether the rq worker that started a job is a process gone from this host (its
    name is aero-<host>-<pid>-<hex>, diagnosis.worker): killed after it dequeued the job
    and before it took the lease, it left the job "started" with no lease, which reads
    as a job just starting, and the session would wait for rq to clean its registry
    (the job's 600 s timeout). Other hosts' workers and other names read as alive."""
    prefix = f"aero-{socket.gethostname()}-"
    if not worker_name or not worker_name.startswith(prefix):
        return False
    pid = worker_name.removeprefix(prefix).split("-", 1)[0]
    return pid.isdigit() and int(pid) != os.getpid() and _process_gone(int(pid))


def queued_job_ids() -> set[str]:
    """The sessions whose job waits in the queue (rq backend), one Redis call."""
    if settings.AERO_JOB_BACKEND != "rq":
        return set(embedded_worker().waiting) if settings.AERO_JOB_BACKEND == "embedded" else set()
    import django_rq

    prefix = job_id("")
    return {
        name.removeprefix(prefix)
        for queue in (settings.AERO_PRIORITY_QUEUE, settings.AERO_QUEUE)
        for name in django_rq.get_queue(queue).get_job_ids()
        if name.startswith(prefix)
    }


class EmbeddedWorker:
    """In-process job threads plus the periodic tasks (embedded mode)."""

    def __init__(self, workers: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="aero-job")
        self.waiting: set[str] = set()  # submitted, not started: never submitted twice
        self.lock = threading.Lock()
        self.reconciler = threading.Thread(
            target=self._reconcile_forever, daemon=True, name="aero-reconciler"
        )
        self.reconciler.start()
        if settings.AERO_LLM_WAITS:
            # Embedded mode: the LLM runner is an event loop on a thread of this process.
            from diagnosis.llm_runner import start_in_thread

            start_in_thread()

    def submit(self, session_id: Any) -> bool:
        with self.lock:
            if str(session_id) in self.waiting:
                return False
            self.waiting.add(str(session_id))
        self.pool.submit(self._run, str(session_id))
        return True

    def _run(self, session_id: str) -> None:
        with self.lock:
            self.waiting.discard(session_id)
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


def requeue_stalled_sessions() -> int:
    """Re-enqueue the sessions that should be moving but have no job waiting and no live
    lease. Every worker runs this; the fixed job id makes concurrent passes harmless."""
    release_dead_holders()
    candidates = stalled_sessions()
    if not candidates:
        return 0
    waiting = queued_job_ids()
    enqueued = 0
    for session_id in candidates:
        if session_id in waiting:
            continue  # its job is in the queue, behind others: not stalled, just late
        # At the front: its job was lost (a killed worker, Redis restarted) after it had
        # waited its turn once; behind a long queue it waited minutes more (ADR 109).
        try:
            moved = dispatch(session_id, at_front=True)
        except Exception:
            # Whatever went wrong with this session's job (or its row) this pass, the
            # next pass tries again, and the sessions after it in this pass are not held
            # up: one session's error used to end the pass for all of them.
            logger.exception("session %s: re-enqueue failed; the next pass retries", session_id)
            continue
        if moved:
            logger.info("re-enqueued stalled session %s", session_id)
            enqueued += 1
    return enqueued


def _process_gone(pid: int) -> bool:
    """Whether no process `pid` runs on this host (a zombie counts as gone: killed and
    not yet reaped by its parent). Unsure (not ours to signal) reads as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def lease_holder() -> str:
    """This process, as a lease records its holder: "host:pid"."""
    return f"{socket.gethostname()}:{os.getpid()}"


def release_dead_holders() -> int:
    """Let go now of the leases held by a job whose worker process is gone from this host
    (kill -9, the OOM killer), instead of waiting for them to run out: the reconciler
    pass that follows re-enqueues those sessions at once (ADR 109). The holder is read
    from the session row, written by the same UPDATE that took the lease (ADR 117): a
    job killed right after taking it (before its run row existed, while a fresh worker
    was still building its graph) was invisible here and its session waited out the
    whole lease. Only the exact lease the dead process took is expired (by its token),
    so a lease another worker has taken since is never touched; a pid reused by a live
    process reads as alive, and then the lease runs out as before. Other hosts'
    processes cannot be checked: their leases run out."""
    host = socket.gethostname()
    now = timezone.now()
    leases = Session.objects.filter(
        lease_token__isnull=False, lease_expires_at__gt=now, lease_holder__startswith=f"{host}:"
    ).values_list("pk", "lease_token", "lease_holder")
    released = 0
    for session_id, token, holder in leases:
        pid = _holder_pid(holder, host)
        if pid is None or pid == os.getpid() or not _process_gone(pid):
            continue
        if Session.objects.filter(
            pk=session_id, lease_token=token, lease_expires_at__gt=now
        ).update(lease_expires_at=now):
            logger.warning(
                "session %s: its worker (pid %s) is gone, lease released", session_id, pid
            )
            released += 1
    return released


def _holder_pid(holder: str, host: str) -> int | None:
    """The pid in a "host:pid" holder on this host, else None."""
    name, _, pid = holder.rpartition(":")
    return int(pid) if name == host and pid.isdigit() else None


def stalled_sessions() -> list[str]:
    """Sessions that should be moving but hold no live lease (worker killed, Redis lost
    the job). Redis is never the source of truth: PostgreSQL says what must run. No
    grace period: a running job's heartbeat keeps its lease live, and the caller skips
    sessions whose job waits in the queue (ADR 101)."""
    now = timezone.now()
    rows = (
        Session.objects.visible()
        .filter(status__in=[SessionStatus.QUEUED, SessionStatus.RUNNING, SessionStatus.RETRYING])
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
        # Waiting for the model: the runner enqueues it when the reply is stored.
        .exclude(llm_requests__status=LLMRequestStatus.PENDING)
    )
    return [str(pk) for pk in rows.values_list("pk", flat=True)]


# --- lease ----------------------------------------------------------------------------


# The lease's token and the session row as taking it left it.
Leased = tuple[uuid.UUID, Session]
# The agent a job's root run is named for.
ROOT_AGENT = "incident_agent"


def root_snapshot(token: uuid.UUID | None = None) -> dict[str, Any]:
    """What a job's root run records of the process running it (and the status it found,
    added by the caller)."""
    snapshot = {"pid": os.getpid(), "host": socket.gethostname()}
    snapshot["backend"] = settings.AERO_JOB_BACKEND
    if token is not None:
        # Which lease this run holds (the session row names its holder too).
        snapshot["lease"] = str(token)
    return snapshot


def acquire_lease(session_id: Any) -> uuid.UUID | None:
    taken = take_lease(session_id)
    return taken[0] if taken is not None else None


def take_lease(session_id: Any, *, root: dict[str, Any] | None = None) -> Leased | None:
    """The lease and the session row as the lease left it, in one statement (UPDATE ...
    RETURNING, ADR 156): the job reads nothing else of the row to start. `root`: the
    input snapshot of the job's root run, inserted by the same statement (PostgreSQL),
    with the active topology's stamp read there too (ADR 178): the row then carries
    `root_id` (None for an ended session: no run) and `topology_stamp`. Both statements
    are compiled once per connection (ADR 179)."""
    token = uuid.uuid4()
    now = timezone.now()
    values = (session_id, now, token, now + timedelta(seconds=settings.AERO_LEASE_SECONDS))
    if root is None or connection.vendor != "postgresql":
        rows, _ = _lease.run(*values, lease_holder())
        return (token, _session_row.from_row(rows[0], connections["default"])) if rows else None
    snapshot = json.dumps({**root, "lease": str(token)})
    rows, _ = _lease_and_root.run(*values, lease_holder(), timezone.now(), snapshot)
    if not rows:
        return None
    row = rows[0]
    leased = _session_row.from_row(row, connections["default"])
    # The statement's extra columns, after the session's.
    root_id, topology_id, topology_updated_at, providers_stamp = row[-4:]
    leased.root_id = root_id  # type: ignore[attr-defined]
    leased.providers_stamp = providers_stamp  # type: ignore[attr-defined]
    stamp = (topology_id, topology_updated_at) if topology_id is not None else None
    leased.topology_stamp = stamp  # type: ignore[attr-defined]
    return token, leased


# The session's row as a job reads it: every column, converted as Django converts them.
_session_row = Compiled(Session, lambda: Session.objects.all())


def _lease_update(connection: Any) -> tuple[str, list[Any], str]:
    """The lease's UPDATE ... RETURNING the row, its values the statement's first five:
    the session, now, the token, the lease's end, the holder."""
    field = Session._meta.get_field
    update = UpdateQuery(Session)
    update.add_q(
        Q(pk=Arg(0, Session._meta.pk))
        & (Q(lease_token__isnull=True) | Q(lease_expires_at__lt=Arg(1, field("lease_expires_at"))))
    )
    update.add_update_values(
        {
            "lease_token": Arg(2, field("lease_token")),
            "lease_expires_at": Arg(3, field("lease_expires_at")),
            # In the same statement: from the moment the lease is taken the reconciler
            # can tell that its holder died (ADR 117).
            "lease_holder": Arg(4),
        }
    )
    sql, params = update.get_compiler(connection=connection).as_sql()
    quote = connection.ops.quote_name
    columns = ", ".join(quote(str(f.column)) for f in Session._meta.concrete_fields)
    return sql, list(params), columns


def _lease_sql(connection: Any) -> tuple[str, list[Any]]:
    sql, params, columns = _lease_update(connection)
    return f"{sql} RETURNING {columns}", params


def _lease_and_root_sql(connection: Any) -> tuple[str, list[Any]]:
    """The lease, the root run's INSERT (its start and input snapshot: the statement's
    values 6 and 7), the active topology's stamp (ADR 178) and the provider configs'
    (ADR 206)."""
    sql, params, columns = _lease_update(connection)
    quote = connection.ops.quote_name
    run, topology = AgentRun._meta, Topology._meta

    def column(meta: Any, name: str) -> str:
        return quote(str(meta.get_field(name).column))

    names = ("session", "agent_name", "mode", "status", "started_at", "input_snapshot")
    inserted = ", ".join(column(run, name) for name in (*names, "output_summary"))
    ended = ", ".join(["%s"] * len(ENDED_STATUSES))
    status = column(Session._meta, "status")
    return (
        f"WITH leased AS ({sql} RETURNING {columns}),"
        f" root AS (INSERT INTO {quote(run.db_table)} ({inserted})"
        f"  SELECT leased.{quote('id')}, %s, %s, %s, %s,"
        f"   jsonb_build_object('status', leased.{status}) || %s::jsonb, %s::jsonb"
        f"  FROM leased WHERE leased.{status} NOT IN ({ended}) RETURNING {quote('id')})"
        f" SELECT leased.*, (SELECT {quote('id')} FROM root) AS root_id,"
        f" stamp.{quote('id')} AS topology_id, stamp.{column(topology, 'updated_at')}"
        f" AS topology_updated_at, providers.providers_stamp"
        f" FROM leased LEFT JOIN (SELECT {quote('id')},"
        f" {column(topology, 'updated_at')} FROM {quote(topology.db_table)}"
        f" WHERE {column(topology, 'is_active')} ORDER BY 1 LIMIT 1) stamp ON TRUE"
        # Every provider config row, whole, as one digest (ADR 206): any change to one
        # changes it, so the job reads the configs only when they changed.
        f" CROSS JOIN (SELECT md5(coalesce(string_agg(p::text, ',' ORDER BY p.{quote('id')}),"
        f" '')) AS providers_stamp FROM {quote(ProviderConfig._meta.db_table)} p) providers",
        [
            *params,
            ROOT_AGENT,
            run.get_field("mode").get_default(),
            run.get_field("status").get_default(),
            slot(5, run.get_field("started_at")),
            slot(6),
            json.dumps(run.get_field("output_summary").get_default()),
            *sorted(ENDED_STATUSES),
        ],
    )


_lease = Statement(_lease_sql)
_lease_and_root = Statement(_lease_and_root_sql)


def renew_lease(session_id: Any, token: uuid.UUID) -> bool:
    """Extend the lease if it is still ours; False once it is gone."""
    renewed = Session.objects.filter(pk=session_id, lease_token=token).update(
        lease_expires_at=timezone.now() + timedelta(seconds=settings.AERO_LEASE_SECONDS)
    )
    return bool(renewed)


def heartbeat_interval() -> float:
    # Read per job: tests and operators shorten the lease without touching the beat.
    return float(min(settings.AERO_HEARTBEAT_SECONDS, settings.AERO_LEASE_SECONDS / 3))


class Heartbeat:
    """Renews a job's lease every heartbeat_interval() while the job runs, from the
    process's lease keeper (a thread of its own), so a long step (a slow model call)
    keeps the lease; a worker that dies or is paused stops beating and its lease runs
    out. Losing the lease is noticed by the job's next write (the fence), not here: this
    only records it for the log.

    One keeper thread per process serves every job's heartbeat (ADR 203): a thread
    started and joined per job cost each job two hand-offs between threads, on the path
    of every session queued behind it."""

    def __init__(self, session_id: str, token: uuid.UUID) -> None:
        self.session_id = session_id
        self.token = token
        self.lost = threading.Event()
        self.interval = heartbeat_interval()
        self.due = 0.0  # monotonic time of the next renewal

    def __enter__(self) -> Heartbeat:
        self.due = time.monotonic() + self.interval
        _lease_keeper().add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        # Waits for a renewal of this lease under way: the release comes after it.
        _lease_keeper().remove(self)

    def beat(self) -> bool:
        return renew_lease(self.session_id, self.token)


class _LeaseKeeper:
    """The thread that renews the leases of the jobs running in this process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.changed = threading.Condition()
        self.beats: list[Heartbeat] = []
        self.beating: Heartbeat | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="aero-lease-keeper")
        self.thread.start()

    def add(self, beat: Heartbeat) -> None:
        with self.changed:
            self.beats.append(beat)
            self.changed.notify_all()

    def remove(self, beat: Heartbeat) -> None:
        with self.changed:
            while self.beating is beat:
                self.changed.wait()
            self.beats = [known for known in self.beats if known is not beat]
            self.changed.notify_all()

    def _next(self) -> Heartbeat:
        """The first heartbeat due, once it is (marked as being beaten)."""
        with self.changed:
            while True:
                now = time.monotonic()
                if self.beats:
                    beat = min(self.beats, key=lambda known: known.due)
                    if beat.due <= now:
                        self.beating = beat
                        return beat
                    self.changed.wait(beat.due - now)
                else:
                    self.changed.wait()

    def _run(self) -> None:
        while True:
            beat = self._next()
            lost = False
            try:
                if not beat.beat():
                    lost = True
                    beat.lost.set()
                    logger.warning("session %s: the job lost its lease", beat.session_id)
            except DatabaseError:
                # PostgreSQL restarting: keep trying; the fence refuses the job's
                # writes if the lease runs out meanwhile.
                logger.warning("session %s: lease renewal failed", beat.session_id)
            except Exception:
                logger.exception("session %s: lease renewal failed", beat.session_id)
            finally:
                # Renewals are seconds apart and most jobs never need one: no connection
                # is kept open between them.
                connections.close_all()
                with self.changed:
                    self.beating = None
                    if lost:
                        self.beats = [known for known in self.beats if known is not beat]
                    else:
                        beat.due = time.monotonic() + beat.interval
                    self.changed.notify_all()


_keeper: _LeaseKeeper | None = None
_keeper_lock = threading.Lock()


def _lease_keeper() -> _LeaseKeeper:
    """This process's keeper, started at its first job (a forked child starts its own:
    threads do not survive a fork)."""
    global _keeper
    with _keeper_lock:
        if _keeper is None or _keeper.pid != os.getpid():
            _keeper = _LeaseKeeper()
        return _keeper


def release_lease(session_id: Any, token: uuid.UUID, finished: RootEnd | None = None) -> None:
    """Let the lease go. `finished`: the job's root run, marked ended in the same
    statement (a data-modifying CTE on PostgreSQL, ADR 175): one round trip, not two.
    Compiled once per connection (ADR 179)."""
    if finished is None:
        _release.run(session_id, token)
        return
    root_id, fence, end = finished
    ending = (root_id, end["status"], end["ended_at"], end["output_summary"])
    if connection.vendor != "postgresql":
        if fence is not None:
            _end_root.run(*ending, fence)
        else:
            _end_ended_root.run(*ending)
        _release.run(session_id, token)
        return
    if fence is not None:
        _end_root_and_release.run(*ending, fence, session_id, token)
    else:
        _end_ended_root_and_release.run(*ending, session_id, token)


# A job's root run to mark ended with the lease's release: its pk, the lease token the
# session must still hold for the run to be marked (None: the job ended the session, its
# lease is cleared), and its end (status, ended_at, output_summary).
RootEnd = tuple[int, uuid.UUID | None, dict[str, Any]]

_RUN = AgentRun._meta.get_field
_SESSION = Session._meta.get_field
_RELEASED = {"lease_token": None, "lease_expires_at": None, "lease_holder": ""}


def _root_end(first: int, fenced: bool) -> tuple[Any, dict[str, Any]]:
    """The root run's UPDATE, its values from the statement's `first`: the run, its
    status, ended_at and output summary, then (fenced) the lease it must still hold:
    fenced in the statement itself (no extra query), as an ended session has no lease
    any more and a waiting one still has ours unless another job took it."""
    runs = AgentRun.objects.filter(pk=Arg(first, AgentRun._meta.pk))
    if fenced:
        runs = runs.filter(session__lease_token=Arg(first + 4, _SESSION("lease_token")))
    return runs, {
        "status": Arg(first + 1),
        "ended_at": Arg(first + 2, _RUN("ended_at")),
        "output_summary": Arg(first + 3, _RUN("output_summary")),
    }


def _releases(first: int) -> Any:
    """The sessions whose lease to let go: the session and the token, from `first`."""
    return Session.objects.filter(
        pk=Arg(first, Session._meta.pk), lease_token=Arg(first + 1, _SESSION("lease_token"))
    )


def _both_sql(fenced: bool) -> Callable[[Any], tuple[str, list[Any]]]:
    def build(connection: Any) -> tuple[str, list[Any]]:
        run_sql, run_params = _update_sql(*_root_end(0, fenced), connection)
        release_sql, release_params = _update_sql(
            _releases(5 if fenced else 4), _RELEASED, connection
        )
        return f"WITH root_run AS ({run_sql}) {release_sql}", [*run_params, *release_params]

    return build


def _one_sql(
    rows: Callable[[], tuple[Any, dict[str, Any]]],
) -> Callable[[Any], tuple[str, list[Any]]]:
    def build(connection: Any) -> tuple[str, list[Any]]:
        return _update_sql(*rows(), connection)

    return build


_release = Statement(_one_sql(lambda: (_releases(0), _RELEASED)))
_end_root = Statement(_one_sql(lambda: _root_end(0, True)))
_end_ended_root = Statement(_one_sql(lambda: _root_end(0, False)))
_end_root_and_release = Statement(_both_sql(True))
_end_ended_root_and_release = Statement(_both_sql(False))


def _update_sql(rows: Any, values: dict[str, Any], connection: Any) -> tuple[str, list[Any]]:
    """The UPDATE Django would run for `rows.update(**values)`, compiled, not run."""
    query = rows.query.chain(UpdateQuery)
    query.add_update_values(values)
    query.clear_select_clause()  # as QuerySet.update does
    sql, params = query.get_compiler(connection=connection).as_sql()
    return sql, list(params)


# --- checkpointer and compiled graph, once per process -----------------------------


class _AgentRuntime:
    """The compiled graph bound to a checkpointer on a long-lived connection. Both
    savers serialise their use of the connection with their own lock, so the embedded
    worker's threads share one runtime."""

    def __init__(self, key: str, conn: Any, graph: Any) -> None:
        self.key = key
        self.conn = conn
        self.graph = graph
        self.pid = os.getpid()

    def healthy(self) -> bool:
        if self.pid != os.getpid():
            return False  # a forked child never uses its parent's socket
        try:
            if isinstance(self.conn, sqlite3.Connection):
                self.conn.execute("SELECT 1")
            else:
                if self.conn.closed or self.conn.broken:
                    return False
                # A quiet socket needs no round trip (ADR 168): a backend that ended
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


def agent_graph() -> Any:
    """The compiled agent graph with its checkpointer: built on first use in this
    process, rebuilt only if its connection died or the database changed."""
    global _runtime
    key = _checkpoint_key()
    with _runtime_lock:
        if _runtime is not None and _runtime.key == key and _runtime.healthy():
            return _runtime.graph
        if _runtime is not None:
            _runtime.close()
        conn, saver = _postgres_saver() if connection.vendor == "postgresql" else _sqlite_saver()
        _runtime = _AgentRuntime(key, conn, build_graph().compile(checkpointer=saver))
        return _runtime.graph


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
    """PostgresSaver whose writes are fenced like the job's other writes (ADR 100): in
    the write's own transaction it takes a share lock on the session row and checks the
    job's lease token, so a job paused past its lease cannot save a checkpoint over the
    one the job that took over saved (which would rewind the thread)."""
    from langgraph.checkpoint.base import CheckpointTuple
    from langgraph.checkpoint.postgres import PostgresSaver, _internal
    from psycopg.rows import dict_row

    class FencedPostgresSaver(PostgresSaver):
        # A job reads its thread's latest checkpoint twice in a row: `get_state` (what it
        # waits for, the answer it resumes with), then `invoke` (to run). The first read
        # is kept for the job (by its fence) and handed to the second, once (ADR 184):
        # only the lease holder writes its thread, and any write to the thread drops it.
        # Kept by a weak reference to the fence: what a job read and never asked for
        # again (a job that found nothing to do) goes with the job.
        kept: weakref.WeakKeyDictionary[Fence, dict[tuple[str, str], CheckpointTuple | None]]

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.kept = weakref.WeakKeyDictionary()
            self.kept_lock = threading.Lock()  # the embedded worker's job threads share it

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

        def _drop_kept(self, thread_id: Any) -> None:
            with self.kept_lock:
                for reads in list(self.kept.values()):
                    for key in [k for k in reads if k[0] == str(thread_id)]:
                        del reads[key]

        def put(self, config: RunnableConfig, *args: Any, **kwargs: Any) -> RunnableConfig:
            self._drop_kept(config["configurable"]["thread_id"])
            return super().put(config, *args, **kwargs)

        def put_writes(self, config: RunnableConfig, *args: Any, **kwargs: Any) -> None:
            self._drop_kept(config["configurable"]["thread_id"])
            super().put_writes(config, *args, **kwargs)

        def delete_thread(self, thread_id: str) -> None:
            self._drop_kept(thread_id)
            super().delete_thread(thread_id)

        def prune(self, thread_ids: Sequence[str], **kwargs: Any) -> None:
            for thread_id in thread_ids:
                self._drop_kept(thread_id)
            super().prune(thread_ids, **kwargs)

        @contextmanager
        def _cursor(self, *, pipeline: bool = False) -> Iterator[Any]:
            fence = active_fence()
            if pipeline and fence is not None and fence.steps_lost:
                raise StepsLost(f"session {fence.session_id}: checkpoint refused, steps lost")
            if not pipeline or fence is None:
                with super()._cursor(pipeline=pipeline) as cur:
                    yield cur
                return
            with (
                self.lock,
                _internal.get_connection(self.conn) as conn,
                conn.transaction(),
                conn.cursor(binary=True, row_factory=dict_row) as cur,
            ):
                # Never wait long for the row: the connection's lock_timeout (set once
                # when it was opened, ADR 156) makes a stuck lock this write's error.
                cur.execute(
                    "SELECT lease_token FROM diagnosis_session WHERE id = %s FOR SHARE",
                    (fence.session_id,),
                )
                row = cur.fetchone()
                if row is None or row["lease_token"] != fence.token:
                    raise LeaseLost(f"session {fence.session_id}: checkpoint write refused")
                yield cur

    return FencedPostgresSaver


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
        # fenced write (two statements per job, ADR 156). Only this job's writes touch
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
        """Refuses the exit checkpoint of a run whose step group failed to commit (ADR
        145), like the PostgreSQL saver's fence."""

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


def warm_up_worker() -> None:
    """What a worker's first job would otherwise pay, paid before the worker says it is
    up (ADR 208): the model clients (ADR 183), the agent graph compiled with its
    checkpointer connection (the saver's migration check under its advisory lock, and
    the wait for a worker starting beside it), and the active airport graph. Measured in
    the bench: each worker's first job took 0.42-0.46 s (0.2 s of CPU), the next ones
    0.03-0.06 s, with every session queued behind it. A database not ready yet (a worker
    started before the migrations) warms nothing more: the first job builds them."""
    warm_up()
    try:
        agent_graph()
        load_active_graph()
    except Exception:  # psycopg's own errors too (the checkpointer's connection)
        logger.warning("warm-up: the agent or airport graph is not ready yet", exc_info=True)


# --- the job --------------------------------------------------------------------------


@metrics.timed_job
def advance_session(session_id: str) -> str:
    """Advance the session as far as the inputs in the database allow. Idempotent: a
    duplicate or late job finds nothing to do. Returns the status it left, "busy" when
    another job holds the lease, "lease_lost" when this job lost it midway (it stopped
    and wrote nothing after), "stopped" when its worker is shutting down."""
    while True:
        if shutdown.stopping():
            return "stopped"  # the reconciler gives the session to a running worker
        taken = take_lease(session_id, root=root_snapshot())
        if taken is None:
            return "busy"  # another job holds it; it re-checks inputs before it lets go
        token, leased = taken
        finished: list[RootEnd] = []  # the root run, ended with the lease (ADR 175)
        try:
            with (
                Heartbeat(session_id, token),
                fenced(session_id, token),
                known_keys(session_id),
                waits.answered_requests(),
            ):
                status, waiting = _advance_locked(session_id, token, leased, finished)
        except LeaseLost as exc:
            logger.warning("session %s: stopped, another job took over (%s)", session_id, exc)
            return "lease_lost"
        except shutdown.WorkerStopping:
            logger.info("session %s: worker stopping, lease released", session_id)
            return "stopped"
        finally:
            release_lease(session_id, token, finished[0] if finished else None)
        # An answer or decision that arrived while we held the lease found us busy:
        # its job returned "busy", so this job takes the new input.
        if status not in (SessionStatus.WAITING_USER, WAITING_MODEL):
            return status
        if not resumable(session_id, waiting):
            return status


def resumable(session_id: Any, waiting: Any = None) -> bool:
    """Whether an input the job's wait is for arrived while the job held the lease (its
    job found the lease live and did not enqueue). `waiting`: the state the job stopped
    in (`_advance_locked` read it under the lease; nothing else advanced the graph), so
    no second read of the checkpoint. For a model wait, whether its reply is stored: one
    query (ADR 150). If the state moved on meanwhile (another job), the loop's next job
    reads the checkpoint again and finds nothing to do."""
    if isinstance(waiting, dict) and waiting.get("kind") == "model":
        return model_answered(waiting["key"])
    if waiting is None:
        session = Session.objects.get(pk=session_id)
        if session.is_ended:
            return False
        waiting = agent_graph().get_state(_config(session_id))
    return resume_value(session_id, waiting) is not None


# Twice per job that resumes after a model call: compiled once per connection (ADR 179).
_answered = Compiled(
    LLMRequest,
    lambda: (
        LLMRequest.objects.filter(key=Arg(0))
        .exclude(status=LLMRequestStatus.PENDING)
        .only("key", "status", "reply", "error", "answered_by")
        .order_by("pk")[:1]
    ),
)


def model_answered(key: str) -> bool:
    """Whether the request `key` is answered. The row is read whole and kept for the
    job's node that reads the reply next (`waits.answered_requests`): one query, not two."""
    row = _answered.first(key)
    if row is not None:
        waits.keep_answered(row)
    return row is not None


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
        # A decision, or a fact corrected while the approvals wait (ADR-138): one query.
        consumed = snapshot.values.get("consumed_seq", 0)
        found = (
            Session.objects.filter(pk=session_id)
            .annotate(
                decided=Exists(
                    ToolCall.objects.filter(pk__in=waiting["tool_calls"]).exclude(
                        status=ToolCallStatus.AWAITING_APPROVAL
                    )
                ),
                corrected=Exists(
                    Event.objects.filter(
                        session_id=session_id, type="user.message", seq__gt=consumed
                    )
                ),
            )
            .values_list("decided", "corrected")
            .first()
        )
        if found and found[0]:
            return {"decided": True}
        return {"corrected": True} if found and found[1] else None
    if waiting["kind"] == "model":
        return {"model": waiting["key"]} if model_answered(waiting["key"]) else None
    return None


def record_model_request(session_id: Any, waiting: dict[str, Any]) -> None:
    """The request a node interrupted with, as the runner's row (once by its key: a
    re-run of the job finds it). Fenced: only the lease holder records it."""
    row = LLMRequest(
        key=waiting["key"],
        session_id=session_id,
        purpose=waiting.get("purpose", ""),
        request=waiting["request"],
        providers=waiting.get("providers", []),
    )
    fence = current_fence(session_id)
    connection = transaction.get_connection()
    if fence is not None and connection.vendor == "postgresql" and not connection.in_atomic_block:
        # ONE statement in autocommit (ADR 181), not a transaction of four (BEGIN, the
        # row lock, the INSERT, COMMIT): the session row share-locked and the lease
        # checked in the statement itself, the row inserted only if the lease holds.
        sql, _ = cached_sql(
            connection, ("fenced_request",), lambda: _fenced_request_sql(connection)
        )
        params = [session_id, fence.token, *insert_values(LLMRequest, [row], connection)]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            (held,) = cursor.fetchone()
        if not held:
            raise LeaseLost(f"session {session_id}: lease {fence.token} is no longer held")
        return
    with transaction.atomic():
        check_fence(lock_session(session_id))
        # One statement (INSERT ... ON CONFLICT DO NOTHING), not a read, a savepoint and
        # an insert: a re-run finds its row by the unique key.
        LLMRequest.objects.bulk_create([row], ignore_conflicts=True)


def _fenced_request_sql(connection: Any) -> tuple[str, list[Any]]:
    """The request's INSERT if the session's lease is the job's: its values are the
    session, the token, then the row's. The share lock makes a concurrent move of the
    lease wait for this statement, or this statement re-check the row after it (READ
    COMMITTED), as the row lock of the transaction it replaces did. Returns whether the
    lease held (the row may have been there already: a re-run)."""
    quote = connection.ops.quote_name
    session = Session._meta
    fields = [f for f in LLMRequest._meta.concrete_fields if f is not LLMRequest._meta.pk]
    # Typed: the values of an INSERT ... SELECT are not typed by their columns.
    values = ", ".join(f"CAST(%s AS {f.db_type(connection)})" for f in fields)
    columns = ", ".join(quote(f.column) for f in fields)
    return (
        f"WITH fence AS (SELECT 1 FROM {quote(session.db_table)}"
        f" WHERE {quote(session.pk.column)} = %s"
        f" AND {quote(session.get_field('lease_token').column)} = %s FOR SHARE),"
        f" inserted AS (INSERT INTO {quote(LLMRequest._meta.db_table)} ({columns})"
        f" SELECT {values} FROM fence ON CONFLICT DO NOTHING RETURNING 1)"
        " SELECT EXISTS (SELECT 1 FROM fence)",
        [],
    )


def request_opening_extraction(session: Session, message: Event) -> bool:
    """With model calls as waits: record the extraction of a new session's opening
    message as the runner's request, in the transaction that creates the session, so
    that the session needs no job until the model has answered (ADR 170). The request is
    what the input parser would ask (its own call path, run up to the wait) under the
    key the parser uses for that message; the runner enqueues the session's first job
    with the reply, and that job reads it as a resume does. Returns whether a request was
    recorded: not without waits, nor when only the offline provider is configured (it
    needs no wait)."""
    if not waits.waits_enabled():
        return False
    providers = configured_providers()
    if all(isinstance(p, OfflineProvider) for p in providers):
        return False
    definition = _definition(session)
    text = message.payload.get("text", "")
    airport = load_active_graph()

    def extract(provider: Provider) -> Any:
        return provider.extract(definition, text, airport, None)

    def not_here(*args: Any) -> None:
        # The call failed before it could wait (a provider config that cannot be used,
        # say): the job makes it, and records the attempt and the fallback as always.
        raise _NotRequested()

    try:
        with transaction.atomic():  # a failure here leaves the session's creation whole
            waiting = waits.request_outside_graph(
                session.pk,
                waits.extraction_key(session.pk, message.seq),
                lambda: call_with_fallback(providers, "extract", extract, not_here, not_here),
            )
            if waiting is None:
                return False
            record_model_request(session.pk, waiting)
    except Exception:
        logger.warning(
            "session %s: its opening extraction goes to its first job", session.pk, exc_info=True
        )
        return False
    return True


class _NotRequested(Exception):
    pass


# Published scenario versions are immutable (ScenarioVersion.save): their definitions,
# read once per process.
_definitions: dict[int, dict[str, Any]] = {}


def _definition(session: Session) -> dict[str, Any]:
    found = _definitions.get(session.scenario_version_id)
    if found is None:
        found = ScenarioVersion.objects.values_list("definition", flat=True).get(
            pk=session.scenario_version_id
        )
        _definitions[session.scenario_version_id] = found
    return found


def _advance_locked(
    session_id: str,
    token: uuid.UUID,
    leased: Session | None = None,
    finished: list[RootEnd] | None = None,
) -> tuple[str, Any]:
    """The job under the lease. Returns the status it left and, at a wait, what it waits
    for (the model wait's interrupt value, or the state snapshot of a human wait).
    `finished`: takes the root run's end, for the caller to write with the lease's
    release; without it, the end is written here."""
    # `leased`: the row as taking the lease returned it (nothing else moves it but a
    # cancel, which the fence notices).
    session = leased or Session.objects.get(pk=session_id)
    if session.is_ended:
        return session.status, None
    definition = _definition(session)
    root_id = getattr(session, "root_id", None)
    if root_id is not None:
        # The root run was inserted and the topology's and the provider configs' stamps
        # read with the lease (ADR 178, 206): nothing else to read when neither changed.
        root = AgentRun(pk=root_id, session=session, agent_name=ROOT_AGENT)
        root._state.adding = False
        airport = load_active_graph(getattr(session, "topology_stamp", None))
        providers = configured_providers(getattr(session, "providers_stamp", None))
    else:
        # What the job reads to start, and its root run: one transaction (ADR 156).
        with transaction.atomic():
            root = AgentRun.objects.create(
                session=session,
                agent_name=ROOT_AGENT,
                input_snapshot={"status": session.status, **root_snapshot(token)},
            )
            airport, providers = load_active_graph(), configured_providers()
    with tracing():
        graph = agent_graph()
        config = _config(session_id)
        context = AgentContext(
            session_id=session.pk,
            definition=definition,
            graph=airport,
            providers=providers,
            root_run=root,
            producer=PRODUCER,
        )
        outcome, waiting = _drive(session, graph, config, context, token)
        end = {
            "status": "completed" if outcome != SessionStatus.FAILED else "failed",
            "ended_at": timezone.now(),
            "output_summary": {"status": outcome},
        }
        ended: RootEnd = (root.pk, None if outcome in ENDED_STATUSES else token, end)
        if finished is not None:
            finished.append(ended)
        else:
            runs = AgentRun.objects.filter(pk=root.pk)
            if outcome not in ENDED_STATUSES:
                runs = runs.filter(session__lease_token=token)
            runs.update(**end)
        with unfenced():  # the session may have ended: its lease is cleared
            if outcome == SessionStatus.COMPLETED:
                graph.checkpointer.delete_thread(str(session_id))  # the log is the history
            # A waiting session's older checkpoints are not pruned here: a prune is ~16
            # statements, on the path of every session queued behind this one; the
            # maintenance loop prunes the threads that have waited a while
            # (prune_waiting_checkpoints, ADR 207).
        return outcome, waiting


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
_PRUNE_LOCK = 0x4145524F_0207  # "AERO", ADR 207
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
    Its model waits added one checkpoint each; the event log is the history (ADR 103).
    The job that stopped at the wait used to prune them itself, ~16 statements on the
    path of every session behind it (ADR 207). Returns the threads pruned."""
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


def _drive(
    session: Session, graph: Any, config: RunnableConfig, context: AgentContext, token: uuid.UUID
) -> tuple[str, Any]:
    """Run the graph until it ends or waits. Returns the status and, at a wait, what it
    waits for (see _advance_locked)."""
    attempts = 0
    # The status as this job knows it: only this job (the lease holder) moves it, but
    # for its end (a cancel, noticed by the fence), so an unchanged status is not asked
    # for again under a row lock (a model wait leaves the session running; ADR 150).
    status = session.status
    snapshot: Any = graph.get_state(config)
    while True:
        if not snapshot.values:
            graph_input: Any = {
                "session_id": str(session.pk),
                "language": session.language,
                "consumed_seq": 0,
                "fsm": context.definition["compliance"]["states"][0],
            }
        elif snapshot.interrupts:
            waiting = snapshot.interrupts[0].value
            value = resume_value(session.pk, snapshot)
            if value is None and waiting["kind"] == "model":
                # Its request row may be missing (a job killed between its checkpoint and
                # the row): recorded here, once by key. An answered request has its row
                # (the usual resume: nothing to record, ADR 150). The job ends and frees
                # its worker; the runner makes the call.
                record_model_request(session.pk, waiting)
                return WAITING_MODEL, waiting
            if value is None:
                set_status(session.pk, SessionStatus.WAITING_USER, producer=PRODUCER, strict=False)
                return SessionStatus.WAITING_USER, snapshot
            graph_input = Command(resume=value)
        elif snapshot.next or snapshot.tasks:
            # A crashed run: continue from the last checkpoint. `next` leaves out tasks
            # whose writes were saved before the crash (the next checkpoint was not), so
            # a run killed between the two has an empty `next` but pending `tasks`: it
            # is not finished (the fault suite caught such a session "completed" with
            # its approved actions never executed).
            graph_input = None
        else:
            set_status(session.pk, SessionStatus.COMPLETED, producer=PRODUCER, strict=False)
            return SessionStatus.COMPLETED, None
        if status != SessionStatus.RUNNING:
            # Written as the first event of the first step group, not on its own (ADR 156).
            step_group(context).defer_status(status, SessionStatus.RUNNING, PRODUCER)
            status = SessionStatus.RUNNING
        context.origin = str(snapshot.config["configurable"].get("checkpoint_id") or "")
        try:
            # Checkpointed when the graph exits (an interrupt, the end, an error), not
            # after every step: the events are the history, and a step's keys do not
            # depend on its checkpoint (ADR 85).
            fence = active_fence()
            if fence is not None:
                fence.steps_lost = False  # this run's checkpoint may be saved again
            context.waiting_written = False
            try:
                result = graph.invoke(graph_input, config, context=context, durability="exit")
            finally:
                # Steps commit before anything that ends the run (ADR 145); an error
                # LangGraph raises between two steps (the recursion limit) leaves their
                # group open: what they did happened, and their checkpoint was saved.
                if context.group is not None:
                    context.group.commit()
        except SessionCanceled:
            return SessionStatus.CANCELED, None
        except LeaseLost:
            # Canceling a session clears its lease: the step that noticed (its write was
            # refused) and the exit checkpoint wrote nothing. Otherwise another job took
            # over: not the step's failure, this job stops.
            if Session.objects.filter(pk=session.pk, status=SessionStatus.CANCELED).exists():
                return SessionStatus.CANCELED, None
            raise
        except shutdown.WorkerStopping:
            raise  # not the step's failure: this job stops, the next one carries on
        except GraphRecursionError as exc:
            _fail(session.pk, f"the agent made no progress: {exc}")
            return SessionStatus.FAILED, None
        except Exception as exc:
            if context.group is not None:
                context.group.write_status()  # before the retry's move, as it was
            attempts += 1
            reason = f"{type(exc).__name__}: {exc}"
            logger.exception("session %s: agent step failed (attempt %s)", session.pk, attempts)
            if attempts >= settings.AERO_JOB_ATTEMPTS:
                _fail(session.pk, reason)
                return SessionStatus.FAILED, None
            set_status(
                session.pk, SessionStatus.RETRYING, producer=PRODUCER, reason=reason, strict=False
            )
            status = SessionStatus.RETRYING
            # Linear backoff, then resume from the last checkpoint.
            time.sleep(min(4.0, settings.AERO_JOB_BACKOFF * attempts))
            snapshot = graph.get_state(config)
            continue
        if context.group is not None:
            context.group.write_status()  # no step group carried it
        model_wait = _model_interrupt(result)
        if model_wait is not None:
            # The graph stopped at a model call (ADR 150): its request is in the invoke's
            # own result, so the state is not read again; the job records the request
            # once the checkpoint that waits for it is saved (ADR 172) and ends. A reply
            # stored meanwhile is seen by advance_session's re-check.
            record_model_request(session.pk, model_wait)
            return WAITING_MODEL, model_wait
        if context.waiting_written and _interrupt_value(result) is not None:
            # A human wait: its group wrote the move to waiting_user (ADR 174). What it
            # waits for is in the invoke's result: the state is not read again, and an
            # input that came meanwhile is seen by advance_session's re-check.
            return SessionStatus.WAITING_USER, Stopped(result)
        snapshot = graph.get_state(config)


def _interrupt_value(result: Any) -> dict[str, Any] | None:
    """What the graph run stopped at, from invoke()'s result (its values carry
    `__interrupt__` when the run was interrupted), or None."""
    if not isinstance(result, dict):
        return None
    interrupts = result.get("__interrupt__") or ()
    if not interrupts:
        return None
    value = getattr(interrupts[0], "value", None)
    return value if isinstance(value, dict) else None


def _model_interrupt(result: Any) -> dict[str, Any] | None:
    """The model wait the graph run stopped at, or None."""
    value = _interrupt_value(result)
    return value if value is not None and value.get("kind") == "model" else None


class Stopped:
    """The state a run stopped in, from invoke()'s result: what `resume_value` reads of
    a state snapshot (the interrupts and the values), without reading the checkpoint."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.interrupts = tuple(result["__interrupt__"])
        self.values = {k: v for k, v in result.items() if k != "__interrupt__"}


def _fail(session_id: Any, reason: str) -> None:
    set_status(session_id, SessionStatus.FAILED, producer=PRODUCER, reason=reason, strict=False)
