"""Appending to the event log: seq allocated under the session row lock, push after commit."""

from __future__ import annotations

import contextvars
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from diagnosis.chain import event_hash
from diagnosis.fold import reduce_snapshot
from diagnosis.models import ENDED_STATUSES, AgentRun, Event, Session, SessionStatus
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


def lock_session(session_id: Any) -> Session:
    return Session.objects.select_for_update().get(pk=session_id)


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
    The push goes out on commit."""
    # Stored as JSON: hash exactly what a reader will get back (tuples become lists).
    payload = json.loads(json.dumps(payload or {}))
    with transaction.atomic():
        session = lock_session(session_id)
        now = timezone.now()
        event = Event(
            session_id=session.pk,
            seq=session.last_seq + 1,
            type=type,
            ts=now,
            payload=payload,
            producer=producer,
            run=run,
            trace_id=current_trace_id(),
            key=key,
        )
        event.hash = event_hash(session.chain_head, event)
        updates: dict[str, Any] = {
            "last_seq": event.seq,
            "chain_head": event.hash,
            "updated_at": now,
        }
        snapshot = reduce_snapshot(session.snapshot, type, payload)
        if snapshot is not None:
            updates["snapshot"] = snapshot
        Session.objects.filter(pk=session.pk).update(**updates)
        event.save(force_insert=True)
        transaction.on_commit(partial(notify_session, session.pk, event.seq))
    return event


def append_keyed(
    session_id: Any, type: str, key: str, payload: dict[str, Any], **kwargs: Any
) -> tuple[Event, bool]:
    """Append unless an event with this key exists in the session (the key is unique per
    session in the database). Returns the event and whether it was written now: callers
    write the projections (rows, token counters) only when it was."""
    with transaction.atomic():
        lock_session(session_id)
        existing = Event.objects.filter(session_id=session_id, key=key).first()
        if existing is not None:
            return existing, False
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
) -> bool:
    """Move the session along its state machine. Returns False when it was already there;
    an illegal move raises (strict) or is ignored."""
    with transaction.atomic():
        session = lock_session(session_id)
        if session.status == to:
            return False
        if not session.can_transition(to):
            if strict:
                raise IllegalTransition(f"session {session.pk}: {session.status} -> {to}")
            return False
        previous = session.status
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
        Session.objects.filter(pk=session.pk).update(**fields)
        append_event(
            session.pk,
            "session.status_changed",
            {"from": previous, "to": to, "reason": reason},
            producer=producer,
        )
        if to in ENDED_STATUSES:
            ended: dict[str, Any] = {"reason": reason}
            if by:
                ended["by"] = by
            append_event(session.pk, f"session.{to}", ended, producer=producer)
    return True


def add_usage(session_id: Any, tokens_in: int, tokens_out: int, cost: Any) -> None:
    """Count an LLM call's usage; call it in the transaction that appends its `llm.call`
    event, and only when that event is new (a re-run counts nothing twice)."""
    Session.objects.filter(pk=session_id).update(
        tokens_in=F("tokens_in") + tokens_in,
        tokens_out=F("tokens_out") + tokens_out,
        cost=F("cost") + cost,
    )
