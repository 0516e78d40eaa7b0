"""The event log is hash-chained per session: an edited or deleted row is detected, and
`manage.py verify_chain` names the first bad seq and exits non-zero."""

from __future__ import annotations

from collections.abc import Callable
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection

from diagnosis.chain import GENESIS, event_hash, verify_chain
from diagnosis.models import Event, Session
from tests.web_helpers import waiting_session

pytestmark = pytest.mark.services


@pytest.fixture
def session(builtin: None, make_user: Callable[..., User]) -> Session:
    return waiting_session(make_user("olga", "operator"))


def verify(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("verify_chain", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue() + str(exc)
    return 0, out.getvalue()


def test_an_untouched_chain_verifies(session: Session) -> None:
    session.refresh_from_db()
    report = verify_chain(session.pk)
    assert report.ok and report.first_bad_seq is None
    assert report.checked == session.last_seq > 10
    assert report.head == session.chain_head != GENESIS
    # Each link is sha256(previous hash || canonical event), from 64 zeros.
    events = list(Event.objects.filter(session=session).order_by("seq"))
    assert events[0].hash == event_hash(GENESIS, events[0])
    assert events[1].hash == event_hash(events[0].hash, events[1])
    code, out = verify(str(session.pk))
    assert code == 0
    assert f"ok   {session.pk}  {session.last_seq} events  head {session.chain_head}" in out


def test_an_edited_payload_is_detected(session: Session) -> None:
    target = Event.objects.get(session=session, type="finding.recorded", payload__kind="risk")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE diagnosis_event SET payload = jsonb_set(payload, '{level}', '\"LOW\"') "
            "WHERE id = %s",
            [target.pk],
        )
    report = verify_chain(session.pk)
    assert not report.ok
    assert report.first_bad_seq == target.seq and report.checked == target.seq - 1
    code, out = verify()  # every session
    assert code == 2
    assert f"BAD  {session.pk}  first bad seq {target.seq}" in out
    assert "1 broken chain(s)" in out


def test_a_deleted_row_is_detected(session: Session) -> None:
    target = Event.objects.get(session=session, type="finding.recorded", payload__kind="impact")
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM diagnosis_event WHERE id = %s", [target.pk])
    report = verify_chain(session.pk)
    assert (report.ok, report.first_bad_seq) == (False, target.seq)
    assert "missing" in report.problem
    code, out = verify(str(session.pk))
    assert code == 2 and f"first bad seq {target.seq}" in out


def test_a_deleted_last_row_and_a_rewritten_hash_are_detected(session: Session) -> None:
    session.refresh_from_db()
    last = Event.objects.get(session=session, seq=session.last_seq)
    Event.objects.filter(pk=last.pk).delete()
    report = verify_chain(session.pk)
    assert (report.ok, report.first_bad_seq) == (False, session.last_seq)

    # Re-inserting a forged last event with a freshly computed hash does not match the
    # head the session kept.
    forged = Event(
        session_id=session.pk,
        seq=last.seq,
        type=last.type,
        ts=last.ts,
        payload={**last.payload, "reason": "forged"},
        producer=last.producer,
        trace_id=last.trace_id,
    )
    previous = Event.objects.get(session=session, seq=last.seq - 1)
    forged.hash = event_hash(previous.hash, forged)
    forged.save(force_insert=True)
    report = verify_chain(session.pk)
    assert not report.ok and "chain head" in report.problem


def test_unknown_session_is_a_clear_error(db: None) -> None:
    code, out = verify("not-a-uuid")
    assert code == 1 and "is not a session id" in out
    code, out = verify("00000000-0000-0000-0000-000000000000")
    assert code == 1 and "no session" in out
