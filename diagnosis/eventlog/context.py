"""The ambient state of writing to the event log: the trace id, the job's fence (its
lease), the keys a job knows are written, the batch queuing a step's events and the graph
step events are keyed by."""

from __future__ import annotations

import contextvars
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction

from diagnosis.eventlog.registry import reduce_snapshot
from diagnosis.models import (
    AgentRun,
    Event,
    LLMRequest,
    LLMRequestStatus,
    Session,
)

_trace_id: contextvars.ContextVar[str] = contextvars.ContextVar("aero_trace_id", default="")


@contextmanager
def tracing(trace_id: str | None = None) -> Iterator[str]:
    token = _trace_id.set(trace_id or uuid.uuid4().hex)
    try:
        yield _trace_id.get()
    finally:
        _trace_id.reset(token)


def current_trace_id() -> str:
    return _trace_id.get()


class IllegalTransition(Exception):
    pass


class LeaseLost(Exception):
    """The job's lease on the session is gone (expired and taken, or the session ended):
    its write was refused and the job must stop."""


# --- fencing ------------------------------------------------------------------
# A job's writes carry its lease token: `fenced` sets it for everything the job does (and
# LangGraph's threads copy the context). Every write to a session's log locks the session
# row first; under that lock the token must still be the session's, so a job that lost
# its lease (paused past it while another job took over) writes nothing.


class Fence:
    def __init__(self, session_id: Any, token: uuid.UUID, claim: int | None = None) -> None:
        self.session_id = str(session_id)
        self.token = token
        # A child agent's job (diagnosis.jobs.child_jobs) holds no lease on the session
        # (its siblings write beside it): its writes are fenced by its claim on its
        # request row, `token` being the claim's.
        self.claim = claim
        # Set when a step group failed to commit: LangGraph still holds those
        # steps' state, so this run's exit checkpoint must not be saved (the savers
        # refuse it) and the retry starts again from the checkpoint before them.
        self.steps_lost = False
        # The session's row as this job last locked or wrote it (its lease's to start):
        # what a step group writes from without locking it first (write_unlocked).
        self.row: Session | None = None


class StepsLost(Exception):
    """A step group's commit failed after its steps ran: their checkpoint is refused."""


_fence: contextvars.ContextVar[Fence | None] = contextvars.ContextVar("aero_fence", default=None)


@contextmanager
def fenced(session_id: Any, token: uuid.UUID, claim: int | None = None) -> Iterator[Fence]:
    fence = Fence(session_id, token, claim)
    reset = _fence.set(fence)
    try:
        yield fence
    finally:
        _fence.reset(reset)


@contextmanager
def unfenced() -> Iterator[None]:
    """For writes checked some other way (under the same lock) or not the job's own."""
    reset = _fence.set(None)
    try:
        yield
    finally:
        _fence.reset(reset)


def active_fence() -> Fence | None:
    return _fence.get()


def current_fence(session_id: Any) -> Fence | None:
    """The fence of the job writing to this session, if a job is writing."""
    fence = _fence.get()
    return fence if fence is not None and fence.session_id == str(session_id) else None


def check_fence(session: Session) -> None:
    """Call with the session row locked: refuses a job's write once its lease is gone."""
    fence = current_fence(session.pk)
    if fence is not None and fence.claim is not None:
        # A child's job: its claim still held and the session not ended.
        held = LLMRequest.objects.filter(
            pk=fence.claim, claim_token=fence.token, status="pending"
        ).exists()
        if not held or session.is_ended:
            raise LeaseLost(f"session {session.pk}: claim {fence.token} is no longer held")
        return
    if fence is not None and session.lease_token != fence.token:
        raise LeaseLost(f"session {session.pk}: lease {fence.token} is no longer held")


# Node-run ids reserved per query: a session's first job runs ~14 nodes to its first wait.
RUN_ID_BLOCK = 16


class KnownKeys:
    """The keys of a session's events, for the job that holds its lease: one query per
    job (not one per step or per keyed event) tells whether a step wrote it before (a
    re-run); a key not in the set is new. The keys a job looks up are its own (its
    steps', its calls' approvals and notes): only the lease holder writes them, and the
    set takes each batch's keys when it commits. Were one missed, the unique index
    would refuse the duplicate and the step would fail and run again."""

    def __init__(self, session_id: Any) -> None:
        self.session_id = str(session_id)
        self.keys: set[str] | None = None
        # The keys of the session's model requests when the job loaded its keys (None:
        # not known, look each up). Only the lease holder records a session's requests
        # (and its creation, before any job), and a job that records one stops at it.
        self.requests: set[str] | None = None
        # Node-run ids reserved with the load, for the job's first step group.
        self.run_ids: list[int] = []
        # The answered request row the load read with the keys (`answered`), by key.
        self.answered_rows: dict[str, LLMRequest] = {}

    def __contains__(self, key: str) -> bool:
        if self.keys is None:
            self._load()
        assert self.keys is not None
        return key in self.keys

    def _load(self, request_key: str | None = None) -> None:
        connection = transaction.get_connection()
        if connection.vendor != "postgresql":
            self.keys = set(
                Event.objects.filter(session_id=self.session_id, key__gt="").values_list(
                    "key", flat=True
                )
            )
            return
        # One statement: the events' keys, the requests' keys, a block of run ids and
        # (`request_key`: the request a resuming job reads first) that request if
        # answered, where they were four (nextval is not transactional either way).
        table = LLMRequest._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT ARRAY(SELECT key FROM {Event._meta.db_table}"
                "   WHERE session_id = %s AND key > ''),"
                f" ARRAY(SELECT key FROM {table} WHERE session_id = %s),"
                " ARRAY(SELECT nextval(pg_get_serial_sequence(%s, 'id'))"
                "   FROM generate_series(1, %s)),"
                " (SELECT jsonb_build_array(id, status, reply, error, answered_by)"
                f"   FROM {table} WHERE key = %s AND status <> %s ORDER BY id LIMIT 1)",
                [
                    self.session_id,
                    self.session_id,
                    AgentRun._meta.db_table,
                    RUN_ID_BLOCK,
                    request_key,
                    LLMRequestStatus.PENDING,
                ],
            )
            keys, requests, run_ids, answered = cursor.fetchone()
        self.keys, self.requests, self.run_ids = set(keys), set(requests), list(run_ids)
        if request_key is not None and answered is not None:
            # Django's connection hands jsonb over as its text (its fields decode it).
            pk, status, reply, error, answered_by = json.loads(answered)
            row = LLMRequest(pk=pk, key=request_key, status=status, reply=reply, error=error or "")
            row.answered_by = answered_by or ""
            row._state.adding = False
            self.answered_rows[request_key] = row

    def answered(self, key: str) -> tuple[bool, LLMRequest | None]:
        """The job's first read of an answered request, with its keys in the same
        statement: (True, the row or None when not answered) if this call loaded them,
        (False, None) if they were loaded already (the caller reads the row itself)."""
        if self.keys is not None or transaction.get_connection().vendor != "postgresql":
            return False, None
        self._load(key)
        return True, self.answered_rows.pop(key, None)

    def request_absent(self, key: str) -> bool:
        """Whether the session had no model request `key` when the job started (False
        when that is not known)."""
        if self.keys is None:
            self._load()
        return self.requests is not None and key not in self.requests

    def add(self, keys: list[str]) -> None:
        if self.keys is not None:
            self.keys.update(keys)


_known: contextvars.ContextVar[KnownKeys | None] = contextvars.ContextVar(
    "aero_known_keys", default=None
)


def current_known(session_id: Any) -> KnownKeys | None:
    """The job's known keys of this session, if a job holding its lease is running."""
    known = _known.get()
    return known if known is not None and known.session_id == str(session_id) else None


@contextmanager
def known_keys(session_id: Any) -> Iterator[KnownKeys]:
    """For a job (it holds the lease, so it is the only writer of the session's step
    keys): step key lookups of the session are answered from one load."""
    known = KnownKeys(session_id)
    token = _known.set(known)
    try:
        yield known
    finally:
        _known.reset(token)


class EventBatch:
    """The events one transaction appends to one session, written together at its end."""

    def __init__(self, session_id: Any) -> None:
        self.session_id = session_id
        self.pending: list[Event] = []
        self.by_key: dict[str, Event] = {}
        self.loaded_prefixes: set[str] = set()
        # The session's row as this transaction locked it (lock_session inside the
        # batch): the batch's write takes it as it is, without a second locking read.
        self.locked: Session | None = None

    def add(self, event: Event) -> None:
        self.pending.append(event)
        if event.key:
            self.by_key[event.key] = event

    def truncate(self, mark: int) -> None:
        """Forget the events queued after the first `mark` (a step that rolled back)."""
        for event in self.pending[mark:]:
            if event.key:
                self.by_key.pop(event.key, None)
        del self.pending[mark:]

    def projected(self, session: Session) -> Session:
        """`session` as it will read once the queued events are written: its snapshot
        with theirs folded in (what an approval's state digest is taken from)."""
        snapshot = session.snapshot
        for event in self.pending:
            reduced = reduce_snapshot(snapshot, event.type, event.payload)
            if reduced is not None:
                snapshot = reduced
        session.snapshot = snapshot
        return session

    def find(self, key: str) -> Event | None:
        """The event with this key, queued or written. Step keys share a task prefix: the
        first lookup loads every written key of the task in one query."""
        if key in self.by_key:
            return self.by_key[key]
        known = _known.get()
        if known is not None and known.session_id == str(self.session_id):
            if key not in known:
                return None  # the common case: a step that never ran before
            return Event.objects.filter(session_id=self.session_id, key=key).first()
        prefix = key.split("/", 1)[0] + "/" if key.startswith("task:") else ""
        if not prefix:
            return Event.objects.filter(session_id=self.session_id, key=key).first()
        if prefix not in self.loaded_prefixes:
            self.loaded_prefixes.add(prefix)
            for event in Event.objects.filter(
                session_id=self.session_id, key__startswith=prefix
            ).defer("payload"):
                self.by_key.setdefault(event.key, event)
        return self.by_key.get(key)


_batch: contextvars.ContextVar[EventBatch | None] = contextvars.ContextVar(
    "aero_event_batch", default=None
)


def current_batch(session_id: Any) -> EventBatch | None:
    """The batch queuing this session's events right now, if any."""
    batch = _batch.get()
    return batch if batch is not None and str(batch.session_id) == str(session_id) else None


def as_logged(session: Session) -> Session:
    """`session` as the log will read once the batch queuing its events now (if any) is
    written: what an approval's state digest is taken from."""
    batch = current_batch(session.pk)
    return batch.projected(session) if batch is not None else session


# --- events of a graph step -----------------------------------------------------------


class StepScope:
    """The graph step a node runs as. LangGraph re-runs a step from its first line after a
    crash (or a retry), under the same task id: events written inside are keyed by that
    id and a counter per kind, so the re-run finds them written and writes nothing."""

    def __init__(self, task_key: str) -> None:
        self.task_key = task_key
        self.counters: dict[str, int] = {}

    def key(self, part: str) -> str:
        number = self.counters.get(part, 0)
        self.counters[part] = number + 1
        return f"{self.task_key}/{part}/{number}"


_step: contextvars.ContextVar[StepScope | None] = contextvars.ContextVar(
    "aero_step_scope", default=None
)


@contextmanager
def step_scope(task_key: str) -> Iterator[StepScope]:
    scope = StepScope(task_key)
    token = _step.set(scope)
    try:
        yield scope
    finally:
        _step.reset(token)
