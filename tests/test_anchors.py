"""Tamper-evident to the database's owner (issue 29, item 5): the event chain is keyed
for new events (older plain links still verify), and the heads of both chains are
anchored in a file outside the database, so an edit, a cut tail or a recomputed chain
is each detected by `verify_audit` / `verify_chain`."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

from aero.models import AuditLog, audit
from diagnosis import chain
from diagnosis.chain import GENESIS, event_hash, verify_chain
from diagnosis.models import Event, Session
from tests.web_helpers import waiting_session

pytestmark = pytest.mark.services


@pytest.fixture
def anchor_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "anchors.jsonl"
    with override_settings(AERO_ANCHOR_FILE=path, AERO_ANCHOR_EVERY=4):
        yield path


def lines(path: Path, kind: str) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == kind]


def verify_audit() -> str:
    out = io.StringIO()
    call_command("verify_audit", stdout=out)
    return out.getvalue()


def as_owner(*statements: tuple[str, list[Any]]) -> None:
    """What only the owner can do: the audit log's append-only trigger off meanwhile
    (the event log is append-only by the app role's grants)."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE aero_auditlog DISABLE TRIGGER aero_audit_no_update_delete")
        try:
            for sql, params in statements:
                cursor.execute(sql, params)
        finally:
            cursor.execute(
                "ALTER TABLE aero_auditlog ENABLE ALWAYS TRIGGER aero_audit_no_update_delete"
            )


# --- the audit log --------------------------------------------------------------------


def test_a_cut_audit_tail_is_detected_against_the_anchors(
    transactional_db: None, anchor_file: Path
) -> None:
    entries = [audit("test.recorded", actor_label="pytest", object_id=str(n)) for n in range(9)]
    anchored = lines(anchor_file, "audit")
    assert anchored and all(int(str(r["id"])) % 4 == 0 for r in anchored)
    assert "audit chain OK: 9 entries" in verify_audit()

    # The owner deletes the newest entries: what is left is a valid chain on its own.
    newest = max(int(str(r["id"])) for r in anchored)
    as_owner(("DELETE FROM aero_auditlog WHERE id >= %s", [newest]))

    with pytest.raises(CommandError, match=rf"entry {newest}, anchored at .* is gone"):
        verify_audit()
    assert entries  # (kept alive for the ids)


def test_an_edited_audit_entry_is_detected(transactional_db: None, anchor_file: Path) -> None:
    entries = [audit("test.recorded", actor_label="pytest", object_id=str(n)) for n in range(5)]
    as_owner(
        ("UPDATE aero_auditlog SET detail = '{\"x\": 1}' WHERE id = %s", [entries[2].pk]),
    )
    with pytest.raises(CommandError, match=f"broken at entry {entries[2].pk}"):
        verify_audit()


def test_a_rewritten_audit_digest_is_detected_by_its_anchor(
    transactional_db: None, anchor_file: Path
) -> None:
    for n in range(5):
        audit("test.recorded", actor_label="pytest", object_id=str(n))
    anchored = min(int(str(r["id"])) for r in lines(anchor_file, "audit"))
    # Whoever held the key could recompute every digest from here; the anchor still
    # holds the old one.
    key = "another-key"
    with override_settings(AERO_AUDIT_KEY=key):
        rows = list(AuditLog.objects.order_by("id"))
        previous = chain_start = "0" * 64
        updates = []
        for row in rows:
            row.prev_digest = previous
            row.digest = previous = row.compute_digest()
            updates.append(
                (
                    "UPDATE aero_auditlog SET prev_digest = %s, digest = %s WHERE id = %s",
                    [row.prev_digest, row.digest, row.pk],
                )
            )
        assert chain_start == GENESIS
        as_owner(*updates)
        with pytest.raises(CommandError, match=f"entry {anchored} does not have the hash"):
            verify_audit()


# --- the event log --------------------------------------------------------------------


@pytest.fixture
def session(builtin: None, make_user: Callable[..., User], anchor_file: Path) -> Session:
    made = waiting_session(make_user("olga", "operator"))
    made.refresh_from_db()
    return made


def test_new_events_are_keyed_and_anchored(session: Session, anchor_file: Path) -> None:
    events = list(Event.objects.filter(session=session).order_by("seq"))
    assert all(chain.is_keyed(e.hash) and len(e.hash) == 64 for e in events)
    assert events[0].hash == event_hash(GENESIS, events[0])
    with override_settings(AERO_AUDIT_KEY="another-key"):
        assert events[0].hash != event_hash(GENESIS, events[0])  # the key matters
    anchored = lines(anchor_file, "event")
    assert anchored and {r["session"] for r in anchored} == {str(session.pk)}
    assert verify_chain(session.pk).ok


def test_a_session_of_plain_links_still_verifies(session: Session) -> None:
    """Events written before the chain was keyed keep their sha256 links."""
    previous = GENESIS
    updates = []
    for event in Event.objects.filter(session=session).order_by("seq"):
        previous = event_hash(previous, event, keyed=False)
        updates.append(("UPDATE diagnosis_event SET hash = %s WHERE id = %s", [previous, event.pk]))
    updates.append(
        ("UPDATE diagnosis_session SET chain_head = %s WHERE id = %s", [previous, session.pk])
    )
    with override_settings(AERO_ANCHOR_EVERY=0, AERO_ANCHOR_FILE=Path("/nonexistent/anchors")):
        as_owner(*updates)
        assert verify_chain(session.pk).ok


def test_a_cut_event_tail_is_detected_against_the_anchors(
    session: Session, anchor_file: Path
) -> None:
    anchored = max(int(str(r["seq"])) for r in lines(anchor_file, "event"))
    keep = anchored - 1
    head = Event.objects.get(session=session, seq=keep).hash
    as_owner(
        ("DELETE FROM diagnosis_event WHERE session_id = %s AND seq > %s", [session.pk, keep]),
        (
            "UPDATE diagnosis_session SET last_seq = %s, chain_head = %s WHERE id = %s",
            [keep, head, session.pk],
        ),
    )

    report = verify_chain(session.pk)

    assert not report.ok
    assert f"seq {anchored}, anchored at" in report.problem and "cut" in report.problem


def test_a_chain_recomputed_without_the_key_is_detected(
    session: Session, anchor_file: Path
) -> None:
    target = Event.objects.get(session=session, type="finding.recorded", payload__kind="risk")
    # The owner edits a payload and recomputes every link after it as plain sha256 (it
    # has no key): a chain that is whole, and unkeyed from the start to pass as old.
    updates = []
    previous = GENESIS
    for event in Event.objects.filter(session=session).order_by("seq"):
        if event.pk == target.pk:
            event.payload = {**event.payload, "level": "LOW"}
            updates.append(
                (
                    "UPDATE diagnosis_event SET payload = %s WHERE id = %s",
                    [json.dumps(event.payload), event.pk],
                )
            )
        previous = event_hash(previous, event, keyed=False)
        updates.append(("UPDATE diagnosis_event SET hash = %s WHERE id = %s", [previous, event.pk]))
    updates.append(
        ("UPDATE diagnosis_session SET chain_head = %s WHERE id = %s", [previous, session.pk])
    )
    as_owner(*updates)

    report = verify_chain(session.pk)

    assert not report.ok
    assert "does not have the hash anchored" in report.problem


def test_a_plain_link_after_keyed_ones_is_refused(session: Session) -> None:
    last = Event.objects.get(session=session, seq=session.last_seq)
    previous = Event.objects.get(session=session, seq=session.last_seq - 1)
    plain = event_hash(previous.hash, last, keyed=False)
    as_owner(
        ("UPDATE diagnosis_event SET hash = %s WHERE id = %s", [plain, last.pk]),
        ("UPDATE diagnosis_session SET chain_head = %s WHERE id = %s", [plain, session.pk]),
    )
    with override_settings(AERO_ANCHOR_EVERY=0, AERO_ANCHOR_FILE=Path("/nonexistent/anchors")):
        report = verify_chain(session.pk)
    assert not report.ok and report.first_bad_seq == last.seq
    assert "not keyed after keyed links" in report.problem


def test_anchor_heads_at_shutdown(session: Session, anchor_file: Path) -> None:
    audit("test.recorded", actor_label="pytest")
    anchor_file.unlink(missing_ok=True)

    call_command("anchor_heads", stdout=io.StringIO())

    newest = AuditLog.objects.latest("id")
    assert [(r["id"], r["head"]) for r in lines(anchor_file, "audit")] == [
        (newest.pk, newest.digest)
    ]
    assert [(r["seq"], r["head"]) for r in lines(anchor_file, "event")] == [
        (session.last_seq, session.chain_head)
    ]
