"""The live timeline over a real WebSocket against daphne in another process: pushed
events arrive, a reconnect with last_seq loses nothing and repeats nothing, and the
socket refuses whoever may not watch."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from aero.roles import user_roles
from diagnosis import presenters
from diagnosis.actions import do_answer, do_correct_fact, do_create_session
from diagnosis.events import append_event
from diagnosis.live_render import render_updates
from diagnosis.models import Session
from scenarios_admin.models import Scenario

pytestmark = pytest.mark.services
SEQ = re.compile(r'data-seq="(\d+)"')


def cookie_for(user: User) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def ws_url(base: str, session: Session, last_seq: int | None = None) -> str:
    # lang=en as the English page sends it (the server's default is zh-hans)
    url = base.replace("http://", "ws://") + f"/ws/sessions/{session.pk}/?lang=en"
    return url if last_seq is None else f"{url}&last_seq={last_seq}"


def open_socket(
    base: str, session: Session, user: User, last_seq: int | None = None
) -> ClientConnection:
    # max_queue=None: frames the test leaves unread never stop the client reading, so
    # its close sees the server's close frame (past 16 unread frames websockets stops
    # reading and every close waited out its 10 s timeout).
    return connect(
        ws_url(base, session, last_seq),
        open_timeout=10,
        max_queue=None,
        additional_headers={"Cookie": cookie_for(user), "Origin": base},
    )


def receive_until(
    ws: ClientConnection, done: Callable[[list[int], str], bool], timeout: float = 15
) -> tuple[list[int], str]:
    seqs: list[int] = []
    html = ""
    while not done(seqs, html):
        message = ws.recv(timeout=timeout)
        assert isinstance(message, str)
        html += message
        seqs += [int(s) for s in SEQ.findall(message)]
    return seqs, html


def updates(user: User, session_id: Any, after: int, key: str | None) -> tuple[str, int, Any]:
    update = render_updates(user_roles(user), session_id, after, key)
    assert update is not None
    return update.html, update.seq, update.composer_key


def new_session(user: User, text: str) -> Session:
    session = do_create_session(user, Scenario.objects.get(slug="oil_spill"), text)
    session.refresh_from_db()
    return session


def test_pushed_events_arrive_and_reconnect_catches_up(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    operator = make_user("olga", "operator")
    session = new_session(operator, "105机位燃油泄漏")  # asks for the flight first
    assert session.status == "waiting_user"
    first_batch = session.last_seq

    with open_socket(asgi_server, session, operator, last_seq=0) as ws:
        seqs, html = receive_until(ws, lambda s, _: bool(s) and s[-1] >= first_batch)
        assert seqs == list(range(1, first_batch + 1))
        assert "请提供涉事航班号" in html  # the question, rendered for this viewer

        do_answer(session.pk, operator, "CA1234")  # the job runs here; daphne only pushes
        session.refresh_from_db()
        assert session.last_seq > first_batch
        seqs, html = receive_until(ws, lambda s, _: bool(s) and s[-1] >= session.last_seq)
        assert seqs == list(range(first_batch + 1, session.last_seq + 1))
        assert re.search(r'<section id="session-composer"[^>]*hx-swap-oob="true"', html)
        assert "发动机目前是运转中还是已关车" in html  # the next question reached the page live
        seen = session.last_seq

    # While nobody watches, the session moves on.
    do_answer(session.pk, operator, "发动机运转，还在持续漏")
    session.refresh_from_db()
    assert session.last_seq > seen

    with open_socket(asgi_server, session, operator, last_seq=seen) as ws:
        seqs, html = receive_until(ws, lambda s, _: bool(s) and s[-1] >= session.last_seq)
        assert seqs == list(range(seen + 1, session.last_seq + 1))  # nothing lost, nothing twice
        assert "Proposed:" in html


def test_an_event_whose_notice_was_lost_reaches_an_idle_page(
    builtin: None,
    asgi_server: str,
    make_user: Callable[..., User],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis down or a full channel loses a notice: the server's periodic resync (1 s
    here, AERO_LIVE_RESYNC_SECONDS) still brings the event to a page that is caught up
    and quiet, once."""
    operator = make_user("olga", "operator")
    session = new_session(operator, "105机位燃油泄漏")
    with open_socket(asgi_server, session, operator, last_seq=0) as ws:
        seqs, _ = receive_until(ws, lambda s, _: bool(s) and s[-1] >= session.last_seq)
        assert seqs == list(range(1, session.last_seq + 1))
        # The notice of the next event is lost: nothing is published at all.
        monkeypatch.setattr("diagnosis.eventlog.write.notify_session", lambda *args: None)
        quiet = append_event(session.pk, "agent.note", {"text": "no notice"}, producer="test")
        seqs, html = receive_until(ws, lambda s, _: bool(s), timeout=10)
        assert seqs == [quiet.seq]
        assert "no notice" in html
        with pytest.raises(TimeoutError):  # and only once
            ws.recv(timeout=2.5)


TIMELINE_SEQ = re.compile(r'<li id="event-\d+" data-seq="(\d+)"')
FLUID = re.compile(r'<td data-field="fluid_type">([^<]*)</td>')
WS_LAST_SEQ = re.compile(r'ws-connect="[^"]*last_seq=(\d+)')


def test_a_page_rendered_while_the_agent_writes_catches_up_on_what_it_missed(
    builtin: None,
    asgi_server: str,
    make_user: Callable[..., User],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job commits between the page's read of the session row and its read of the
    timeline (here: the operator's correction, run at once). The page shows one moment,
    the row's: its timeline ends where its panels were worded, so its socket (which asks
    for what follows the timeline's last row, static/aero/aero.js) gets the rest with the
    panels they change. The timeline once ran ahead: the socket asked for nothing more
    and the facts stayed stale until a reload (a CI run of the browser test saw it)."""
    operator = make_user("olga", "operator")
    session = new_session(operator, "CA1234 燃油泄漏，发动机运转，持续泄漏")
    assert session.status == "waiting_user" and session.snapshot["fields"]["fluid_type"] == "FUEL"
    context = presenters.session_context

    def then_the_job_commits(*args: Any, **kwargs: Any) -> dict[str, Any]:
        worded = context(*args, **kwargs)
        do_correct_fact(session.pk, operator, "fluid_type", "HYDRAULIC")  # runs inline
        return worded

    monkeypatch.setattr(presenters, "session_context", then_the_job_commits)
    client = Client(HTTP_ACCEPT_LANGUAGE="en")
    client.force_login(operator)
    page = client.get(f"/sessions/{session.pk}/").content.decode()
    monkeypatch.undo()
    session.refresh_from_db()
    assert session.snapshot["fields"]["fluid_type"] == "HYDRAULIC"  # the job did commit

    assert FLUID.findall(page) == ["Fuel"]  # the panels: the row as read
    shown = [int(seq) for seq in TIMELINE_SEQ.findall(page)]
    assert shown[-1] == int(WS_LAST_SEQ.findall(page)[0]) < session.last_seq
    with open_socket(asgi_server, session, operator, last_seq=shown[-1]) as ws:
        seqs, html = receive_until(ws, lambda s, _: bool(s) and s[-1] >= session.last_seq)
    assert seqs == list(range(shown[-1] + 1, session.last_seq + 1))
    assert FLUID.findall(html) == ["Hydraulic fluid"]


COMPOSER = re.compile(r'<section id="session-composer"[^>]*data-key="([^"]*)"')


@pytest.mark.services
def test_the_composer_follows_the_session_whatever_events_a_batch_holds(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A question can be committed between the consumer's reads: its batch may hold only
    events that change no panel. The answer box must still follow, and the consumer must
    remember only what it really sent."""
    operator = make_user("olga", "operator")
    session = new_session(operator, "105机位燃油泄漏")
    assert session.snapshot["question"]["field"] == "flight_no"

    # The page still shows "working" and the only new event is a note.
    append_event(session.pk, "agent.note", {"text": "still here"}, producer="test")
    html, seq, key = updates(operator, session.pk, session.last_seq, "working:")
    assert seq == session.last_seq + 1
    assert key is not None and key.startswith("asking:")
    assert COMPOSER.findall(html) == [key]
    assert "请提供涉事航班号" in html

    # Once sent, a later event does not replace it (that would wipe a typed answer).
    append_event(session.pk, "agent.note", {"text": "still here"}, producer="test")
    html, seq, same_key = updates(operator, session.pk, seq, key)
    assert seq == session.last_seq + 2 and same_key == key
    assert COMPOSER.findall(html) == []

    # The answer closes the question: the very next push says the agent is working.
    monkeypatch.setattr("diagnosis.actions.enqueue_advance", lambda session_id: None)
    do_answer(session.pk, operator, "CA1234")  # no job runs: the agent has not resumed
    html, _, key = updates(operator, session.pk, seq, key)
    assert COMPOSER.findall(html) == ["working:"]
    assert "The agent is working" in html


def test_auditor_may_watch_but_gets_no_decision_forms(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    operator = make_user("olga", "operator")
    auditor = make_user("aude", "auditor")
    session = new_session(operator, "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏")
    with open_socket(asgi_server, session, auditor, last_seq=0) as ws:
        _, html = receive_until(ws, lambda s, _: bool(s) and s[-1] >= session.last_seq)
    assert "Proposed:" in html
    assert "Approve (1 of 2)" not in html and 'name="decision"' not in html


def test_only_the_pages_own_origin_may_open_a_socket_scheme_host_and_port(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    """A page on another port of the same host is another origin: its socket, carrying
    the operator's cookie, is refused at the handshake, as is another scheme. The
    configured page origins (the pages' port when sockets have their own) are let in."""
    operator = make_user("olga", "operator")
    session = new_session(operator, "105机位燃油泄漏")
    url = ws_url(asgi_server, session, 0)
    scheme, _, rest = asgi_server.partition("://")
    host, _, port = rest.partition(":")
    cookie = cookie_for(operator)

    def opens(origin: str) -> bool:
        headers = {"Origin": origin, "Cookie": cookie}
        try:
            with connect(url, open_timeout=10, max_queue=None, additional_headers=headers) as ws:
                return bool(ws.recv(timeout=10))
        except InvalidStatus:
            return False

    assert opens(asgi_server)
    assert not opens(f"{scheme}://{host}:{int(port) + 1}")  # another port, same host
    assert not opens(f"https://{host}:{port}")  # another scheme
    assert not opens(f"{scheme}://{host}")  # the default port is another port too
    assert not opens("null")


def test_page_origins_compare_scheme_host_and_port(settings: Any) -> None:
    from aero.ws_origin import origin_allowed

    settings.ALLOWED_HOSTS = ["aero.example.org", "127.0.0.1"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://*.example.com"]
    settings.AERO_PAGE_ORIGINS = ["http://127.0.0.1:8000"]

    def allowed(origin: str, host: str = "aero.example.org", scheme: str = "wss") -> bool:
        headers = [(b"origin", origin.encode()), (b"host", host.encode())]
        return origin_allowed({"type": "websocket", "scheme": scheme, "headers": headers})

    assert allowed("https://aero.example.org")
    assert allowed("https://aero.example.org:443")
    assert not allowed("https://aero.example.org:8443")
    assert not allowed("http://aero.example.org")  # a wss socket's page is https
    assert not allowed("https://aero.example.org", host="evil.example")  # not an allowed host
    assert allowed("https://ops.example.com") and not allowed("http://ops.example.com")
    assert not allowed("https://ops.example.com:444")
    # run.sh with Redis: pages on :8000, sockets on :8001.
    assert allowed("http://127.0.0.1:8000", host="127.0.0.1:8001", scheme="ws")
    assert not allowed("http://127.0.0.1:9000", host="127.0.0.1:8001", scheme="ws")
    assert allowed("http://127.0.0.1:8001", host="127.0.0.1:8001", scheme="ws")


def test_sockets_on_their_own_port_accept_the_pages_port_by_default(tmp_path: Any) -> None:
    """make run with Redis: pages on AERO_PORT, sockets on AERO_WS_URL's port."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AERO_", "DJANGO_"))}
    env.pop("DATABASE_URL", None)
    env.update(AERO_DATA_DIR=str(tmp_path), AERO_WS_URL="ws://10.0.0.5:9001", AERO_HOST="10.0.0.5")
    env["AERO_PORT"] = "9000"
    code = "from aero import settings; print(settings.AERO_PAGE_ORIGINS)"
    shown = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.stdout.strip() == "['http://10.0.0.5:9000']", shown.stderr


def test_socket_refuses_anonymous_roleless_and_missing_origin(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    operator = make_user("olga", "operator")
    nobody = make_user("nemo")
    session = new_session(operator, "105机位燃油泄漏")
    url = ws_url(asgi_server, session, 0)

    def refused(headers: dict[str, Any]) -> bool:
        try:
            with connect(url, open_timeout=10, max_queue=None, additional_headers=headers) as ws:
                ws.recv(timeout=5)
        except InvalidStatus:
            return True
        except Exception:
            return True  # closed right after the handshake
        return False

    assert refused({"Origin": asgi_server})  # anonymous
    assert refused({"Origin": asgi_server, "Cookie": cookie_for(nobody)})  # no role
    assert refused({"Cookie": cookie_for(operator)})  # no Origin header
    assert refused({"Origin": "http://evil.example", "Cookie": cookie_for(operator)})
