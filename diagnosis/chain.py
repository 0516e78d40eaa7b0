"""The per-session hash chain over the event log.

Each event stores a link over `prev_hash || canonical(event)`, where `prev_hash` is the
previous event's stored hash (64 zeros before the first), `||` is byte concatenation and
`canonical(event)` is the UTF-8 JSON (sorted keys, no whitespace) of the event's session,
seq, event_id, type, ts (ISO 8601), payload, producer, trace_id and run. New events are
linked with an HMAC-SHA256 keyed by a key derived from the audit key (the database never
holds it), stored as "k" and the first 63 hex digits; events written before keys were
used keep their plain sha256 (64 hex digits) and still verify, but once a session's chain
is keyed no plain link may follow. The session keeps the last hash as `chain_head`. An
edited payload, a deleted or inserted row, or a reordered seq changes every hash from
there on, so `verify_chain` names the first bad seq; whoever lacks the key cannot
recompute a keyed chain, and the heads anchored outside the database (aero.anchors)
catch a cut tail or a chain recomputed as unkeyed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from aero import anchors

GENESIS = "0" * 64
KEYED = "k"  # the version marker of a keyed link


@lru_cache(maxsize=4)
def _derived_key(audit_key: bytes) -> bytes:
    return hmac.new(audit_key, b"aero-event-chain", hashlib.sha256).digest()


def chain_key() -> bytes:
    from aero.audit_chain import audit_key

    return _derived_key(audit_key())


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
    """The unkeyed link of the events written before the chain was keyed."""
    return hashlib.sha256(prev_hash.encode("ascii") + event_canonical).hexdigest()


def keyed_link(prev_hash: str, event_canonical: bytes, key: bytes | None = None) -> str:
    digest = hmac.new(key or chain_key(), prev_hash.encode("ascii") + event_canonical, "sha256")
    return KEYED + digest.hexdigest()[:63]


def is_keyed(stored_hash: str) -> bool:
    return stored_hash.startswith(KEYED)


def event_hash(prev_hash: str, event: Any, *, keyed: bool = True) -> str:
    """The hash of an Event (saved or not) after `prev_hash`: keyed unless asked for
    the unkeyed link of an older event."""
    return (keyed_link if keyed else link)(
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
    keyed_seen = False
    for event in events:
        if event.seq != expected:
            problem = (
                f"seq {expected} is missing" if event.seq > expected else f"seq {event.seq} repeats"
            )
            return ChainReport(
                str(session_id), False, checked, expected, prev, stored_head, problem
            )
        keyed = is_keyed(event.hash)
        if keyed_seen and not keyed:
            return ChainReport(
                str(session_id),
                False,
                checked,
                event.seq,
                prev,
                stored_head,
                f"seq {event.seq} is not keyed after keyed links (recomputed?)",
            )
        keyed_seen = keyed_seen or keyed
        computed = event_hash(prev, event, keyed=keyed)
        if not hmac.compare_digest(computed, event.hash):
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
    report = check_events(session_id, events, session["last_seq"], session["chain_head"])
    if report.ok:
        problem = anchors.first_mismatch(
            anchors.records("event", session=str(session_id)),
            "seq",
            session["last_seq"],
            lambda seqs: dict(
                Event.objects.filter(session_id=session_id, seq__in=seqs).values_list("seq", "hash")
            ),
            "seq",
        )
        if problem:
            report.ok, report.problem = False, f"does not match its anchors: {problem}"
    return report
