"""The airport status board and lifting restrictions.

Personas: alice operates, bob approves, carol audits, dave has no role."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from aero.models import AuditLog
from aero.roles import ADMIN
from approvals.actions import do_decide
from approvals.models import Approval
from diagnosis.actions import ActionError
from diagnosis.models import Event, Session, ToolCall
from packs.airport.models import Restriction
from tests.web_helpers import (
    STAND_FUEL_LEAK,
    approval_for,
    approve_everything,
    login,
    login_url,
    make_session,
)

BOARD = "/airport/"


@pytest.fixture
def session(builtin: None, alice: User) -> Session:
    return make_session(alice, STAND_FUEL_LEAK)


@pytest.fixture
def closure(session: Session, bob: User) -> Restriction:
    """Taxiway A closed: bob approved and confirmed the R2 close_taxiway action."""
    approval = approval_for(session, "close_taxiway", taxiway="A")
    do_decide(approval.pk, bob, "approve", digest=approval.digest)
    do_decide(approval.pk, bob, "confirm", digest=approval.digest)
    return Restriction.objects.get(kind="taxiway", target="A")


def lift_url(restriction: Restriction | int) -> str:
    pk = restriction if isinstance(restriction, int) else restriction.pk
    return reverse("airport:restriction-lift", args=[pk])


def board_row(page: str, target: str) -> str:
    start = page.index(f'data-target="{target}"')
    return page[page.rindex("<tr", 0, start) : page.index("</tr>", start)]


def lift_entries(restriction: Restriction) -> int:
    return AuditLog.objects.filter(
        action="restriction.lifted", object_id=str(restriction.pk)
    ).count()


# --- the board ----------------------------------------------------------------------


def test_board_url_is_stable() -> None:
    assert reverse("airport:board") == BOARD


def test_anonymous_is_sent_to_login(db: None) -> None:
    response = login(None).get(BOARD)

    assert response.status_code == 302
    assert response["Location"] == login_url(BOARD)


def test_user_without_role_cannot_see_the_board(dave: User) -> None:
    assert login(dave).get(BOARD).status_code == 403


def test_board_refuses_post(alice: User) -> None:
    assert login(alice).post(BOARD).status_code == 405


@pytest.mark.services
def test_board_is_all_open_before_any_action(builtin: None, carol: User) -> None:
    response = login(carol).get(BOARD)

    page = response.content.decode()
    assert response.status_code == 200
    assert "Airport status board" in page
    assert 'class="closed"' not in page
    assert 'class="open" data-target="06/24"' in page
    assert 'class="open" data-target="105"' in page


@pytest.mark.services
def test_board_shows_a_closure_after_an_approved_action(
    carol: User, closure: Restriction, session: Session
) -> None:
    page = login(carol).get(BOARD).content.decode()

    row = board_row(page, "A")
    assert 'class="closed"' in row
    assert "Taxiway closed" in row
    assert reverse("diagnosis:session-detail", args=[session.pk]) in row
    assert 'class="open" data-target="B"' in page
    # carol audits: she sees the closure but no way to lift it
    assert "Lift" not in row


@pytest.mark.services
@pytest.mark.parametrize("persona", ["alice", "bob"])
def test_lift_form_only_for_those_who_manage_the_airport(
    closure: Restriction, persona: str, request: pytest.FixtureRequest
) -> None:
    user = request.getfixturevalue(persona)

    row = board_row(login(user).get(BOARD).content.decode(), "A")

    assert (lift_url(closure) in row) is (persona == "alice")


# --- lifting: an R2 action of its own -------------------------------------------------


def request_lift(user: User, restriction: Restriction, note: str = "cleaned and inspected") -> Any:
    return login(user).post(lift_url(restriction), {"note": note})


def lift_approval(restriction: Restriction) -> Approval:
    return Approval.objects.select_related("tool_call").get(
        action_name="lift_restriction", tool_call__request_payload__restriction=restriction.pk
    )


def approve_lift(restriction: Restriction, approver: User, reason: str = "") -> Approval:
    approval = lift_approval(restriction)
    do_decide(approval.pk, approver, "approve", reason, digest=approval.digest)
    return do_decide(approval.pk, approver, "confirm", reason, digest=approval.digest)


@pytest.mark.services
def test_operator_requests_a_lift_and_the_closure_stays_until_approved(
    alice: User, closure: Restriction, session: Session
) -> None:
    client = login(alice)

    response = client.post(lift_url(closure), {"note": "  cleaned and inspected  "}, follow=True)

    assert "Lift of Taxiway closed: A requested" in response.content.decode()
    closure.refresh_from_db()
    assert closure.is_active
    approval = lift_approval(closure)
    assert (approval.risk_class, approval.status, approval.deadline) == ("R2", "pending", None)
    assert approval.tool_call.request_payload == {
        "restriction": closure.pk,
        "kind": "taxiway",
        "target": "A",
        "note": "cleaned and inspected",
        "requested_by": "alice",
    }
    entry = AuditLog.objects.get(action="restriction.lift_requested")
    assert entry.actor == alice and entry.session_id == session.pk
    event = Event.objects.filter(session=session).order_by("seq").last()
    assert event is not None and event.type == "approval.required"
    assert event.payload["tool_name"] == "lift_restriction"
    row = board_row(response.content.decode(), "A")
    assert 'class="closed"' in row
    assert "Lift requested by alice" in row and lift_url(closure) not in row


@pytest.mark.services
def test_the_lift_waits_in_the_approval_queue(alice: User, bob: User, closure: Restriction) -> None:
    request_lift(alice, closure)

    page = login(bob).get(reverse("approvals:queue")).content.decode()

    assert 'data-tool="lift_restriction"' in page
    assert "lift of a restriction this session put in force, requested by alice" in page


@pytest.mark.services
def test_an_approved_lift_reaches_every_session_that_showed_the_closure(
    alice: User, bob: User, closure: Restriction, session: Session
) -> None:
    version = session.scenario_version
    earlier = Session.objects.create(
        scenario=session.scenario,
        scenario_version=version,
        title="ended before the closure",
        status="completed",
        created_by=alice,
        ended_at=closure.created_at - timedelta(minutes=5),
    )
    live = Session.objects.create(
        scenario=session.scenario, scenario_version=version, title="still open", created_by=alice
    )
    request_lift(alice, closure)

    approval = approve_lift(closure, bob)

    assert approval.status == "approved"
    closure.refresh_from_db()
    assert not closure.is_active
    assert (closure.lifted_by, closure.lift_note) == (bob, "cleaned and inspected")
    assert ToolCall.objects.get(pk=approval.tool_call_id).status == "completed"
    lifted = {
        e.session_id
        for e in Event.objects.filter(type="timeline.appended", payload__kind="restriction_lifted")
    }
    assert lifted == {session.pk, live.pk}
    assert earlier.pk not in lifted
    entry = AuditLog.objects.get(action="restriction.lifted")
    assert entry.actor == bob
    assert (
        entry.detail["requested_by"] == "alice" and entry.detail["note"] == "cleaned and inspected"
    )

    client = login(alice)
    board = client.get(BOARD).content.decode()
    assert 'class="open" data-target="A"' in board
    assert "by bob (approved): <bdi>cleaned and inspected</bdi>" in board
    other = client.get(reverse("diagnosis:session-detail", args=[live.pk])).content.decode()
    assert (
        "Taxiway A lifted (requested by alice, approved by bob): <bdi>cleaned and inspected</bdi>"
        in other
    )


@pytest.mark.services
def test_a_closure_outlives_its_session_and_is_still_lifted_by_decision(
    alice: User, bob: User, closure: Restriction, session: Session
) -> None:
    approve_everything(session, bob)
    assert session.status == "completed"
    request_lift(alice, closure)

    approve_lift(closure, bob)

    closure.refresh_from_db()
    assert not closure.is_active


@pytest.mark.services
def test_a_rejected_lift_keeps_the_closure_and_may_be_requested_again(
    alice: User, bob: User, closure: Restriction
) -> None:
    request_lift(alice, closure)
    approval = lift_approval(closure)

    do_decide(approval.pk, bob, "reject", "crew still on the taxiway", digest=approval.digest)

    closure.refresh_from_db()
    assert closure.is_active
    assert request_lift(alice, closure, "crew gone now").status_code == 302
    assert Approval.objects.filter(action_name="lift_restriction", status="pending").count() == 1


@pytest.mark.services
def test_one_lift_request_at_a_time(alice: User, closure: Restriction) -> None:
    request_lift(alice, closure)

    response = login(alice).post(lift_url(closure), {"note": "again"}, follow=True)

    assert "A lift of Taxiway closed: A already waits for an approver." in response.content.decode()
    assert Approval.objects.filter(action_name="lift_restriction").count() == 1


@pytest.mark.services
def test_the_requester_cannot_decide_their_own_lift(
    make_user: Callable[..., User], closure: Restriction
) -> None:
    admin = make_user("root", ADMIN)
    request_lift(admin, closure)
    approval = lift_approval(closure)

    with pytest.raises(ActionError, match="You requested this lift"):
        do_decide(approval.pk, admin, "approve", digest=approval.digest)

    assert lift_approval(closure).status == "pending"


@pytest.mark.services
def test_a_lifted_restriction_cannot_be_lifted_again(
    alice: User, bob: User, closure: Restriction
) -> None:
    request_lift(alice, closure)
    approve_lift(closure, bob)

    response = login(alice).post(lift_url(closure), {"note": "cleaned again"}, follow=True)

    assert "Taxiway closed: A was already lifted." in response.content.decode()
    assert lift_entries(closure) == 1


@pytest.mark.services
@pytest.mark.parametrize("note", ["", "   ", "x" * 301])
def test_a_lift_request_needs_a_note_of_bounded_length(
    alice: User, closure: Restriction, note: str
) -> None:
    response = login(alice).post(lift_url(closure), {"note": note}, follow=True)

    expected = (
        "The note is too long: 301 characters, at most 300 characters."
        if note.strip()
        else "Say why the restriction is lifted (a note is required)."
    )
    assert expected in response.content.decode()
    assert not Approval.objects.filter(action_name="lift_restriction").exists()


@pytest.mark.services
@pytest.mark.parametrize("persona", ["bob", "carol", "dave"])
def test_approvers_auditors_and_users_without_role_cannot_request_a_lift(
    closure: Restriction, persona: str, request: pytest.FixtureRequest
) -> None:
    user = request.getfixturevalue(persona)

    response = login(user).post(lift_url(closure), {"note": "cleaned"})

    assert response.status_code == 403
    assert not Approval.objects.filter(action_name="lift_restriction").exists()


@pytest.mark.services
def test_anonymous_cannot_request_a_lift(closure: Restriction) -> None:
    response = login(None).post(lift_url(closure), {"note": "cleaned"})

    assert response.status_code == 302
    assert response["Location"] == login_url(lift_url(closure))
    assert not Approval.objects.filter(action_name="lift_restriction").exists()


@pytest.mark.services
def test_lift_refuses_get(alice: User, closure: Restriction) -> None:
    assert login(alice).get(lift_url(closure)).status_code == 405


def test_unknown_restriction_is_404(alice: User) -> None:
    assert login(alice).post(lift_url(999_999), {"note": "cleaned"}).status_code == 404
