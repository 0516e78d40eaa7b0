"""Appending to the event log: seq allocated under the session row lock, push after commit."""

from __future__ import annotations

import contextvars
import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import Exists, F, Model, OuterRef, Q, Value
from django.db.models.expressions import CombinedExpression
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from aero import anchors
from aero.compiled import (
    Arg,
    Compiled,
    bind,
    cached_sql,
    insert_rows,
    insert_sql,
    insert_values,
    mark_saved,
)
from aero.text import check_event_size
from diagnosis.chain import event_hash
from diagnosis.fold import reduce_snapshot
from diagnosis.models import (
    ENDED_STATUSES,
    SESSION_TRANSITIONS,
    AgentRun,
    Event,
    LLMRequest,
    Session,
    SessionStatus,
)
from diagnosis.push import notify_session

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
    def __init__(self, session_id: Any, token: uuid.UUID) -> None:
        self.session_id = str(session_id)
        self.token = token
        # Set when a step group failed to commit: LangGraph still holds those
        # steps' state, so this run's exit checkpoint must not be saved (the savers
        # refuse it) and the retry starts again from the checkpoint before them.
        self.steps_lost = False


class StepsLost(Exception):
    """A step group's commit failed after its steps ran: their checkpoint is refused."""


_fence: contextvars.ContextVar[Fence | None] = contextvars.ContextVar("aero_fence", default=None)


@contextmanager
def fenced(session_id: Any, token: uuid.UUID) -> Iterator[Fence]:
    fence = Fence(session_id, token)
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
    if fence is not None and session.lease_token != fence.token:
        raise LeaseLost(f"session {session.pk}: lease {fence.token} is no longer held")


# Every write to a session's log starts here (several times per job): compiled once per
# connection.
_lock_session = Compiled(
    Session, lambda: Session.objects.select_for_update().filter(pk=Arg(0, Session._meta.pk))
)


def lock_session(session_id: Any) -> Session:
    return _lock_session.get(session_id)


def append_event(
    session_id: Any,
    type: str,
    payload: dict[str, Any] | None = None,
    *,
    producer: str,
    run: AgentRun | None = None,
    key: str = "",
) -> Event:
    """Append one event. Locks the session row (seq has no gaps); the snapshot the event
    implies (`reduce_snapshot`, the fold's own rule) and the chain head (the event's
    hash, diagnosis.chain) are stored in the same transaction. `key`: see append_keyed.
    The push goes out on commit.

    Inside `event_batch(session_id)` the event is only queued (no seq, ts or hash yet):
    the batch writes it with the others when the batch ends.

    A payload over aero.text.MAX_EVENT_BYTES raises EventTooLarge: the live path carries
    every event whole, so none may be larger than it can carry."""
    event = _new_event(session_id, type, payload, producer=producer, run=run, key=key)
    batch = _batch.get()
    if batch is not None and str(batch.session_id) == str(session_id):
        batch.add(event)
        return event
    with transaction.atomic():
        _write(lock_session(session_id), [event])
    return event


def _new_event(
    session_id: Any,
    type: str,
    payload: dict[str, Any] | None,
    *,
    producer: str,
    run: AgentRun | None = None,
    key: str = "",
) -> Event:
    """An event to write: no seq, ts or hash yet (_write gives them)."""
    # Stored as JSON: hash exactly what a reader will get back (tuples become lists).
    raw = json.dumps(payload or {}, ensure_ascii=False)
    # Refused before it is queued: a batch then writes nothing of its step.
    check_event_size(type, len(raw.encode()))
    payload = json.loads(raw)
    return Event(
        session_id=session_id,
        type=type,
        payload=payload,
        producer=producer,
        run=run,
        trace_id=current_trace_id(),
        key=key,
    )


def _write(
    session: Session, events: list[Event], rows: Sequence[Model] = (), **fields: Any
) -> None:
    """Give `events` the next seqs of the locked `session`, hash-chain them, insert them
    in one statement, update the session once and notify once, after commit, with the
    highest seq. A job's write is fenced: refused unless it still holds the lease.
    `fields`: more columns of the session to set in the same UPDATE (set_status, the
    token counters). `rows`: other new rows (of other models) inserted in the same
    statement (an LLM call's `LLMCall`); their pks are not read back."""
    check_fence(session)
    now = timezone.now()
    seq, head, snapshot = session.last_seq, session.chain_head, session.snapshot
    changed = False
    for event in events:
        seq += 1
        event.session_id = session.pk
        event.seq = seq
        event.ts = now
        event.hash = head = event_hash(head, event)
        reduced = reduce_snapshot(snapshot, event.type, event.payload)
        if reduced is not None:
            snapshot, changed = reduced, True
    updates: dict[str, Any] = {**fields, "last_seq": seq, "chain_head": head, "updated_at": now}
    if changed:
        updates["snapshot"] = snapshot
    connection = transaction.get_connection()
    if connection.vendor == "postgresql":
        _update_and_insert(connection, session.pk, updates, events, rows)
    else:
        Session.objects.filter(pk=session.pk).update(**updates)
        if len(events) == 1:
            events[0].save(force_insert=True)
        else:
            Event.objects.bulk_create(events)
        for row in rows:
            row.save(force_insert=True)
    transaction.on_commit(partial(notify_session, session.pk, seq))
    anchors.note_events(session.pk, session.last_seq, seq, head)
    known = _known.get()
    if known is not None and known.session_id == str(session.pk):
        # Only once committed: a step that rolls back wrote none of its keys.
        transaction.on_commit(partial(known.add, [e.key for e in events if e.key]))


def _update_and_insert(
    connection: Any,
    session_id: Any,
    updates: dict[str, Any],
    events: list[Event],
    rows: Sequence[Model] = (),
) -> None:
    """The session's UPDATE and the events' INSERT as ONE statement (a data-modifying
    CTE, PostgreSQL): the UPDATE Django writes, the events' INSERT from one
    jsonb parameter (`insert_sql`), one round trip.
    `rows`: each another INSERT in the same WITH (PostgreSQL runs every data-modifying
    CTE to completion, read or not). The SQL is built once per connection and
    shape (the columns set, the models and the number of events): each call
    prepares its values as Django's compiler would."""
    # Each value a placeholder (an increment's amount too); other expressions are
    # compiled into the SQL, which is then not kept.
    values: dict[str, Any] = {}
    args: list[Any] = []
    for i, (name, value) in enumerate(updates.items()):
        if isinstance(value, Increment) and value.column == name:
            values[name], value = F(name) + Arg(i, _SESSION(name)), value.amount
        elif not hasattr(value, "resolve_expression"):
            values[name] = Arg(i, _SESSION(name))
        else:
            values[name] = value
        args.append(value)
    key = ("log_write", tuple(updates), tuple(type(row) for row in rows), min(len(events), 2))

    def build() -> tuple[str, list[Any]]:
        return _log_write_sql(connection, values, rows, len(events))

    cached = all(
        isinstance(value, Arg) or isinstance(updates[name], Increment)
        for name, value in values.items()
    )
    sql, update_params = cached_sql(connection, key, build) if cached else build()
    params = bind(tuple(update_params), (*args, session_id), connection)
    for row in rows:
        params += insert_values(type(row), [row], connection)
    params += insert_values(Event, events, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = [row[0] for row in cursor.fetchall()]
    mark_saved(events, ids, connection.alias)


_SESSION = Session._meta.get_field


def _log_write_sql(
    connection: Any, values: dict[str, Any], rows: Sequence[Model], count: int
) -> tuple[str, list[Any]]:
    """`_update_and_insert`'s statement: the session's UPDATE of `values` (placeholders
    for the call's values, then one for the session's pk), each row's INSERT, the events'
    INSERT."""
    update = UpdateQuery(Session)
    update.add_q(Q(pk=Arg(len(values), Session._meta.pk)))
    update.add_update_values(values)
    update_sql, update_params = update.get_compiler(connection=connection).as_sql()
    ctes = [f"session_row AS ({update_sql})"]
    for number, row in enumerate(rows):
        ctes.append(f"row_{number} AS ({insert_sql(connection, type(row), 1, returning=False)})")
    insert = insert_sql(connection, Event, count, returning=True)
    return f"WITH {', '.join(ctes)} {insert}", list(update_params)


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

    def __contains__(self, key: str) -> bool:
        if self.keys is None:
            self._load()
        assert self.keys is not None
        return key in self.keys

    def _load(self) -> None:
        connection = transaction.get_connection()
        if connection.vendor != "postgresql":
            self.keys = set(
                Event.objects.filter(session_id=self.session_id, key__gt="").values_list(
                    "key", flat=True
                )
            )
            return
        # One statement: the events' keys, the requests' keys and a block of
        # run ids, where they were three (nextval is not transactional either way).
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT ARRAY(SELECT key FROM {Event._meta.db_table}"
                "   WHERE session_id = %s AND key > ''),"
                f" ARRAY(SELECT key FROM {LLMRequest._meta.db_table} WHERE session_id = %s),"
                " ARRAY(SELECT nextval(pg_get_serial_sequence(%s, 'id'))"
                "   FROM generate_series(1, %s))",
                [self.session_id, self.session_id, AgentRun._meta.db_table, RUN_ID_BLOCK],
            )
            keys, requests, run_ids = cursor.fetchone()
        self.keys, self.requests, self.run_ids = set(keys), set(requests), list(run_ids)

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


@contextmanager
def event_batch(session_id: Any, *, created: Session | None = None) -> Iterator[EventBatch]:
    """Queue the session's events appended inside and write them when the block ends
    without an error: one row lock, one bulk insert, one session update, one notice
    after commit (a graph step). Must run inside the caller's transaction, so
    the step's other writes commit or roll back with its events. Events appended inside
    a savepoint that rolls back are still written: do not append inside one.
    `created`: the session, inserted by this same transaction: no other transaction can
    see its row yet (and the INSERT holds its lock), so it is written as it is in hand,
    without a locking read."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("event_batch needs an open transaction")
    batch = EventBatch(session_id)
    token = _batch.set(batch)
    try:
        yield batch
    finally:
        _batch.reset(token)
    if batch.pending:
        _write(created if created is not None else lock_session(session_id), batch.pending)


@contextmanager
def _step_savepoint() -> Iterator[None]:
    """A savepoint a failing step rolls back to, like `atomic()`'s, but not released when
    the step succeeds: the database keeps it until the group commits, one
    statement saved per step. As `atomic()` does, the step's on-commit callbacks carry
    the savepoint, so rolling back to it drops them with its rows."""
    connection = transaction.get_connection()
    sid = connection.savepoint()
    connection.savepoint_ids.append(sid)
    try:
        yield
        if connection.needs_rollback:
            # A database error inside the step that its code caught: the step failed.
            raise transaction.TransactionManagementError("a step swallowed a database error")
    except BaseException:
        connection.savepoint_ids.pop()
        connection.needs_rollback = False
        try:
            connection.savepoint_rollback(sid)
        except Exception:
            connection.needs_rollback = True  # the whole group rolls back (as atomic())
        raise
    connection.savepoint_ids.pop()


# Node-run ids reserved per query: a session's first job runs ~14 nodes to its first wait.
RUN_ID_BLOCK = 16


class _GroupRolledBack(Exception):
    pass


class StepGroup:
    """Graph steps that follow each other with no wait between them (the rules, the
    impact, the lookups, the proposals...), written as ONE transaction: one row lock,
    one block of seqs, one bulk insert, one session update and one notice after commit
    for all of them (issue 8 item 1). It is opened by the first step and
    committed before anything that ends the graph's run: a wait (the waiting nodes and a
    model wait commit it first), the last node, a failure, the worker stopping; so the
    checkpoint LangGraph saves when the run exits never gets ahead of the log.

    Each step after the first runs in a savepoint: a step that fails or waits for the
    model leaves nothing (its queued events are dropped too), the steps before it
    commit, and its failure is logged on its own. A crash (kill -9) mid-group loses the
    whole group and its checkpoint alike: the next job re-runs those steps from the
    checkpoint, under the same step keys."""

    def __init__(self, session_id: Any) -> None:
        self.session_id = session_id
        self.atomic: Any = None
        self.batch: EventBatch | None = None
        # The node runs its steps finished that already had a row (a re-run step, or a
        # database without sequences): one UPDATE for all of them at the commit.
        self.finished: list[AgentRun] = []
        # The node runs of its steps that have no row yet: inserted in ONE
        # statement at the commit, already completed, with their own timing.
        self.new_runs: list[AgentRun] = []
        # Run ids reserved from the sequence, a block at a time, for `new_runs`: the
        # steps' tool calls, model calls and events name their run before its row is
        # written (the foreign keys are checked at the commit: deferred).
        self.run_ids: list[int] = []
        # A step locked the session row (usage counted): the group ends with it.
        self.end_after_step = False
        # The job's move to `running`, written as the first event of the next group
        # rather than on its own: (from, to, producer) and its queued event.
        self.status: tuple[str, str, str] | None = None
        self.status_event: Event | None = None
        # The move the group's commit ends with (to waiting_user at a human wait, ADR
        # 174): (from, to, producer), its event the group's last.
        self.end_status: tuple[str, str, str] | None = None

    def defer_status(self, previous: str, to: str, producer: str) -> None:
        """Move the session from `previous` to `to` with the next group's commit, its
        event first in the group. `write_status` writes it on its own if no group did."""
        self.status = (previous, to, producer)

    def write_status(self) -> None:
        """The deferred move, written now (no group carried it: no step ran, or the
        first one failed; its failure is logged after it, as before)."""
        if self.status is not None:
            _, to, producer = self.status
            self.status = None
            set_status(self.session_id, to, producer=producer, strict=False)

    def new_run(self, **fields: Any) -> AgentRun | None:
        """A node run to be inserted with the group's commit, its id reserved now; None
        where ids cannot be reserved (SQLite: the caller inserts the row itself)."""
        if transaction.get_connection().vendor != "postgresql":
            return None
        if not self.run_ids:
            known = current_known(self.session_id)
            if known is not None and known.run_ids:
                self.run_ids, known.run_ids = known.run_ids, []
        if not self.run_ids:
            with transaction.get_connection().cursor() as cursor:
                # nextval is not transactional: a block is never handed out twice, and
                # ids a rolled-back step reserved are a gap (ids are not a count). A
                # block per job, so a later job's runs still sort after this one's.
                cursor.execute(
                    "SELECT nextval(pg_get_serial_sequence('diagnosis_agentrun', 'id'))"
                    " FROM generate_series(1, %s)",
                    [RUN_ID_BLOCK],
                )
                self.run_ids = [row[0] for row in cursor.fetchall()]
        run = AgentRun(pk=self.run_ids.pop(0), started_at=timezone.now(), **fields)
        self.new_runs.append(run)
        return run

    def finish_run(self, run: AgentRun, summary: str) -> None:
        """Mark a step's AgentRun completed when the group commits (a step that rolls
        back after this is forgotten: its run is not written, or its row is rolled
        back too and the update finds nothing)."""
        if any(pending is run for pending in self.new_runs):
            run.status = "completed"
            run.ended_at = timezone.now()
            run.output_summary = {"summary": summary}
            return
        self.finished.append(
            AgentRun(
                pk=run.pk,
                status="completed",
                ended_at=timezone.now(),
                output_summary={"summary": summary},
            )
        )

    @property
    def is_open(self) -> bool:
        return self.atomic is not None

    @contextmanager
    def step(self, *, savepoint: bool = True) -> Iterator[EventBatch]:
        """One node's step inside the group (opened here if it is the first).
        `savepoint=False`: for a step that writes no row but its AgentRun (its events
        are only queued): if it fails, its events are dropped and its run row stays in
        the group, for the caller to mark failed; two statements saved per step."""
        first = self.atomic is None
        if first:
            self.atomic = transaction.atomic()
            self.atomic.__enter__()
            self.batch = EventBatch(self.session_id)
            if self.status is not None:
                previous, to, producer = self.status
                self.status_event = _new_event(
                    self.session_id,
                    "session.status_changed",
                    {"from": previous, "to": to, "reason": ""},
                    producer=producer,
                )
                self.batch.add(self.status_event)
        batch = self.batch
        assert batch is not None
        mark, finished, runs = len(batch.pending), len(self.finished), len(self.new_runs)
        token = _batch.set(batch)
        try:
            if first or not savepoint:
                yield batch
            else:
                with _step_savepoint():  # this step alone rolls back
                    yield batch
        except BaseException:
            batch.truncate(mark)
            del self.finished[finished:]
            del self.new_runs[runs:]  # the failed step's run is the caller's to record
            if first:
                self.rollback()  # nothing else in the group: nothing to keep
            raise
        finally:
            _batch.reset(token)

    def end_with_status(self, previous: str, to: str, producer: str) -> bool:
        """Move the session from `previous` to `to` with this group's commit, its event
        after the group's others (a wait the steps end at). False when no group is open:
        the caller moves it itself. Not written if the session moved meanwhile (only a
        cancel can: it clears the lease, and the commit is refused anyway)."""
        if self.atomic is None or self.batch is None:
            return False
        self.end_status = (previous, to, producer)
        return True

    def commit(self) -> None:
        """Write the group's events (lock, seqs, one insert, one update) and commit."""
        atomic, batch, finished, runs = self.atomic, self.batch, self.finished, self.new_runs
        if atomic is None or batch is None:
            return
        end, self.end_status = self.end_status, None
        self.atomic, self.batch, self.finished, self.new_runs = None, None, [], []
        self.end_after_step = False
        try:
            self._flush(batch, finished, runs, end)
        except BaseException as exc:
            atomic.__exit__(type(exc), exc, exc.__traceback__)
            self._lost()
            raise
        try:
            atomic.__exit__(None, None, None)  # COMMIT: deferred constraints may fail here
        except BaseException:
            self._lost()
            raise

    def _lost(self) -> None:
        fence = current_fence(self.session_id)
        if fence is not None:
            fence.steps_lost = True

    def _flush(
        self,
        batch: EventBatch,
        finished: list[AgentRun],
        runs: list[AgentRun],
        end: tuple[str, str, str] | None = None,
    ) -> None:
        if runs:
            insert_rows(AgentRun, runs)  # their ids reserved: one INSERT, nothing read back
        if finished:
            AgentRun.objects.bulk_update(finished, ["status", "ended_at", "output_summary"])
        status, event = self.status, self.status_event
        if not batch.pending:
            return
        session = lock_session(self.session_id)
        fields: dict[str, Any] = {}
        if status is not None and event is not None and batch.pending[0] is event:
            previous, to, producer = status
            if session.status == previous and session.can_transition(to):
                fields, _ = _status_change(session, previous, to, producer)
            else:
                # Moved meanwhile (only a cancel can, and it clears the lease, so the
                # write below is refused anyway): the move is not this group's to write.
                batch.pending.pop(0)
        if end is not None:
            previous, to, producer = end
            current = fields.get("status", session.status)  # after the group's start move
            if current == previous and to in SESSION_TRANSITIONS[current]:
                more, events = _status_change(session, previous, to, producer)
                fields.update(more)
                batch.pending.extend(events)
        _write(session, batch.pending, **fields)
        if event is not None:
            self.status, self.status_event = None, None

    def rollback(self, *, lost: bool = False) -> None:
        """`lost`: steps before the current one are rolled back too (a lost lease): their
        checkpoint must not be saved either."""
        atomic = self.atomic
        if atomic is None:
            return
        if lost:
            self._lost()
        self.atomic, self.batch, self.finished, self.new_runs = None, None, [], []
        self.end_status = None
        self.end_after_step = False
        self.status_event = None  # `status` stays deferred: write_status or the next group
        exc = _GroupRolledBack()
        atomic.__exit__(type(exc), exc, None)


def append_keyed(
    session_id: Any, type: str, key: str, payload: dict[str, Any], **kwargs: Any
) -> tuple[Event, bool]:
    """Append unless an event with this key exists in the session (the key is unique per
    session in the database). Returns the event and whether it was written now: callers
    write the projections (rows, token counters) only when it was."""
    batch = _batch.get()
    if batch is not None and str(batch.session_id) == str(session_id):
        existing = batch.find(key)
        if existing is not None:
            return existing, False
        return append_event(session_id, type, payload, key=key, **kwargs), True
    with transaction.atomic():
        lock_session(session_id)
        found = Event.objects.filter(session_id=session_id, key=key).first()
        if found is not None:
            return found, False
        return append_event(session_id, type, payload, key=key, **kwargs), True


def append_event_once(
    session_id: Any, type: str, key: str, payload: dict[str, Any], **kwargs: Any
) -> Event:
    """For events a re-run node may try to append again (questions, approval requests).
    The payload carries the key as well (a question's key is what an answer names)."""
    return append_keyed(session_id, type, f"{type}:{key}", {**payload, "key": key}, **kwargs)[0]


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


def append_step_event(
    session_id: Any, type: str, payload: dict[str, Any], **kwargs: Any
) -> tuple[Event, bool]:
    """Append an event of the current graph step, keyed (see StepScope); outside a step
    it is a plain append."""
    scope = _step.get()
    if scope is None:
        return append_event(session_id, type, payload, **kwargs), True
    return append_keyed(session_id, type, scope.key(type), payload, **kwargs)


def set_status(
    session_id: Any,
    to: str,
    *,
    producer: str,
    reason: str = "",
    strict: bool = True,
    by: str = "",
    ended: dict[str, Any] | None = None,
) -> bool:
    """Move the session along its state machine. Returns False when it was already there;
    an illegal move raises (strict) or is ignored."""
    with transaction.atomic():
        session = lock_session(session_id)
        check_fence(session)
        if session.status == to:
            return False
        if not session.can_transition(to):
            if strict:
                raise IllegalTransition(f"session {session.pk}: {session.status} -> {to}")
            return False
        fields, events = _status_change(session, session.status, to, producer, reason)
        if to in ENDED_STATUSES:
            # `ended`: what else the ending event says (an operator's closing summary).
            payload: dict[str, Any] = {"reason": reason, **(ended or {})}
            if by:
                payload["by"] = by
            events.append(_new_event(session.pk, f"session.{to}", payload, producer=producer))
        batch = _batch.get()
        if batch is not None and str(batch.session_id) == str(session.pk):
            # Queued after the batch's events so far, as an append would be.
            Session.objects.filter(pk=session.pk).update(**fields)
            for event in events:
                batch.add(event)
            return True
        # Fenced above under this lock; ending the session clears the lease, so the
        # write must not be checked against it again. The status and the events are
        # one UPDATE and one INSERT under the lock already held.
        with unfenced():
            _write(session, events, **fields)
    return True


def _status_change(
    session: Session, previous: str, to: str, producer: str, reason: str = ""
) -> tuple[dict[str, Any], list[Event]]:
    """The session's columns and the event of a move from `previous` to `to`."""
    now = timezone.now()
    fields: dict[str, Any] = {"status": to}
    if to == SessionStatus.RUNNING and session.started_at is None:
        fields["started_at"] = now
    if to in ENDED_STATUSES:
        fields["ended_at"] = now
        fields["lease_token"] = None
        fields["lease_expires_at"] = None
    if to == SessionStatus.FAILED:
        fields["failure"] = reason
    event = _new_event(
        session.pk,
        "session.status_changed",
        {"from": previous, "to": to, "reason": reason},
        producer=producer,
    )
    return fields, [event]


def add_usage(session_id: Any, tokens_in: int, tokens_out: int, cost: Any) -> None:
    """Count an LLM call's usage; call it in the transaction that appends its `llm.call`
    event, and only when that event is new (a re-run counts nothing twice)."""
    Session.objects.filter(pk=session_id).update(**usage_fields(tokens_in, tokens_out, cost))


def usage_fields(tokens_in: int, tokens_out: int, cost: Any) -> dict[str, Any]:
    """The session's token counters raised by one call's usage (add_usage's UPDATE), for
    `append_projected`'s `fields`."""
    return {
        "tokens_in": Increment("tokens_in", tokens_in),
        "tokens_out": Increment("tokens_out", tokens_out),
        "cost": Increment("cost", cost),
    }


class Increment(CombinedExpression):
    """`column + amount`, a counter raised in the UPDATE itself. `_update_and_insert`
    binds the amount as a value, so its statement's SQL stays the same."""

    def __init__(self, column: str, amount: Any) -> None:
        super().__init__(F(column), "+", Value(amount))
        self.column = column
        self.amount = amount


def new_event(
    session_id: Any, type: str, payload: dict[str, Any], *, producer: str, key: str = ""
) -> Event:
    """An event for `append_projected` (checked for size now, written there)."""
    return _new_event(session_id, type, payload, producer=producer, key=key)


def append_projected(
    session_id: Any,
    events: list[Event],
    *,
    fields: dict[str, Any] | None = None,
    rows: Sequence[Model] = (),
) -> tuple[Session, bool]:
    """Append `events` (from `new_event`; at most one of them keyed) and, only when the
    keyed one is new, its projections: `fields`, more columns of the session (the token
    counters: `usage_fields`) and `rows`, other new rows (its `LLMCall`). Two statements
    in all: the session row locked by a read that also tells whether the key
    is in the log (what append_keyed asks in a SELECT of its own, after a second lock),
    then ONE statement that updates the session and inserts the events and the rows. A
    keyed event already in the log is not written again, nor are its projections: a
    re-run counts nothing twice. Returns the session as read under the lock (its lease,
    say) and whether the keyed event was new (True when none is keyed).

    Must run inside the caller's transaction (its other writes commit with these), and
    the caller must hold what makes it the only writer of the key (the runner: the
    request's row, locked by its claim check before this): the key is read once, not
    re-read under the session lock (a read that waited for the lock sees the log as it
    was when the statement began)."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("append_projected needs an open transaction")
    keyed = [event for event in events if event.key]
    if len(keyed) > 1:
        raise ValueError("append_projected takes at most one keyed event")
    sessions = Session.objects.select_for_update()
    if keyed:
        sessions = sessions.annotate(
            key_found=Exists(Event.objects.filter(session_id=OuterRef("pk"), key=keyed[0].key))
        )
    session = sessions.get(pk=session_id)
    new = not (keyed and getattr(session, "key_found", False))
    if new:
        _write(session, events, rows, **(fields or {}))
    elif unkeyed := [event for event in events if not event.key]:
        _write(session, unkeyed)
    return session, new
