"""The JSON event stream for API clients over a real WebSocket against daphne: catch-up
from last_seq, live pushes, and a connection dropped mid-stream that loses nothing and,
after dedupe by event_id, repeats nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from api.models import ApiToken
from diagnosis.actions import do_answer, do_create_session
from diagnosis.models import Event, Session
from scenarios_admin.models import Scenario
from tests.api_helpers import call, token_for

pytestmark = pytest.mark.services
ENVELOPE = {"event_id", "session_id", "type", "ts", "seq", "payload"}


def stream(
    base: str, session_id: Any, token: str | None, last_seq: int = 0, in_query: bool = False
) -> ClientConnection:
    url = base.replace("http://", "ws://") + f"/ws/api/sessions/{session_id}?last_seq={last_seq}"
    headers = {}
    if token and in_query:
        url += f"&token={token}"
    elif token:
        headers["Authorization"] = f"Bearer {token}"
    # No Origin header: API clients are not browsers.
    # max_queue=None: frames the test leaves unread never stop the client reading, so
    # its close sees the server's close frame (past 16 unread frames websockets stops
    # reading and every close waited out its 10 s timeout).
    return connect(url, open_timeout=10, max_queue=None, additional_headers=headers)


def receive(
    ws: ClientConnection, count: int | None = None, until_seq: int | None = None
) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while (count is None or len(got) < count) and (
        until_seq is None or not got or got[-1]["seq"] < until_seq
    ):
        message = ws.recv(timeout=15)
        assert isinstance(message, str)
        got.append(json.loads(message))
    return got


def test_catch_up_live_push_and_a_dropped_connection(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    operator = make_user("olga", "operator")
    token = token_for(make_user("watcher", "auditor"))
    session = do_create_session(operator, Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏")
    session.refresh_from_db()
    asked = session.last_seq

    received: list[dict[str, Any]] = []
    with stream(asgi_server, session.pk, token) as ws:
        caught_up = receive(ws, until_seq=asked)
        assert [e["seq"] for e in caught_up] == list(range(1, asked + 1))
        assert all(set(e) == ENVELOPE for e in caught_up)
        assert caught_up[0]["type"] == "session.created"
        assert caught_up[0]["session_id"] == str(session.pk)
        first_event = Event.objects.get(session=session, seq=1)
        assert caught_up[0]["event_id"] == str(first_event.event_id)
        assert caught_up[0]["payload"] == first_event.payload
        received += caught_up

        do_answer(session.pk, operator, "CA1234")  # the agent runs here; daphne pushes
        session.refresh_from_db()
        assert session.last_seq > asked + 3
        received += receive(ws, count=3)  # then the connection drops mid-stream
    assert received[-1]["seq"] < session.last_seq

    # The client reconnects from the seq it is sure of; it may get a duplicate, never a gap.
    resume_from = received[-1]["seq"] - 1
    with stream(asgi_server, session.pk, token, last_seq=resume_from, in_query=True) as ws:
        received += receive(ws, until_seq=session.last_seq)

    seen: set[str] = set()
    deduped = []
    for event in received:
        if event["event_id"] not in seen:
            seen.add(event["event_id"])
            deduped.append(event)
    assert len(received) > len(deduped), "at-least-once: the uncertain event came twice"
    assert [e["seq"] for e in deduped] == list(range(1, session.last_seq + 1))
    assert [e["event_id"] for e in deduped] == [
        str(i)
        for i in Event.objects.filter(session=session)
        .order_by("seq")
        .values_list("event_id", flat=True)
    ]


@pytest.mark.parametrize(
    ("who", "code"),
    [
        ("nobody", 4401),
        ("bad-token", 4401),
        ("revoked", 4401),
        ("no-role", 4403),
        ("unknown-session", 4403),
    ],
)
def test_the_stream_refuses_without_a_valid_token_or_access(
    builtin: None, asgi_server: str, make_user: Callable[..., User], who: str, code: int
) -> None:
    operator = make_user("olga", "operator")
    session: Any = do_create_session(
        operator, Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏"
    )
    token: str | None = token_for(operator)
    if who == "nobody":
        token = None
    elif who == "bad-token":
        token = "aero_nope"
    elif who == "revoked":
        ApiToken.objects.update(revoked_at="2026-01-01T00:00:00Z")
    elif who == "no-role":
        token = token_for(make_user("dave"))
    elif who == "unknown-session":
        Session.objects.filter(pk=session.pk).update(deleted_at="2026-01-01T00:00:00Z")
    with stream(asgi_server, session.pk, token) as ws, pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == code


@pytest.mark.parametrize(
    ("change", "code"), [("revoked", 4401), ("deactivated", 4401), ("role-removed", 4403)]
)
def test_a_stream_stops_when_its_token_or_role_goes_away(
    builtin: None, asgi_server: str, make_user: Callable[..., User], change: str, code: int
) -> None:
    """Checked at every pull, not only at the handshake: what happens after the token is
    revoked (or expires), its user deactivated or the role taken away is not sent."""
    operator = make_user("olga", "operator")
    watcher = make_user("watcher", "auditor")
    token = token_for(watcher)
    session = do_create_session(operator, Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏")
    session.refresh_from_db()
    with stream(asgi_server, session.pk, token) as ws:
        assert receive(ws, until_seq=session.last_seq)[-1]["seq"] == session.last_seq
        if change == "revoked":
            ApiToken.objects.filter(user=watcher).update(revoked_at=timezone.now())
        elif change == "deactivated":
            User.objects.filter(pk=watcher.pk).update(is_active=False)
        else:
            watcher.groups.clear()
        do_answer(session.pk, operator, "CA1234")  # new events, pushed to open streams
        with pytest.raises(ConnectionClosed) as closed:
            got = ws.recv(timeout=10)
            pytest.fail(f"sent after the change: {got!r}")
    assert closed.value.rcvd is not None and closed.value.rcvd.code == code


def test_a_pull_checks_the_token_in_a_fixed_number_of_queries(
    builtin: None, make_user: Callable[..., User], django_assert_num_queries: Any
) -> None:
    """Every pull (each notice) reads the events, whatever their number, then checks the
    token again: the token with its user, the user's roles, the session. A masked viewer
    (this auditor) reads the values the session's masking hides too: one query."""
    from api.consumers import authenticate, pull

    operator = make_user("olga", "operator")
    token = token_for(make_user("watcher", "auditor"))
    session = do_create_session(operator, Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏")
    opened, _ = authenticate(token, str(session.pk))
    assert opened is not None
    for after in (0, 5):
        with django_assert_num_queries(5):
            viewer, code, batch = pull(token, str(session.pk), after, opened)
        assert viewer is not None and code == 0 and batch


@pytest.mark.parametrize("change", ["revoked", "deactivated"])
def test_what_a_pull_read_is_not_sent_when_the_token_went_away_meanwhile(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The token is checked after the read: an event committed after the change can only
    have been read before a check that sees the change. Checked before the read, such an
    event went out (CI caught one sent after a deactivation)."""
    from api import consumers

    operator = make_user("olga", "operator")
    watcher = make_user("watcher", "auditor")
    token = token_for(watcher)
    session = do_create_session(operator, Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏")
    opened, _ = consumers.authenticate(token, str(session.pk))
    assert opened is not None
    read = consumers.events_after

    def read_then_change(*args: Any) -> list[tuple[int, str, Any]]:
        batch = read(*args)
        # The change commits right after this read, before anything is sent.
        if change == "revoked":
            ApiToken.objects.filter(user=watcher).update(revoked_at=timezone.now())
        else:
            User.objects.filter(pk=watcher.pk).update(is_active=False)
        return batch

    monkeypatch.setattr(consumers, "events_after", read_then_change)
    viewer, code, batch = consumers.pull(token, str(session.pk), 0, opened)
    assert (viewer, code, batch) == (None, 4401, [])


def test_a_malformed_id_or_last_seq_is_refused_and_a_late_one_still_gets_live_events(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    operator = make_user("olga", "operator")
    token = token_for(operator)
    session = do_create_session(operator, Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏")
    session.refresh_from_db()
    base = asgi_server.replace("http://", "ws://")
    auth = {"Authorization": f"Bearer {token}"}
    for path, code in (
        ("/ws/api/sessions/abc", "invalid_session_id"),
        (f"/ws/api/sessions/{session.pk}?last_seq=abc", "invalid_last_seq"),
        (f"/ws/api/sessions/{session.pk}?last_seq=-3", "invalid_last_seq"),
    ):
        with connect(base + path, open_timeout=10, additional_headers=auth) as ws:
            error = json.loads(ws.recv(timeout=10))
            assert (error["type"], error["code"]) == ("error", code), path
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400

    with stream(asgi_server, session.pk, token, last_seq=session.last_seq + 1000) as ws:
        do_answer(session.pk, operator, "CA1234")
        live = receive(ws, count=1)
    assert live[0]["seq"] == session.last_seq + 1, "a last_seq past the end starts at the end"

    rest = call("GET", f"/api/v1/diagnosis-sessions/{session.pk}/timeline?limit=200", token)
    by_id = {e["event_id"]: e for e in rest.json()["events"]}
    assert live[0]["ts"] == by_id[live[0]["event_id"]]["ts"], "the same ts on both"
    assert live[0]["ts"].endswith("Z") and len(live[0]["ts"]) == len("2026-01-01T00:00:00.000Z")
