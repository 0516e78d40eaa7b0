"""Appending to the event log: seq allocated under the session row lock, push after commit."""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

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
) -> Event:
    """Append one event. Locks the session row (seq has no gaps); the snapshot the event
    implies (`reduce_snapshot`, the fold's own rule) is stored in the same transaction.
    The push goes out on commit."""
    payload = payload or {}
    with transaction.atomic():
        session = lock_session(session_id)
        seq = session.last_seq + 1
        updates: dict[str, Any] = {"last_seq": seq, "updated_at": timezone.now()}
        snapshot = reduce_snapshot(session.snapshot, type, payload)
        if snapshot is not None:
            updates["snapshot"] = snapshot
        Session.objects.filter(pk=session.pk).update(**updates)
        event = Event.objects.create(
            session_id=session.pk,
            seq=seq,
            type=type,
            payload=payload,
            producer=producer,
            run=run,
            trace_id=current_trace_id(),
        )
        transaction.on_commit(partial(notify_session, session.pk, seq))
    return event


def append_event_once(
    session_id: Any, type: str, key: str, payload: dict[str, Any], **kwargs: Any
) -> Event:
    """For events a re-run node may try to append again (questions, approval requests)."""
    with transaction.atomic():
        lock_session(session_id)
        existing = Event.objects.filter(session_id=session_id, type=type, payload__key=key).first()
        if existing is not None:
            return existing
        return append_event(session_id, type, {**payload, "key": key}, **kwargs)


def set_status(
    session_id: Any, to: str, *, producer: str, reason: str = "", strict: bool = True
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
            append_event(session.pk, f"session.{to}", {"reason": reason}, producer=producer)
    return True


def add_usage(session_id: Any, tokens_in: int, tokens_out: int, cost: Any) -> None:
    Session.objects.filter(pk=session_id).update(
        tokens_in=F("tokens_in") + tokens_in,
        tokens_out=F("tokens_out") + tokens_out,
        cost=F("cost") + cost,
    )
