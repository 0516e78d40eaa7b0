"""No single event or fragment can exceed what the WebSocket path carries: an event over
the per-event cap is refused at append (or, for generated text, cut with a marker), and
both consumers split a catch-up over large events into messages daphne accepts (over
1 MB it closes the socket with 1011), losing nothing."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from playwright.sync_api import Browser, expect
from websockets.sync.client import ClientConnection, connect

from aero.text import MAX_EVENT_BYTES, MAX_MODEL_TEXT, EventTooLarge
from api import consumers as api_consumers
from diagnosis import live_render
from diagnosis.actions import do_create_session
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.events import append_event, event_batch
from diagnosis.models import Event, Report, Session
from diagnosis.reporting import MAX_REPORT_CHARS, write_report
from scenarios_admin.models import Scenario
from tests.api_helpers import token_for
from tests.browser_helpers import sign_in
from tests.llm_helpers import fake_llm, fake_provider

__all__ = ["fake_llm"]  # the fixture

pytestmark = pytest.mark.services
SEQ = re.compile(r'data-seq="(\d+)"')
# A note whose timeline row is ~4x its payload ("<" is escaped to "&lt;"): 60,000 of them
# make a 60 KB event and a 240 KB row; a few such rows already overflow one message.
WIDE_NOTE = "<" * 60_000
# Under the event cap, but its row alone (~800 KB) cannot go in any one message.
HUGE_ROW_NOTE = "<" * 200_000


def new_session(user: User) -> Session:
    session = do_create_session(user, Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏")
    session.refresh_from_db()
    return session


def add_notes(session: Session, texts: list[str]) -> int:
    for text in texts:
        append_event(session.pk, "agent.note", {"text": text}, producer="test")
    session.refresh_from_db()
    return session.last_seq


# --- the per-event cap ----------------------------------------------------------------


def test_an_event_over_the_cap_is_refused_with_a_clear_error_and_nothing_is_written(
    builtin: None, make_user: Callable[..., User]
) -> None:
    session = new_session(make_user("olga", "operator"))
    before = session.last_seq
    # Bytes, not characters: 70,000 emoji are 280 KB of UTF-8.
    with pytest.raises(EventTooLarge, match=r"agent\.note event of \d+ bytes is over the"):
        append_event(session.pk, "agent.note", {"text": "😀" * 70_000}, producer="test")
    # Inside a graph step's batch the refusal comes at once, before anything is written.
    with pytest.raises(EventTooLarge), transaction.atomic(), event_batch(session.pk):
        append_event(session.pk, "agent.note", {"text": "fits"}, producer="test")
        append_event(session.pk, "agent.note", {"text": "x" * MAX_EVENT_BYTES}, producer="test")
    session.refresh_from_db()
    assert session.last_seq == before
    assert Event.objects.filter(session=session).count() == before
    # Right at the cap it is written whole.
    room = MAX_EVENT_BYTES - len(json.dumps({"text": ""}))
    event = append_event(session.pk, "agent.note", {"text": "x" * room}, producer="test")
    assert Event.objects.get(pk=event.pk).payload["text"] == "x" * room


def test_a_report_too_large_for_one_event_is_cut_with_a_marker_the_row_and_event_agree(
    builtin: None, make_user: Callable[..., User]
) -> None:
    session = new_session(make_user("olga", "operator"))
    definition = session.scenario_version.definition
    long_line = "结论：" + "很长的报告。" * 10_000  # 60,003 characters of the template's own text
    definition = {**definition, "report_template": {"zh": long_line, "en": long_line}}
    text = write_report(session.pk, definition, {}, producer="test")
    event = Event.objects.get(session=session, type="report.ready")
    assert event.payload["markdown"] == text == Report.objects.get(session=session).markdown
    assert event.payload["cut_from_chars"] == len(long_line) + 1  # with its final newline
    assert text.startswith(long_line[:1000])
    assert text.endswith(
        f"[… cut by AERO: {len(long_line) + 1 - MAX_REPORT_CHARS} of "
        f"{len(long_line) + 1} characters not kept]"
    )
    # A report that fits is never marked.
    short = write_report(session.pk, session.scenario_version.definition, {}, producer="t2")
    assert "cut by AERO" not in short


def test_a_runaway_model_note_is_kept_up_to_its_limit_and_marked_as_cut(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    from tests.test_react import EXAMPLE_ONE, EXTRACTION, reasoning_rules

    rules = reasoning_rules()
    runaway = "先查航班和机位。" * 20_000  # 180,000 characters, 540 KB: over the event cap
    rules[-1] = {**rules[-1], "content": runaway}
    fake_llm.set_script({"rules": [EXTRACTION, *rules]})
    fake_provider(fake_llm)
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), EXAMPLE_ONE
    )
    session.refresh_from_db()
    assert session.status != "failed"  # the session carried on
    note = Event.objects.filter(session=session, type="agent.note").order_by("seq").first()
    assert note is not None
    assert note.payload["cut_from_chars"] == len(runaway)
    assert note.payload["text"] == (
        runaway[:MAX_MODEL_TEXT]
        + f"\n\n[… cut by AERO: {len(runaway) - MAX_MODEL_TEXT} of {len(runaway)} "
        "characters not kept]"
    )
    # A note that fits is kept as the model wrote it, unmarked.
    later = Event.objects.filter(session=session, type="agent.note").order_by("seq")[1]
    assert "cut_from_chars" not in later.payload


# --- the session page's live timeline ---------------------------------------------------


def cookie_for(user: User) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def page_socket(base: str, session: Session, user: User) -> ClientConnection:
    url = base.replace("http://", "ws://") + f"/ws/sessions/{session.pk}/?last_seq=0&lang=en"
    # No client-side size limit: the test measures what the server sends.
    # max_queue=None: frames the test leaves unread never stop the client reading, so
    # its close sees the server's close frame (past 16 unread frames websockets stops
    # reading and every close waited out its 10 s timeout).
    return connect(
        url,
        open_timeout=10,
        max_queue=None,
        max_size=None,
        additional_headers={"Cookie": cookie_for(user), "Origin": base},
    )


def test_catch_up_over_many_large_events_arrives_whole_in_messages_daphne_accepts(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    operator = make_user("olga", "operator")
    session = new_session(operator)
    first_note = session.last_seq + 1
    last = add_notes(session, [WIDE_NOTE] * 20 + [HUGE_ROW_NOTE, "the end"])
    huge_seq = last - 1

    sizes: list[int] = []
    seqs: list[int] = []
    html = ""
    with page_socket(asgi_server, session, operator) as ws:
        while not seqs or seqs[-1] < last:
            message = ws.recv(timeout=20)  # a 1011 close would raise here
            assert isinstance(message, str)
            sizes.append(len(message.encode()))
            seqs += [int(s) for s in SEQ.findall(message)]
            html += message
    assert seqs == list(range(1, last + 1))  # every event once, in order
    assert max(sizes) <= live_render.FRAME_BYTES < 1024 * 1024
    assert len(sizes) > 5  # 4.8 MB of rows could not have come in one message
    assert html.count("&lt;" * 60_000) == 20  # each wide note whole
    # The one row no message can hold points to where it can be read.
    pointer = re.search(rf'<li id="event-{huge_seq}"[^>]*class="ev too-large">(.*?)</li>', html)
    assert pointer is not None
    assert "too large to show live" in pointer.group(1)
    link = re.search(r'href="([^"]+)"', pointer.group(1))
    assert link is not None
    page = Client()
    page.force_login(operator)
    shown = page.get(link.group(1).replace("&amp;", "&")).content.decode()
    assert "&lt;" * 200_000 in shown  # all of it, over HTTP
    assert first_note < huge_seq


def test_the_open_page_receives_every_large_event_live_and_a_link_for_the_huge_one(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    operator = make_user("olga", "operator")
    session = new_session(operator)
    page = sign_in(browser, asgi_server, operator)
    try:
        page.goto(f"{asgi_server}/sessions/{session.pk}/")
        rows = page.locator("#timeline-list > li[data-seq]")
        expect(rows.last).to_have_attribute("data-seq", str(session.last_seq))
        before = rows.count()
        # Appended while the page is open: ~2 MB of rows, pushed as several messages.
        last = add_notes(session, [WIDE_NOTE] * 8 + [HUGE_ROW_NOTE, "the end"])
        expect(rows.last).to_have_attribute("data-seq", str(last), timeout=30_000)
        assert rows.count() == before + 10  # every one, once
        expect(page.locator(f"#event-{last - 1}")).to_contain_text("too large to show live")
        expect(page.locator(f"#event-{last - 2}")).to_contain_text("<" * 1000)
        expect(page.locator(f"#event-{last}")).to_contain_text("the end")
    finally:
        page.context.close()


# --- the API stream -------------------------------------------------------------------


def api_stream(base: str, session: Session, token: str) -> ClientConnection:
    url = base.replace("http://", "ws://") + f"/ws/api/sessions/{session.pk}?last_seq=0"
    return connect(
        url,
        open_timeout=10,
        max_queue=None,
        max_size=None,
        additional_headers={"Authorization": f"Bearer {token}"},
    )


def test_api_stream_catch_up_over_large_events_loses_nothing_and_points_to_an_oversized_one(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    operator = make_user("olga", "operator")
    token = token_for(make_user("watcher", "operator"))
    session = new_session(operator)
    add_notes(session, ["😀" * 40_000] * 12)  # 160 KB each, 480 KB as the stream's JSON
    # An event stored before the cap existed: 700 KB of emoji, 8 MB as escaped JSON.
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        legacy = Event.objects.create(
            session=locked,
            seq=locked.last_seq + 1,
            type="agent.note",
            payload={"text": "😀" * 175_000},
            producer="legacy",
        )
        Session.objects.filter(pk=session.pk).update(last_seq=legacy.seq)
    last = add_notes(session, ["after"])

    got: list[dict[str, Any]] = []
    sizes: list[int] = []
    with api_stream(asgi_server, session, token) as ws:
        while not got or got[-1]["seq"] < last:
            message = ws.recv(timeout=20)
            assert isinstance(message, str)
            sizes.append(len(message.encode()))
            got.append(json.loads(message))
    assert [e["seq"] for e in got] == list(range(1, last + 1))
    assert max(sizes) <= api_consumers.FRAME_BYTES
    assert [e["payload"]["text"] for e in got[legacy.seq - 13 : legacy.seq - 1]] == [
        "😀" * 40_000
    ] * 12
    notice = got[legacy.seq - 1]
    assert notice["type"] == "event.too_large"
    assert notice["event_id"] == str(legacy.event_id)
    assert notice["payload"]["event_type"] == "agent.note"
    # The notice names the REST call that returns the event whole.
    response = Client().get(
        notice["payload"]["fetch"], headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200
    assert response.json()["events"][0]["payload"]["text"] == "😀" * 175_000


# --- alerts: what an outside system sends ----------------------------------------------


def test_an_alert_with_a_huge_annotation_is_kept_cut_with_a_marker(
    builtin: None, settings: Any
) -> None:
    """Refused, the alert would be lost (Alertmanager gives up on a 4xx); kept whole, it
    would make an event over the per-event cap. It is kept, the value cut and marked."""
    from ingest.models import Observation
    from ingest.schemas import MAX_LABEL_VALUE
    from tests.test_ingest import SECRET, am_alert, post, v4

    settings.AERO_INGEST_SECRET = SECRET
    alert = am_alert()
    alert["annotations"]["summary"] = "😀" * 70_000  # 280 KB: an event over the cap
    response = post("/ingest/alertmanager", v4("firing", alert))
    assert response.status_code == 200
    summary = Observation.objects.get().annotations["summary"]
    assert len(summary) == MAX_LABEL_VALUE
    assert summary.startswith("😀😀") and summary.endswith(" …[cut: 70,000 characters]")
