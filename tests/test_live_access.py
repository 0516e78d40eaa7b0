"""Who may keep watching, checked on every pull (not only at connect), and one render
shared by every viewer holding the same roles: real WebSocket clients against daphne,
and the consumers' hub driven directly."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import channels.consumer
import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from aero.roles import user_roles
from approvals.push import QUEUE_GROUP
from diagnosis import live_access, live_render
from diagnosis.events import append_event
from diagnosis.live_access import CLOSE_FORBIDDEN, CLOSE_GONE, CLOSE_SIGNED_OUT, current_roles
from diagnosis.live_hub import Hub
from diagnosis.models import Session
from diagnosis.push import group_send
from tests.test_live_timeline import (
    cookie_for,
    new_session,
    open_socket,
    receive_until,
    ws_url,
)

pytestmark = pytest.mark.services


def sign_in_key(user: User) -> str:
    """The key of a new sign-in session of `user` (what a socket's cookie names)."""
    client = Client()
    client.force_login(user)
    return str(client.session.session_key)


def closed_with(ws: ClientConnection, timeout: float = 15) -> int | None:
    """Read until the server closes; the close code. Fails on any fragment received."""
    try:
        while True:
            message = ws.recv(timeout=timeout)
            raise AssertionError(f"received a fragment after access ended: {message[:200]!r}")
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd else None


def test_a_viewer_whose_role_is_removed_stops_receiving_at_the_next_push(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    operator = make_user("olga", "operator")
    auditor = make_user("aude", "auditor")
    session = new_session(operator, "105机位燃油泄漏")
    with (
        open_socket(asgi_server, session, auditor, last_seq=0) as revoked,
        open_socket(asgi_server, session, operator, last_seq=0) as kept,
    ):
        for ws in (revoked, kept):
            receive_until(ws, lambda s, _: bool(s) and s[-1] >= session.last_seq)
        auditor.groups.clear()
        append_event(session.pk, "agent.note", {"text": "after the role change"}, producer="t")
        assert closed_with(revoked) == CLOSE_FORBIDDEN
        _, html = receive_until(kept, lambda s, _: bool(s) and s[-1] > session.last_seq)
        assert "after the role change" in html  # the others keep watching


def sign_out_over_http(base: str, cookie: str) -> None:
    """Sign out as the browser does: the page's CSRF token, then POST the sign-out to
    the same server the sockets are on (its user_logged_out tells them)."""
    import httpx

    with httpx.Client(base_url=base, headers={"Cookie": cookie, "Origin": base}) as browser:
        page = browser.get("/sessions/")
        assert page.status_code == 200
        token = page.cookies["csrftoken"]
        cookies = f"{cookie}; csrftoken={token}"
        response = browser.post(
            "/accounts/logout/", headers={"Cookie": cookies, "X-CSRFToken": token}
        )
        assert response.status_code == 302


def test_signing_out_closes_that_sign_ins_sockets_at_once_and_no_others(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    operator = make_user("olga", "operator")
    session = new_session(operator, "105机位燃油泄漏")
    here, elsewhere = cookie_for(operator), cookie_for(operator)  # two browsers
    board_url = asgi_server.replace("http://", "ws://") + "/ws/airport/"
    with (
        connect(
            ws_url(asgi_server, session, 0),
            open_timeout=10,
            max_queue=None,
            additional_headers={"Cookie": here, "Origin": asgi_server},
        ) as page,
        connect(
            board_url,
            open_timeout=10,
            max_queue=None,
            additional_headers={"Cookie": here, "Origin": asgi_server},
        ) as board,
        connect(
            ws_url(asgi_server, session, 0),
            open_timeout=10,
            max_queue=None,
            additional_headers={"Cookie": elsewhere, "Origin": asgi_server},
        ) as other,
    ):
        for ws in (page, other):
            receive_until(ws, lambda s, _: bool(s) and s[-1] >= session.last_seq)
        assert "airport-board" in str(board.recv(timeout=15))

        sign_out_over_http(asgi_server, here)

        # Closed by the sign-out itself, before anything else happens in the session.
        assert closed_with(page) == CLOSE_SIGNED_OUT
        assert closed_with(board) == CLOSE_SIGNED_OUT
        append_event(session.pk, "agent.note", {"text": "after the sign-out"}, producer="t")
        _, html = receive_until(other, lambda s, _: bool(s) and s[-1] > session.last_seq)
        assert "after the sign-out" in html  # the other browser's sign-in still stands


def test_a_sign_in_that_ended_unannounced_stops_its_socket_at_the_next_push(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    """No sign-out notice (lost, or the sign-in expired or was deleted): the check at
    every push finds the sign-in gone and closes the socket with nothing sent."""
    from django.contrib.sessions.models import Session as SignIn

    operator = make_user("olga", "operator")
    session = new_session(operator, "105机位燃油泄漏")
    cookie = cookie_for(operator)
    with open_socket_with(asgi_server, session, cookie) as ws:
        receive_until(ws, lambda s, _: bool(s) and s[-1] >= session.last_seq)
        SignIn.objects.filter(session_key=cookie.split("=", 1)[1]).delete()
        append_event(session.pk, "agent.note", {"text": "nobody may see this"}, producer="t")
        assert closed_with(ws) == CLOSE_FORBIDDEN


def open_socket_with(base: str, session: Session, cookie: str) -> ClientConnection:
    return connect(
        ws_url(base, session, 0),
        open_timeout=10,
        max_queue=None,
        additional_headers={"Cookie": cookie, "Origin": base},
    )


def test_a_deleted_session_closes_its_sockets(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    operator = make_user("olga", "operator")
    session = new_session(operator, "105机位燃油泄漏")
    with open_socket(asgi_server, session, operator, last_seq=session.last_seq) as ws:
        Session.objects.filter(pk=session.pk).update(deleted_at=timezone.now())
        append_event(session.pk, "agent.note", {"text": "nobody may see this"}, producer="t")
        assert closed_with(ws) == CLOSE_GONE


def test_the_queue_socket_stops_for_a_former_approver(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    abel = make_user("abel", "approver")
    url = asgi_server.replace("http://", "ws://") + "/ws/approvals/"
    headers = {"Cookie": cookie_for(abel), "Origin": asgi_server}
    # max_queue=None: frames the test leaves unread never stop the client reading, so
    # its close sees the server's close frame (past 16 unread frames websockets stops
    # reading and every close waited out its 10 s timeout).
    with connect(url, open_timeout=10, max_queue=None, additional_headers=headers) as ws:
        assert "approval-queue" in str(ws.recv(timeout=15))
        abel.groups.remove(Group.objects.get(name="approver"))
        group_send(QUEUE_GROUP, {"type": "queue.notice", "stamp": "role-change"})
        assert closed_with(ws) == CLOSE_FORBIDDEN


def test_current_roles_reads_the_database_not_the_cached_copy(
    builtin: None, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    admin = User.objects.create_superuser("root", password="pw-for-tests")
    assert user_roles(olga) == {"operator"}  # now cached on this object
    olga.groups.clear()
    User.objects.filter(pk=admin.pk).update(is_active=False)
    assert current_roles([olga.pk, admin.pk, 999999]) == {
        olga.pk: frozenset(),
        admin.pk: frozenset(),
        999999: frozenset(),
    }


def run_in_fresh_loop(coroutine_factory: Callable[[], Any]) -> Any:
    """An event loop of its own in a new thread (a Playwright test may have left one
    running in the main thread)."""
    result: list[Any] = []

    def run() -> None:
        result.append(asyncio.run(coroutine_factory()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    return result[0]


def test_viewers_with_the_same_roles_share_one_render_and_roles_never_mix(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    operator = make_user("olga", "operator")
    approver = make_user("abel", "approver")
    session = new_session(operator, "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏")
    renders: list[frozenset[str]] = []
    real = live_render.render_batch

    def counted(pulls: list[live_render.Pull]) -> Any:
        renders.extend(pull.roles for pull in pulls)
        return real(pulls)

    monkeypatch.setattr(live_render, "render_batch", counted)
    sid = str(session.pk)
    keys = {user.pk: sign_in_key(user) for user in (approver, operator)}

    async def viewers() -> tuple[list[Any], list[Any], int]:
        hub = Hub()
        hub.announce(sid, session.last_seq)
        role_sets = await asyncio.gather(
            *[hub.roles_of(user.pk, keys[user.pk]) for user in [approver] * 20 + [operator] * 20]
        )
        first = await asyncio.gather(
            *[hub.session_update(roles, sid, 0, None) for roles in role_sets]
        )
        # A viewer arriving later, with nothing newer announced, reuses the render.
        again = await hub.session_update(role_sets[0], sid, 0, None)
        # Something newer was announced: the next pull renders afresh.
        hub.announce(sid, session.last_seq + 1)
        await hub.session_update(role_sets[0], sid, 0, None)
        return role_sets, [*first, again], len(renders)

    role_sets, updates, count = run_in_fresh_loop(viewers)
    assert set(role_sets[:20]) == {frozenset({"approver"})}
    assert count == 3  # one per role set, then one after the newer notice
    approver_html = {u.html for u in updates[:20]} | {updates[-1].html}
    operator_html = {u.html for u in updates[20:40]}
    assert len(approver_html) == 1 and len(operator_html) == 1
    assert 'name="decision"' in next(iter(approver_html))  # approvers get decision forms
    assert 'name="decision"' not in next(iter(operator_html))  # operators never do


def test_a_notice_costs_a_viewer_one_role_check_and_one_render(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a pull has sent everything the render saw and every notice announced, the
    viewer stops: no second role check and read that would find nothing new; and the
    notice itself costs no extra hop to the sync thread (the hub receives it, no consumer's
    dispatch runs)."""
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator
    from django.db import connections

    from aero.asgi import page_websocket
    from tests.test_live_timeline import SEQ

    operator = make_user("olga", "operator")
    session = new_session(operator, "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏")
    pulls: list[live_render.Pull] = []
    role_reads: list[list[Any]] = []
    real_batch, real_roles = live_render.render_batch, live_access.current_roles

    def counted_batch(batch: list[live_render.Pull]) -> Any:
        pulls.extend(batch)
        return real_batch(batch)

    def counted_roles(user_ids: Any) -> Any:
        role_reads.append(list(user_ids))
        return real_roles(user_ids)

    monkeypatch.setattr(live_render, "render_batch", counted_batch)
    monkeypatch.setattr(live_access, "current_roles", counted_roles)
    hops: list[str] = []
    real_close = channels.consumer.aclose_old_connections

    async def counted_close() -> None:
        hops.append("close")  # a hop to the sync thread the renders queue on
        await real_close()

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted_close)
    headers = [
        (b"origin", b"http://testserver"),
        (b"host", b"testserver"),
        (b"cookie", cookie_for(operator).encode()),
    ]
    path = f"/ws/sessions/{session.pk}/?last_seq={session.last_seq}&lang=en"

    async def watch() -> tuple[int, int, int]:
        viewer = WebsocketCommunicator(page_websocket, path, headers=headers)
        connected, _ = await viewer.connect(timeout=10)
        assert connected
        await asyncio.sleep(0.3)  # the catch-up pull at connect (nothing new) is done
        before = (len(pulls), len(role_reads), len(hops))
        event = await database_sync_to_async(append_event)(
            session.pk, "agent.note", {"text": "one more"}, producer="t"
        )
        message = await viewer.receive_from(timeout=10)
        await asyncio.sleep(0.5)  # a second turn of the pull, if any, runs now
        counts = (len(pulls) - before[0], len(role_reads) - before[1], len(hops) - before[2])
        await viewer.disconnect()
        await database_sync_to_async(connections.close_all)()  # this thread's connection
        seqs = [int(s) for s in SEQ.findall(message)]
        assert seqs == [event.seq]
        return counts

    renders, role_checks, cleanup_hops = run_in_fresh_loop(watch)
    assert (renders, role_checks) == (1, 1)
    assert cleanup_hops == 0  # the notice's pull cleans up in its own database call


@pytest.mark.parametrize("change", ["role removed", "deactivated"])
def test_what_a_fan_out_read_is_not_sent_when_access_went_away_meanwhile(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The hub reads the events, then the roles. A change committed right after
    the read closes the page; the event read with it is not sent. Checked before the read
    (as it was), the viewer got it."""
    operator = make_user("olga", "operator")
    auditor = make_user("aude", "auditor")
    session = new_session(operator, "105机位燃油泄漏")
    real = live_render.render_batch

    def read_then_change(pulls: list[live_render.Pull]) -> Any:
        updates = real(pulls)
        if change == "role removed":
            auditor.groups.clear()
        else:
            User.objects.filter(pk=auditor.pk).update(is_active=False)
        return updates

    monkeypatch.setattr(live_render, "render_batch", read_then_change)
    ask = live_access.Ask(
        auditor.pk, str(session.pk), 0, None, "en", frozenset({"auditor"}), sign_in_key(auditor)
    )
    assert live_access.check_and_render([ask]) == [(None, None)]


def test_a_viewer_whose_roles_changed_during_the_read_gets_a_render_under_the_new_ones(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read under the roles of the last check (auditor), found changed after (approver):
    the events are read again under the new roles, so the forms follow them; a viewer
    whose roles did not change is answered from the first read."""
    operator = make_user("olga", "operator")
    promoted = make_user("pia", "auditor")
    session = new_session(operator, "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏")
    real = live_render.render_batch
    renders: list[frozenset[str]] = []

    def read_then_promote(pulls: list[live_render.Pull]) -> Any:
        renders.extend(pull.roles for pull in pulls)
        updates = real(pulls)
        if len(renders) == 2:  # the first read, for both viewers' role sets
            promoted.groups.set([Group.objects.get(name="approver")])
        return updates

    monkeypatch.setattr(live_render, "render_batch", read_then_promote)
    sid = str(session.pk)
    promoted_key, operator_key = sign_in_key(promoted), sign_in_key(operator)
    asks = [
        live_access.Ask(promoted.pk, sid, 0, None, "en", frozenset({"auditor"}), promoted_key),
        live_access.Ask(operator.pk, sid, 0, None, "en", frozenset({"operator"}), operator_key),
    ]
    (roles, update), (kept_roles, kept) = live_access.check_and_render(asks)
    assert roles == frozenset({"approver"}) and update is not None
    assert 'name="decision"' in update.html  # rendered for an approver
    assert kept_roles == frozenset({"operator"}) and kept is not None
    assert renders == [frozenset({"auditor"}), frozenset({"operator"}), roles]


def test_what_a_viewers_own_pull_read_is_not_sent_when_its_role_went_away_meanwhile(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same order on a viewer's own pull (the catch-up at connect, a resync): the
    role removed right after the read closes the socket 4403 with nothing sent."""
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator
    from django.db import connections

    from aero.asgi import page_websocket

    operator = make_user("olga", "operator")
    auditor = make_user("aude", "auditor")
    session = new_session(operator, "105机位燃油泄漏")
    real = live_render.render_batch

    def read_then_remove(pulls: list[live_render.Pull]) -> Any:
        updates = real(pulls)
        auditor.groups.clear()
        return updates

    monkeypatch.setattr(live_render, "render_batch", read_then_remove)
    headers = [
        (b"origin", b"http://testserver"),
        (b"host", b"testserver"),
        (b"cookie", cookie_for(auditor).encode()),
    ]
    path = f"/ws/sessions/{session.pk}/?last_seq=0&lang=en"

    async def watch() -> tuple[list[str], int | None]:
        viewer = WebsocketCommunicator(page_websocket, path, headers=headers)
        connected, _ = await viewer.connect(timeout=10)
        assert connected
        received: list[str] = []
        code: int | None = None
        while True:
            message = await viewer.receive_output(timeout=10)
            if message["type"] == "websocket.close":
                code = message.get("code")
                break
            received.append(message.get("text", ""))
        await viewer.disconnect()
        await database_sync_to_async(connections.close_all)()
        return received, code

    received, code = run_in_fresh_loop(watch)
    assert (received, code) == ([], CLOSE_FORBIDDEN)


def test_a_socket_s_sign_in_is_read_as_get_user_reads_it(
    builtin: None, make_user: Callable[..., User]
) -> None:
    """The sockets' batched sign-in read (aero.sessions.users_signed_in) finds the user
    of a standing sign-in and no one for an ended one: signed out, expired, the password
    changed, the user deactivated, a backend no longer configured or one that signs no
    one in, a key that is no session's."""
    from django.contrib.sessions.models import Session as SignIn

    from aero.sessions import users_signed_in

    users = {name: make_user(name, "operator") for name in ("ok", "out", "old", "pw", "off")}
    users |= {name: make_user(name, "operator") for name in ("gone", "axes")}
    keys = {name: sign_in_key(user) for name, user in users.items()}
    SignIn.objects.filter(session_key=keys["out"]).delete()  # signed out
    SignIn.objects.filter(session_key=keys["old"]).update(
        expire_date=timezone.now() - timedelta(seconds=1)
    )
    users["pw"].set_password("another-one")
    users["pw"].save()
    User.objects.filter(pk=users["off"].pk).update(is_active=False)
    for name, backend in (
        ("gone", "no.such.Backend"),
        ("axes", "axes.backends.AxesStandaloneBackend"),
    ):
        row = SignIn.objects.get(session_key=keys[name])
        data = row.get_decoded() | {"_auth_user_backend": backend}
        SignIn.objects.filter(pk=row.pk).update(session_data=SignIn.objects.encode(data))

    found = users_signed_in([*keys.values(), "x" * 32])
    assert found == {keys["ok"]: users["ok"]}
    assert found[keys["ok"]].get_username() == "ok"
