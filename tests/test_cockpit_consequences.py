"""Issue 12, decisions with consequences: each action in plain words with what it does to
the airport as it is now (runways left open, flights cut off from every runway), marked
"already in force" when another session's closure stands; and an approver's edit of an
action's arguments before deciding (an event, a new digest, re-checked, refolded).

Personas: alice operates, bob approves, carol audits."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import reverse

from aero.models import AuditLog
from aero.templatetags.aero_text import when
from approvals.actions import do_decide
from approvals.models import Approval
from diagnosis.models import Event, Session, ToolCall
from packs.airport.board import Board
from packs.airport.models import Restriction
from tests.builtin_data import demo_graph
from tests.log_helpers import assert_projections_match
from tests.web_helpers import (
    STAND_FUEL_LEAK,
    TAXIWAY_FUEL_LEAK,
    approval_for,
    login,
    waiting_session,
)

HTMX = {"HX-Request": "true"}


class Closed:
    """A restriction in force, as the board reads it."""

    def __init__(self, kind: str, target: str) -> None:
        self.kind, self.target, self.session_id, self.created_at = kind, target, "s", None


# --- the consequence, from the graph and the board -------------------------------------


def test_closing_one_runway_says_which_stay_open() -> None:
    found = Board(demo_graph(), []).consequence("close_runway", {"runway": "06/24"})

    assert found.plain == "Close runway 06/24"
    assert found.consequence == "runways still open: 18/36"
    assert not found.warn


def test_closing_the_last_open_runway_warns_and_counts_every_flight() -> None:
    board = Board(demo_graph(), [Closed("runway", "18/36")])  # type: ignore[list-item]

    found = board.consequence("close_runway", {"runway": "06/24"})

    assert found.warn
    assert found.consequence.startswith("afterwards no runway is open; affects 10 flights")


def test_closing_a_taxiway_counts_the_flights_it_cuts_off() -> None:
    found = Board(demo_graph(), []).consequence("close_taxiway", {"taxiway": "B"})

    assert found.warn
    assert found.consequence == "affects 4 flights (9C8521, CZ3101, KN5977, MF8101)"


def test_a_closure_already_in_force_is_marked_not_counted_again() -> None:
    closed = Closed("taxiway", "A")
    found = Board(demo_graph(), [closed]).consequence("close_taxiway", {"taxiway": "A"})  # type: ignore[list-item]

    assert found.in_force is closed
    assert found.consequence == "already in force"


def test_an_action_without_a_closure_reads_plainly() -> None:
    found = Board(demo_graph(), []).consequence("dispatch_cleanup_crew", {"position": "105"})

    assert (found.plain, found.consequence, found.in_force) == (
        "Send the cleanup crew to 105",
        "",
        None,
    )


@pytest.mark.services
def test_the_session_page_and_the_queue_show_the_consequence_and_what_is_in_force(
    builtin: None, alice: User, bob: User
) -> None:
    runway_leak = waiting_session(alice, TAXIWAY_FUEL_LEAK)
    stand_leak = waiting_session(alice, STAND_FUEL_LEAK)
    Restriction.objects.create(
        kind="taxiway",
        target="A",
        session=runway_leak,
        tool_call=ToolCall.objects.create(
            session=runway_leak, call_id="by-hand", idempotency_key="k", tool_name="close_taxiway"
        ),
    )

    page = login(alice).get(reverse("diagnosis:session-detail", args=[runway_leak.pk]))
    queue = login(bob).get(reverse("approvals:queue")).content.decode()

    html = page.content.decode()
    runway = approval_for(runway_leak, "close_runway", runway="06/24")
    row = html[html.index(f'id="action-{runway.tool_call_id}"') :]
    assert "Close runway 06/24" in row[: row.index("</tr>")]
    assert "runways still open: 18/36" in row[: row.index("</tr>")]
    # The action list comes before the facts and the map.
    assert html.index('id="session-actions"') < html.index('id="session-facts"')
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")
    card = queue[queue.index(f'id="approval-{closure.pk}"') :]
    card = card[: card.index("</article>")]
    assert "Close taxiway A" in card and 'data-testid="in-force"' in card
    assert reverse("diagnosis:session-detail", args=[runway_leak.pk]) in card


# --- editing an action's arguments before deciding -------------------------------------


@pytest.fixture
def stand_leak(builtin: None, alice: User) -> Session:
    return waiting_session(alice, STAND_FUEL_LEAK)


def edit(user: User, approval: Approval, **data: Any) -> Any:
    return login(user).post(
        reverse("approvals:edit-args", args=[approval.pk]),
        {"digest": approval.digest, **data},
        headers=HTMX,
    )


@pytest.mark.services
def test_an_approver_edits_the_arguments_then_approves_the_edited_action(
    stand_leak: Session, bob: User
) -> None:
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")
    old_digest = closure.digest

    response = edit(bob, closure, **{"arg-taxiway": "c", "edit_reason": "A is the only way out"})

    assert response.status_code == 200
    closure.refresh_from_db()
    assert closure.tool_call.request_payload == {"taxiway": "C"}
    assert closure.digest != old_digest
    event = Event.objects.get(session=stand_leak, type="approval.args_edited")
    assert event.payload["before"] == {"taxiway": "A"} and event.payload["args"] == {"taxiway": "C"}
    assert event.payload["by"] == "bob" and event.payload["reason"] == "A is the only way out"
    assert AuditLog.objects.filter(action="approval.args_edited").count() == 1
    assert_projections_match(stand_leak)
    # A decision on what was shown before the edit is refused ...
    with pytest.raises(Exception, match="not the one you were shown"):
        do_decide(closure.pk, bob, "approve", digest=old_digest)
    # ... the edited action is decided and runs with the new argument.
    do_decide(closure.pk, bob, "approve", digest=closure.digest)
    closure.refresh_from_db()
    do_decide(closure.pk, bob, "confirm", digest=closure.digest)
    assert Restriction.objects.filter(kind="taxiway", target="C", session=stand_leak).exists()
    assert not Restriction.objects.filter(kind="taxiway", target="A").exists()
    assert_projections_match(stand_leak)


@pytest.mark.services
def test_the_next_approver_sees_who_changed_the_arguments_from_what_and_why(
    stand_leak: Session, alice: User, bob: User, make_user: Any
) -> None:
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")
    other = approval_for(stand_leak, "dispatch_cleanup_crew")
    edit(bob, closure, **{"arg-taxiway": "C", "edit_reason": "A is the only way out"})

    eve = make_user("eve", "approver")
    queue = login(eve).get(reverse("approvals:queue")).content.decode()
    card = queue[queue.index(f'id="approval-{closure.pk}"') :]
    card = card[: card.index("</article>")]
    note = card[card.index('data-testid="edited"') : card.index("</p>", card.index("edited"))]
    assert "Arguments changed by bob" in note
    assert "taxiway=A → <strong>taxiway=C</strong>" in note and "A is the only way out" in note
    untouched = queue[queue.index(f'id="approval-{other.pk}"') :]
    assert 'data-testid="edited"' not in untouched[: untouched.index("</article>")]
    # The operator's page says it beside the action too.
    page = login(alice).get(reverse("diagnosis:session-detail", args=[stand_leak.pk]))
    assert page.content.decode().count('data-testid="edited"') == 1
    assert_projections_match(stand_leak)


@pytest.mark.services
def test_an_edit_after_a_first_approval_starts_the_two_steps_over(
    stand_leak: Session, bob: User
) -> None:
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")
    do_decide(closure.pk, bob, "approve", digest=closure.digest)
    closure.refresh_from_db()
    assert closure.status == "confirming"

    edit(bob, closure, **{"arg-taxiway": "C", "edit_reason": "wrong taxiway"})

    closure.refresh_from_db()
    assert (closure.status, closure.first_approved_by) == ("pending", None)
    assert_projections_match(stand_leak)


@pytest.mark.services
@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"arg-taxiway": "Z", "edit_reason": "x"}, "Z is not a taxiway of"),
        ({"arg-taxiway": "", "edit_reason": "x"}, "taxiway is empty"),
        ({"arg-taxiway": "C"}, "Say why the arguments change."),
        ({"arg-taxiway": "A", "edit_reason": "x"}, "Nothing changed"),
    ],
)
def test_a_bad_edit_is_refused_with_a_message_and_changes_nothing(
    stand_leak: Session, bob: User, data: dict[str, str], message: str
) -> None:
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")

    response = edit(bob, closure, **data)

    assert response.status_code == 400 and message in response.content.decode()
    closure.refresh_from_db()
    assert closure.tool_call.request_payload == {"taxiway": "A"}
    assert not Event.objects.filter(session=stand_leak, type="approval.args_edited").exists()


@pytest.mark.services
@pytest.mark.parametrize("persona", ["alice", "carol"])
def test_operators_and_auditors_cannot_edit_arguments(
    stand_leak: Session, persona: str, request: pytest.FixtureRequest
) -> None:
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")

    response = edit(
        request.getfixturevalue(persona), closure, **{"arg-taxiway": "C", "edit_reason": "x"}
    )

    assert response.status_code == 403
    closure.refresh_from_db()
    assert closure.tool_call.request_payload == {"taxiway": "A"}


# --- a closure already in force is not proposed again ---------------------------------


@pytest.mark.services
def test_the_agent_does_not_propose_a_closure_another_session_already_put_in_force(
    builtin: None, alice: User
) -> None:
    holder = waiting_session(alice, STAND_FUEL_LEAK)
    Restriction.objects.create(
        kind="runway",
        target="06/24",
        session=holder,
        tool_call=ToolCall.objects.create(
            session=holder, call_id="by-hand", idempotency_key="k", tool_name="close_runway"
        ),
    )

    session = waiting_session(alice, TAXIWAY_FUEL_LEAK)

    proposed = set(Approval.objects.filter(session=session).values_list("action_name", flat=True))
    assert "close_runway" not in proposed and proposed  # the other actions are still asked
    notes = Event.objects.filter(
        session=session, type="agent.note", payload__kind="already_in_force"
    )
    assert [(n.payload["tool_name"], n.payload["held_by"]) for n in notes] == [
        ("close_runway", str(holder.pk))
    ]
    held = Restriction.objects.get(kind="runway", target="06/24", lifted_at__isnull=True)
    assert notes[0].payload["held_title"] == holder.title
    assert notes[0].payload["held_since"] == held.created_at.isoformat()
    html = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert "did not propose “Close runway 06/24”: already in force" in html
    # The page names the session that closed it (a link to it) and when, not this one.
    line = html[html.index('data-testid="held-by"') :]
    line = line[: line.index("</span>")]
    holder_url = reverse("diagnosis:session-detail", args=[holder.pk])
    assert f'closed by session <a href="{holder_url}">{holder.title}</a>' in line
    assert when(held.created_at) in line
    assert "closed by this session" not in line
    with override_settings(LANGUAGE_CODE="zh-hans"):
        chinese = (
            login(alice)
            .get(
                reverse("diagnosis:session-detail", args=[session.pk]),
                HTTP_ACCEPT_LANGUAGE="zh-hans",
            )
            .content.decode()
        )
    assert f'由会话<a href="{holder_url}">' in chinese and "由本会话关闭" not in chinese
    assert_projections_match(session)


def test_a_closure_the_session_made_itself_is_its_own_not_another_sessions(
    builtin: None, alice: User, bob: User
) -> None:
    from tests.web_helpers import approve_everything

    session = waiting_session(alice, STAND_FUEL_LEAK)
    closure = approval_for(session, "close_taxiway", taxiway="A")
    approve_everything(session, bob)
    held = Restriction.objects.get(kind="taxiway", target="A", lifted_at__isnull=True)
    assert held.session_id == session.pk

    html = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk])).content
    row = html.decode()[html.decode().index(f'id="action-{closure.tool_call_id}"') :]
    row = row[: row.index("</tr>")]
    assert "in force, closed by this session" in row
    assert "another session" not in row
