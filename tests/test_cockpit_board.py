"""Issue 12, the airport board and the to-dos page: both update live (a notice, then a
pull rendered for the viewer's roles), a to-do resolved by hand ("closed by phone") puts
its closure on the board with an event, and a to-do whose effect another session already
put in force leaves the open list.

Personas: olga operates, abel approves, carol audits."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone
from websockets.sync.client import ClientConnection, connect

from approvals.actions import do_resolve_todo, do_timeout
from approvals.models import ManualTodo
from diagnosis.models import Event, Session, ToolCall
from packs.airport.models import Restriction
from tests.log_helpers import assert_projections_match
from tests.test_live_timeline import cookie_for
from tests.web_helpers import STAND_FUEL_LEAK, approval_for, login, waiting_session

pytestmark = pytest.mark.services


def timed_out_closure(session: Session, taxiway: str = "A") -> ManualTodo:
    """What the sweeper leaves when nobody decided `close_taxiway` in time: the clock
    moved past the deadline (the deadline itself stays as its event says)."""
    closure = approval_for(session, "close_taxiway", taxiway=taxiway)
    later = timezone.now() + timedelta(hours=1)
    with mock.patch("django.utils.timezone.now", return_value=later):
        assert do_timeout(closure.pk)
    return ManualTodo.objects.get(approval=closure)


def close_elsewhere(olga: User, taxiway: str) -> Restriction:
    """Another session's executed closure of the same taxiway."""
    other = waiting_session(olga, STAND_FUEL_LEAK)
    return Restriction.objects.create(
        kind="taxiway",
        target=taxiway,
        session=other,
        tool_call=ToolCall.objects.get(
            pk=approval_for(other, "close_taxiway", taxiway=taxiway).tool_call_id
        ),
    )


def board_row(html: str, target: str) -> str:
    start = html.index(f'data-target="{target}"')
    return html[start : html.index("</tr>", start)]


def test_a_todo_done_by_hand_puts_its_closure_on_the_board(stand_leak: Session, olga: User) -> None:
    todo = timed_out_closure(stand_leak)
    before = login(olga).get(reverse("airport:board")).content.decode()
    assert "Taxiway closed" not in board_row(before, "A")

    response = login(olga).post(
        reverse("approvals:todo-resolve", args=[todo.pk]),
        {"note": "closed by phone with the tower", "outcome": "in_force"},
    )

    assert response.status_code == 302
    after = login(olga).get(reverse("airport:board")).content.decode()
    assert "Taxiway closed" in board_row(after, "A")
    restriction = Restriction.objects.get(kind="taxiway", target="A", lifted_at__isnull=True)
    assert restriction.session_id == stand_leak.pk
    event = Event.objects.filter(session=stand_leak, type="timeline.appended").last()
    assert event is not None
    assert event.payload["kind"] == "todo_resolved"
    assert event.payload["restriction"]["target"] == "A"
    state = assert_projections_match(stand_leak)
    assert [(r.kind, r.target) for r in state.restrictions] == [("taxiway", "A")]


def test_a_todo_resolved_as_not_done_leaves_the_board_alone(
    stand_leak: Session, olga: User
) -> None:
    todo = timed_out_closure(stand_leak)

    login(olga).post(
        reverse("approvals:todo-resolve", args=[todo.pk]),
        {"note": "not needed, spill was small", "outcome": "not_done"},
    )

    assert not Restriction.objects.filter(target="A").exists()
    assert ManualTodo.objects.get(pk=todo.pk).resolved_at is not None
    assert assert_projections_match(stand_leak).restrictions == []


def test_done_by_hand_when_another_session_already_closed_it_adds_no_second_closure(
    stand_leak: Session, olga: User
) -> None:
    todo = timed_out_closure(stand_leak)
    elsewhere = close_elsewhere(olga, "A")

    do_resolve_todo(todo.pk, olga, "tower confirms A closed", in_force=True)

    assert list(Restriction.objects.filter(target="A", lifted_at__isnull=True)) == [elsewhere]
    event = Event.objects.filter(session=stand_leak, type="timeline.appended").last()
    assert event is not None and event.payload["already_in_force"]["target"] == "A"
    assert assert_projections_match(stand_leak).restrictions == []


def test_a_todo_whose_closure_is_already_in_force_leaves_the_open_list(
    stand_leak: Session, olga: User
) -> None:
    todo = timed_out_closure(stand_leak)
    page = login(olga).get(reverse("approvals:todo-list")).content.decode()
    assert f'id="todo-{todo.pk}"' in page

    close_elsewhere(olga, "A")

    page = login(olga).get(reverse("approvals:todo-list")).content.decode()
    assert f'id="todo-{todo.pk}"' not in page
    in_force = page[page.index('data-testid="todos-in-force"') :]
    assert todo.title in in_force and "Taxiway closed: A is in force" in in_force
    # The session that closed it, not "this session" (the to-dos page is no session's).
    item = in_force[: in_force.index("</li>")]
    assert "the session that closed it" in item and "closed by this session" not in item


def read_until(ws: ClientConnection, done: Callable[[str], bool]) -> str:
    while True:
        html = ws.recv(timeout=15)
        assert isinstance(html, str)
        if done(html):
            return html


def test_the_board_and_the_todos_update_live(
    stand_leak: Session, olga: User, asgi_server: str
) -> None:
    todo = timed_out_closure(stand_leak)
    headers = {"Cookie": cookie_for(olga), "Origin": asgi_server}
    base = asgi_server.replace("http://", "ws://")
    with (
        # max_queue=None: frames the test leaves unread never stop the client reading, so
        # its close sees the server's close frame (past 16 unread frames websockets stops
        # reading and every close waited out its 10 s timeout).
        connect(
            f"{base}/ws/airport/?lang=en",
            open_timeout=10,
            max_queue=None,
            additional_headers=headers,
        ) as board,
        connect(
            f"{base}/ws/todos/?lang=en", open_timeout=10, max_queue=None, additional_headers=headers
        ) as todos,
    ):
        first = read_until(board, lambda h: 'id="airport-board"' in h)
        assert "Taxiway closed" not in board_row(first, "A")
        assert f'id="todo-{todo.pk}"' in read_until(todos, lambda h: 'id="todo-list"' in h)

        do_resolve_todo(todo.pk, olga, "closed by phone", in_force=True)

        pushed = read_until(board, lambda h: "Taxiway closed" in board_row(h, "A"))
        assert 'hx-swap-oob="true"' in pushed
        assert f'id="todo-{todo.pk}"' not in read_until(
            todos, lambda h: f'id="todo-{todo.pk}"' not in h
        )


def test_auditors_may_not_watch_the_todos(
    builtin: None, make_user: Callable[..., User], asgi_server: str
) -> None:
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    carol = make_user("carol", "auditor")
    url = asgi_server.replace("http://", "ws://") + "/ws/todos/"
    headers = {"Cookie": cookie_for(carol), "Origin": asgi_server}
    with (
        pytest.raises((InvalidStatus, ConnectionClosed)),
        connect(url, open_timeout=10, max_queue=None, additional_headers=headers) as ws,
    ):
        ws.recv(timeout=5)
