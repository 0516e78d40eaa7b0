"""The heads of the audit and event chains, anchored outside the database.

The chains are keyed, so nobody without the key forges a link; but the database's owner
can still cut a chain's tail, or recompute a session's chain as unkeyed links. So every
AERO_ANCHOR_EVERY entries (and at shutdown: `manage.py anchor_heads`) a head is appended
to AERO_ANCHOR_FILE, a JSON-lines file the database never holds (copy it off the host
for more), and `verify_audit` / `verify_chain` check the chains against it: an anchored
entry that is gone is a cut tail, one whose hash differs a recomputed or rewritten chain.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

logger = logging.getLogger(__name__)


def append(record: dict[str, Any]) -> None:
    """One line, flushed to disk; a failure is logged, never the writer's error."""
    path = settings.AERO_ANCHOR_FILE
    line = json.dumps({**record, "at": timezone.now().isoformat()}, sort_keys=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())
    except OSError:
        logger.warning("could not anchor a chain head in %s", path, exc_info=True)


def _due(before: int, after: int) -> bool:
    every = settings.AERO_ANCHOR_EVERY
    return every > 0 and after // every != before // every


def note_audit(entry_id: int, digest: str, using: str | None = None) -> None:
    """After an audit entry is appended (its transaction commits)."""
    if _due(entry_id - 1, entry_id):
        record = {"kind": "audit", "id": entry_id, "head": digest}
        transaction.on_commit(lambda: append(record), using=using)


def note_events(session_id: Any, before: int, after: int, head: str) -> None:
    """After a session's events up to seq `after` are appended (from `before`)."""
    if _due(before, after):
        record = {"kind": "event", "session": str(session_id), "seq": after, "head": head}
        transaction.on_commit(lambda: append(record))


def records(kind: str, session: str | None = None) -> list[dict[str, Any]]:
    path = settings.AERO_ANCHOR_FILE
    if not path.exists():
        return []
    found = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if session is not None and session not in line:
                continue  # most lines are another session's: no JSON parse
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("kind") == kind and (session is None or record.get("session") == session):
                found.append(record)
    return found


def first_mismatch(
    anchored: Iterable[dict[str, Any]],
    position: str,
    last: int,
    stored: Callable[[list[int]], dict[int, str]],
    what: str,
) -> str:
    """The first anchored head the chain no longer has: a position past its end (a cut
    tail) or a different hash there (a recomputed or rewritten chain). Empty: none."""
    anchored = sorted(anchored, key=lambda record: int(record[position]))
    hashes = stored([int(record[position]) for record in anchored])
    for record in anchored:
        at = int(record[position])
        if at > last:
            return (
                f"{what} {at}, anchored at {record.get('at', '?')}, is gone: "
                f"the chain was cut after {what} {last}"
            )
        if hashes.get(at) != record["head"]:
            return (
                f"{what} {at} does not have the hash anchored at {record.get('at', '?')} "
                "(the chain was recomputed or rewritten)"
            )
    return ""
