"""The per-session hash chain over the event log.

Each event stores `hash = sha256(prev_hash || canonical(event))`, where `prev_hash` is the
previous event's hash (64 zeros before the first) as 64 lowercase hex characters, `||`
is byte concatenation and `canonical(event)` is the UTF-8 JSON (sorted keys, no
whitespace) of the event's session, seq, event_id, type, ts (ISO 8601), payload,
producer, trace_id and run. The session keeps the last hash as `chain_head`. An edited
payload, a deleted or inserted row, or a reordered seq changes every hash from there
on, so `verify_chain` names the first bad seq. (Someone who can rewrite every later row
and the head can forge a chain; an exported head kept elsewhere catches that.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

GENESIS = "0" * 64


def canonical(
    *,
    session_id: Any,
    seq: int,
    event_id: Any,
    type: str,
    ts: datetime,
    payload: dict[str, Any],
    producer: str,
    trace_id: str,
    run_id: int | None,
) -> bytes:
    body = {
        "session": str(session_id),
        "seq": seq,
        "event_id": str(event_id),
        "type": type,
        "ts": ts.isoformat(),
        "payload": payload,
        "producer": producer,
        "trace_id": trace_id,
        "run": run_id,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def link(prev_hash: str, event_canonical: bytes) -> str:
    return hashlib.sha256(prev_hash.encode("ascii") + event_canonical).hexdigest()


def event_hash(prev_hash: str, event: Any) -> str:
    """The hash of an Event (saved or not) after `prev_hash`."""
    return link(
        prev_hash,
        canonical(
            session_id=event.session_id,
            seq=event.seq,
            event_id=event.event_id,
            type=event.type,
            ts=event.ts,
            payload=event.payload,
            producer=event.producer,
            trace_id=event.trace_id,
            run_id=event.run_id,
        ),
    )


@dataclass
class ChainReport:
    session_id: str
    ok: bool
    checked: int
    first_bad_seq: int | None
    head: str  # the head recomputed from the rows (up to the first bad one)
    stored_head: str
    problem: str = ""


def check_events(
    session_id: Any, events: Iterable[Any], last_seq: int, stored_head: str
) -> ChainReport:
    """Walk events in seq order (pure: no database). The first seq that is missing, out
    of place or does not hash to its stored hash is reported; rows after it are not
    trusted."""
    prev = GENESIS
    expected = 1
    checked = 0
    for event in events:
        if event.seq != expected:
            problem = (
                f"seq {expected} is missing" if event.seq > expected else f"seq {event.seq} repeats"
            )
            return ChainReport(
                str(session_id), False, checked, expected, prev, stored_head, problem
            )
        computed = event_hash(prev, event)
        if computed != event.hash:
            return ChainReport(
                str(session_id),
                False,
                checked,
                event.seq,
                prev,
                stored_head,
                f"seq {event.seq} does not match its hash (edited?)",
            )
        prev = computed
        checked += 1
        expected += 1
    if checked < last_seq:
        return ChainReport(
            str(session_id),
            False,
            checked,
            expected,
            prev,
            stored_head,
            f"seq {expected}..{last_seq} missing (the log ends early)",
        )
    if prev != stored_head:
        return ChainReport(
            str(session_id),
            False,
            checked,
            checked or None,
            prev,
            stored_head,
            "the session's chain head does not match its last event",
        )
    return ChainReport(str(session_id), True, checked, None, prev, stored_head)


def verify_chain(session_id: Any) -> ChainReport:
    """Recompute a session's chain from its rows and compare with the stored hashes and
    head. Streams the events, so a 50,000-event session needs little memory."""
    from diagnosis.models import Event, Session

    session = Session.objects.values("last_seq", "chain_head").get(pk=session_id)
    events = (
        Event.objects.filter(session_id=session_id)
        .order_by("seq")
        .only(
            "session_id",
            "seq",
            "event_id",
            "type",
            "ts",
            "payload",
            "producer",
            "trace_id",
            "run_id",
            "hash",
        )
        .iterator(chunk_size=2000)
    )
    return check_events(session_id, events, session["last_seq"], session["chain_head"])
