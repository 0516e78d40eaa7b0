"""Issue 37 item 3: a timeline row is rendered once and shared (diagnosis/timeline_rows.py).
A page shown again renders no row; the live fragment reuses the page's rows; and a row is
never shown to a viewer it was not rendered for: an auditor's masked row is not the
operator's, a row in Chinese is not the English one, and a row an auditor was shown
before a value became hidden is not shown again once it is.

Personas: olga operates, carol audits."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from diagnosis import timeline_rows
from diagnosis.eventlog import names
from diagnosis.events import append_event
from diagnosis.live_render import Pull, render_batch, render_updates
from diagnosis.models import Session, ToolCall
from tests.web_helpers import login, waiting_session

pytestmark = pytest.mark.services

SECRET = "RWY-SECRET-31C"  # the runway an R3 action closes: auditors see it masked


@pytest.fixture
def carol(make_user: Callable[..., User]) -> User:
    return make_user("carol", "auditor")


@pytest.fixture
def session(builtin: None, olga: User) -> Session:
    return waiting_session(olga)


@pytest.fixture
def row_renders(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every row the module renders (a cached one is not rendered)."""
    rendered: list[Any] = []
    original = timeline_rows.render_to_string

    def counting(template: str, context: dict[str, Any]) -> str:
        rendered.append(context["event"].seq)
        return original(template, context)

    monkeypatch.setattr(timeline_rows, "render_to_string", counting)
    return rendered


def row(html: str, seq: int) -> str:
    start = html.index(f'<li id="event-{seq}"')
    return html[start : html.index("</li>", start)]


def test_a_page_shown_again_renders_no_row_and_reads_no_more(
    session: Session, olga: User, row_renders: list[Any]
) -> None:
    as_olga = login(olga)
    first = as_olga.get(f"/sessions/{session.pk}/").content.decode()
    shown = [int(seq) for seq in re.findall(r'<li id="event-\d+" data-seq="(\d+)"', first)]
    assert shown and sorted(row_renders) == shown
    row_renders.clear()
    with CaptureQueriesContext(connection) as queries:
        again = as_olga.get(f"/sessions/{session.pk}/").content.decode()
    assert row_renders == []
    assert re.findall(r'<li id="event-\d+".*?</li>', again, re.S) == re.findall(
        r'<li id="event-\d+".*?</li>', first, re.S
    )
    # The cache is not the database: the page's statements are what they were.
    from tests.test_query_budgets import SESSION_PAGE

    assert len(queries) <= SESSION_PAGE


def test_the_live_fragment_reuses_the_rows_a_page_rendered(
    session: Session, olga: User, row_renders: list[Any]
) -> None:
    append_event(session.pk, names.AGENT_NOTE, {"text": "crew on the way"}, producer="test")
    session.refresh_from_db()
    page = login(olga).get(f"/sessions/{session.pk}/").content.decode()
    row_renders.clear()
    update = render_updates(frozenset({"operator"}), session.pk, session.last_seq - 1)
    assert update is not None
    assert row_renders == []
    assert row(update.html, session.last_seq) == row(page, session.last_seq)


def test_a_live_batch_reads_and_stores_its_rows_once_whatever_its_sessions(
    builtin: None, olga: User, row_renders: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live push renders a dozen sessions a batch: their rows are read from the cache
    in one call and stored in one (two Redis round trips a session before), and a row
    two pulls of the batch show is rendered once."""
    sessions = [waiting_session(olga) for _ in range(3)]
    for n, each in enumerate(sessions):
        append_event(each.pk, names.AGENT_NOTE, {"text": f"note {n}"}, producer="test")
        each.refresh_from_db()
    reads: list[list[str]] = []
    stores: list[dict[str, str]] = []
    read, store = timeline_rows._read, timeline_rows._store

    def counted_read(keys: list[str]) -> dict[str, str]:
        reads.append(keys)
        return read(keys)

    def counted_store(rendered: dict[str, str]) -> None:
        stores.append(rendered)
        store(rendered)

    monkeypatch.setattr(timeline_rows, "_read", counted_read)
    monkeypatch.setattr(timeline_rows, "_store", counted_store)
    operator = frozenset({"operator"})
    pulls = [Pull(operator, str(each.pk), each.last_seq - 1, None, "en") for each in sessions]
    # The same new event for a page with another answer box: another fragment, same row.
    pulls.append(Pull(operator, str(sessions[0].pk), sessions[0].last_seq - 1, "other", "en"))
    updates = render_batch(pulls)
    assert len(reads) == 1 and len(reads[0]) == 3
    assert len(stores) == 1 and len(stores[0]) == 3
    assert sorted(row_renders) == sorted(each.last_seq for each in sessions)
    for update, each in zip(updates, [*sessions, sessions[0]], strict=True):
        assert update is not None
        assert f'data-seq="{each.last_seq}"' in update.html
    # Stored for the page and every other render: none rendered again.
    row_renders.clear()
    again = render_batch(
        [Pull(operator, str(each.pk), each.last_seq - 1, "x", "en") for each in sessions]
    )
    assert row_renders == []
    for update, before, each in zip(again, updates, sessions, strict=False):
        assert update is not None and before is not None
        assert row(update.html, each.last_seq) == row(before.html, each.last_seq)


def test_an_auditor_is_never_shown_the_operators_row(
    session: Session, olga: User, carol: User
) -> None:
    payload = {"tool_name": "close_runway", "risk_level": "R3", "args": {"runway": SECRET}}
    append_event(session.pk, names.APPROVAL_REQUIRED, payload, producer="test")
    session.refresh_from_db()
    seq = session.last_seq
    operators = login(olga).get(f"/sessions/{session.pk}/").content.decode()
    assert SECRET in row(operators, seq)
    auditors = login(carol).get(f"/sessions/{session.pk}/").content.decode()
    assert SECRET not in row(auditors, seq)


def test_a_row_shown_before_its_value_was_hidden_is_not_shown_again(
    session: Session, carol: User
) -> None:
    """An agent note naming a runway no action hides yet reads plainly; once an R3 action
    on that runway is logged, the same note's row hides it (the masked copy is another
    row)."""
    append_event(session.pk, names.AGENT_NOTE, {"text": f"{SECRET} looks clear"}, producer="test")
    session.refresh_from_db()
    note = session.last_seq
    as_carol = login(carol)
    assert SECRET in row(as_carol.get(f"/sessions/{session.pk}/").content.decode(), note)
    # An R3 closure of that runway: its arguments are hidden from auditors everywhere.
    ToolCall.objects.create(
        session=session,
        call_id=f"action:close_runway:runway={SECRET}",
        tool_name="close_runway",
        risk_class="R3",
        is_action=True,
        idempotency_key=f"{session.pk}:close_runway:{SECRET}",
        request_payload={"runway": SECRET},
        status="awaiting_approval",
        position=99,
    )
    after = as_carol.get(f"/sessions/{session.pk}/").content.decode()
    assert SECRET not in row(after, note)


def test_a_row_is_worded_in_the_readers_language(session: Session, olga: User) -> None:
    append_event(
        session.pk,
        names.AGENT_QUESTION,
        {"key": "q-test", "field": "flight", "text": "which flight?"},
        producer="test",
    )
    session.refresh_from_db()
    as_olga = login(olga)
    english = row(as_olga.get(f"/sessions/{session.pk}/").content.decode(), session.last_seq)
    as_olga.cookies[settings.LANGUAGE_COOKIE_NAME] = "zh-hans"
    chinese = row(as_olga.get(f"/sessions/{session.pk}/").content.decode(), session.last_seq)
    assert "agent asks" in english
    assert "智能体提问" in chinese
