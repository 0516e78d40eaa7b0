"""Appending to the event log: seq allocated under the session row lock, push after commit."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import Exists, F, Model, OuterRef, Q, Value
from django.db.models.expressions import CombinedExpression
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from aero import anchors, stamps
from aero.compiled import (
    Arg,
    Compiled,
    bind,
    cached_sql,
    insert_sql,
    insert_values,
    mark_saved,
)
from aero.text import check_event_size
from diagnosis.chain import event_hash
from diagnosis.eventlog import registry
from diagnosis.eventlog.context import (
    EventBatch,
    Fence,
    IllegalTransition,
    _batch,
    _known,
    _step,
    check_fence,
    current_fence,
    current_trace_id,
    unfenced,
)
from diagnosis.eventlog.names import SESSION_STATUS_CHANGED
from diagnosis.models import (
    ENDED_STATUSES,
    AgentRun,
    Event,
    Session,
    SessionStatus,
)
from diagnosis.push import notify_session

# Every write to a session's log starts here (several times per job): compiled once per
# connection.
_lock_session = Compiled(
    Session, lambda: Session.objects.select_for_update().filter(pk=Arg(0, Session._meta.pk))
)


def lock_session(session_id: Any) -> Session:
    """The session's row, locked until the transaction ends (docs/lock-order.md). Kept
    by the open batch of that session, whose write then needs no second read."""
    session = _lock_session.get(session_id)
    batch = _batch.get()
    if batch is not None and str(batch.session_id) == str(session.pk):
        batch.locked = session
    _keep_row(session)
    return session


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
    # Checked, never rewritten: the chain hashes the payload exactly as given.
    registry.check_payload(type, payload)
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
    statement (an LLM call's `LLMCall`, a step group's node runs); their pks are not
    read back: a row whose pk is set (reserved from its sequence) is inserted with it."""
    check_fence(session)
    _append(session, events, rows, fields)


def write_unlocked(
    session: Session, events: list[Event], rows: Sequence[Model], fields: dict[str, Any]
) -> bool:
    """`_write` without the locking read before it (PostgreSQL), for the job holding the
    session's lease: `session` is its row as the job last locked or wrote it. The
    session's UPDATE takes the lock and writes only if the row still has that seq and
    chain head (no event came between: a status or snapshot changes only with one) and
    the job's lease; the INSERTs write only if it did. False when nothing was written:
    the caller locks the row and writes as usual."""
    fence = current_fence(session.pk)
    if fence is None or fence.claim is not None:
        raise RuntimeError("write_unlocked is for the job holding the session's lease")
    # A copy: parallel branches share the fence, and a row read while another branch
    # writes it could pair one write's seq with another's head.
    row = copy.copy(session)
    return _append(row, events, rows, fields, (row.last_seq, row.chain_head, fence))


def _append(
    session: Session,
    events: list[Event],
    rows: Sequence[Model],
    fields: dict[str, Any],
    expect: tuple[int, str, Fence] | None = None,
) -> bool:
    """`_write`'s work once fenced. `expect`: `write_unlocked`'s condition."""
    now = timezone.now()
    seq, head, snapshot = session.last_seq, session.chain_head, session.snapshot
    changed = False
    for event in events:
        seq += 1
        event.session_id = session.pk
        event.seq = seq
        event.ts = now
        event.hash = head = event_hash(head, event)
        reduced = registry.reduce_snapshot(snapshot, event.type, event.payload)
        if reduced is not None:
            snapshot, changed = reduced, True
    updates: dict[str, Any] = {**fields, "last_seq": seq, "chain_head": head, "updated_at": now}
    if changed:
        updates["snapshot"] = snapshot
    connection = transaction.get_connection()
    if connection.vendor == "postgresql":
        condition = None if expect is None else (expect[0], expect[1], expect[2].token)
        if not _update_and_insert(connection, session.pk, updates, events, rows, condition):
            return False
    else:
        Session.objects.filter(pk=session.pk).update(**updates)
        if len(events) == 1:
            events[0].save(force_insert=True)
        else:
            Event.objects.bulk_create(events)
        for row in rows:
            row.save(force_insert=True)
    transaction.on_commit(partial(notify_session, session.pk, seq))
    if changed or "title" in fields:
        # What an approval queue card shows of its session changed: the queue's pages
        # are rendered again (events that change neither leave them cached).
        stamps.touch(stamps.QUEUE)
    anchors.note_events(session.pk, session.last_seq, seq, head)
    for name, value in updates.items():  # the row in hand stays the row written
        if not hasattr(value, "resolve_expression"):  # a counter's F() + n stays unread
            setattr(session, name, value)
    known = _known.get()
    if known is not None and known.session_id == str(session.pk):
        # Only once committed: a step that rolls back wrote none of its keys.
        transaction.on_commit(partial(known.add, [e.key for e in events if e.key]))
    _keep_row(session)
    return True


def _keep_row(session: Session) -> None:
    """The row in hand as the job holding the lease last locked or wrote it, for its
    next `write_unlocked` (a job's own writes only: a child's job has no lease)."""
    fence = current_fence(session.pk)
    if fence is not None and fence.claim is None:
        fence.row = session


def _update_and_insert(
    connection: Any,
    session_id: Any,
    updates: dict[str, Any],
    events: list[Event],
    rows: Sequence[Model] = (),
    expect: tuple[int, str, Any] | None = None,
) -> bool:
    """The session's UPDATE and the events' INSERT as ONE statement (a data-modifying
    CTE, PostgreSQL): the UPDATE Django writes, the events' INSERT from one
    jsonb parameter (`insert_sql`), one round trip.
    `rows`: each another INSERT in the same WITH (PostgreSQL runs every data-modifying
    CTE to completion, read or not). The SQL is built once per connection and
    shape (the columns set, the models and the number of events): each call
    prepares its values as Django's compiler would. `expect`: the seq, chain head and
    lease token the row must still have (`write_unlocked`), or nothing is written:
    returns whether it was."""
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
    groups = _row_groups(rows)
    shape = tuple((model, with_pk, min(len(objs), 2)) for model, with_pk, objs in groups)
    key = ("log_write", tuple(updates), shape, min(len(events), 2), expect is not None)

    def build() -> tuple[str, list[Any]]:
        return _log_write_sql(connection, values, groups, len(events), expect is not None)

    cached = all(
        isinstance(value, Arg) or isinstance(updates[name], Increment)
        for name, value in values.items()
    )
    sql, update_params = cached_sql(connection, key, build) if cached else build()
    params = bind(tuple(update_params), (*args, session_id, *(expect or ())), connection)
    many = expect is not None  # conditional INSERTs read their rows from one jsonb
    for model, with_pk, objs in groups:
        params += insert_values(model, objs, connection, with_pk, many=many)
    params += insert_values(Event, events, connection, many=many)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = [row[0] for row in cursor.fetchall()]
    if expect is not None and not ids:
        return False  # the row moved on: nothing was written
    mark_saved(events, ids, connection.alias)
    for _, with_pk, objs in groups:
        if with_pk:
            mark_saved(objs, [obj.pk for obj in objs], connection.alias)
    return True


def _row_groups(rows: Sequence[Model]) -> list[tuple[type[Model], bool, list[Model]]]:
    """`rows` as INSERTs: consecutive rows of one model, all with their pks set or all
    without, are one INSERT (one CTE)."""
    groups: list[tuple[type[Model], bool, list[Model]]] = []
    for row in rows:
        model, with_pk = type(row), row.pk is not None
        if groups and groups[-1][0] is model and groups[-1][1] == with_pk:
            groups[-1][2].append(row)
        else:
            groups.append((model, with_pk, [row]))
    return groups


_SESSION = Session._meta.get_field


def _log_write_sql(
    connection: Any,
    values: dict[str, Any],
    groups: list[tuple[type[Model], bool, list[Model]]],
    count: int,
    conditional: bool = False,
) -> tuple[str, list[Any]]:
    """`_update_and_insert`'s statement: the session's UPDATE of `values` (placeholders
    for the call's values, then one for the session's pk and, `conditional`, for the
    seq, chain head and lease token it must have), each group of rows' INSERT, the
    events' INSERT (`conditional`: only if the UPDATE found the row)."""
    n = len(values)
    where = Q(pk=Arg(n, Session._meta.pk))
    if conditional:
        where &= Q(
            last_seq=Arg(n + 1, _SESSION("last_seq")),
            chain_head=Arg(n + 2, _SESSION("chain_head")),
            lease_token=Arg(n + 3, _SESSION("lease_token")),
        )
    update = UpdateQuery(Session)
    update.add_q(where)
    update.add_update_values(values)
    update_sql, update_params = update.get_compiler(connection=connection).as_sql()
    only_if = "EXISTS (SELECT 1 FROM session_row)" if conditional else ""
    if conditional:
        update_sql += f" RETURNING {connection.ops.quote_name(Session._meta.pk.column)}"
    ctes = [f"session_row AS ({update_sql})"]
    for number, (model, with_pk, objs) in enumerate(groups):
        count_ = 2 if conditional else len(objs)
        insert = insert_sql(
            connection, model, count_, returning=False, with_pk=with_pk, where=only_if
        )
        ctes.append(f"row_{number} AS ({insert})")
    insert = insert_sql(
        connection, Event, 2 if conditional else count, returning=True, where=only_if
    )
    return f"WITH {', '.join(ctes)} {insert}", list(update_params)


@contextmanager
def event_batch(session_id: Any, *, locked: Session | None = None) -> Iterator[EventBatch]:
    """Queue the session's events appended inside and write them when the block ends
    without an error: one row lock, one bulk insert, one session update, one notice
    after commit (a graph step). Must run inside the caller's transaction, so
    the step's other writes commit or roll back with its events. Events appended inside
    a savepoint that rolls back are still written: do not append inside one.
    `locked`: the session's row as this transaction holds it (inserted by it, or read by
    lock_session before any of its events was written): written as it is in hand,
    without a second locking read."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("event_batch needs an open transaction")
    batch = EventBatch(session_id)
    token = _batch.set(batch)
    try:
        yield batch
    finally:
        _batch.reset(token)
    if batch.pending:
        _write(locked or batch.locked or lock_session(session_id), batch.pending)


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
            for name, value in fields.items():  # the row in hand stays the row written
                setattr(session, name, value)
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
        SESSION_STATUS_CHANGED,
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
    session_id: Any,
    type: str,
    payload: dict[str, Any],
    *,
    producer: str,
    key: str = "",
    run_id: int | None = None,
) -> Event:
    """An event for `append_projected` (checked for size now, written there). `run_id`:
    the agent run it is of (by id: the writer need not have the row)."""
    event = _new_event(session_id, type, payload, producer=producer, key=key)
    event.run_id = run_id
    return event


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
