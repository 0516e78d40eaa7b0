"""The airport status board and lifting restrictions.

Personas: alice operates, bob approves, carol audits, dave has no role."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from aero.models import AuditLog
from aero.roles import ADMIN
from approvals.actions import do_decide
from diagnosis.models import Event, Restriction, Session
from tests.web_helpers import STAND_FUEL_LEAK, approval_for, login, login_url, make_session

BOARD = "/airport/"


@pytest.fixture
def session(builtin: None, alice: User) -> Session:
    return make_session(alice, STAND_FUEL_LEAK)


@pytest.fixture
def closure(session: Session, bob: User) -> Restriction:
    """Taxiway A closed: bob approved and confirmed the R2 close_taxiway action."""
    approval = approval_for(session, "close_taxiway", taxiway="A")
    do_decide(approval.pk, bob, "approve")
    do_decide(approval.pk, bob, "confirm")
    return Restriction.objects.get(kind="taxiway", target="A")


def lift_url(restriction: Restriction | int) -> str:
    pk = restriction if isinstance(restriction, int) else restriction.pk
    return reverse("diagnosis:restriction-lift", args=[pk])


def board_row(page: str, target: str) -> str:
    start = page.index(f'data-target="{target}"')
    return page[page.rindex("<tr", 0, start) : page.index("</tr>", start)]


def lift_entries(restriction: Restriction) -> int:
    return AuditLog.objects.filter(
        action="restriction.lifted", object_id=str(restriction.pk)
    ).count()


# --- the board ----------------------------------------------------------------------


def test_board_url_is_stable() -> None:
    assert reverse("diagnosis:airport-board") == BOARD


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


# --- lifting ------------------------------------------------------------------------


@pytest.mark.services
def test_operator_lifts_a_closure_with_a_note(
    alice: User, closure: Restriction, session: Session
) -> None:
    client = login(alice)

    response = client.post(lift_url(closure), {"note": "  cleaned and inspected  "})

    assert response.status_code == 302
    assert response["Location"] == BOARD
    closure.refresh_from_db()
    assert closure.lifted_at is not None
    assert closure.lifted_by == alice
    assert closure.lift_note == "cleaned and inspected"
    entry = AuditLog.objects.get(action="restriction.lifted")
    assert entry.actor == alice and entry.session_id == session.pk
    assert entry.detail == {"kind": "taxiway", "target": "A", "note": "cleaned and inspected"}
    event = Event.objects.filter(session=session).order_by("seq").last()
    assert event is not None
    assert event.type == "timeline.appended"
    assert event.payload["kind"] == "restriction_lifted"

    board = client.get(BOARD).content.decode()
    assert "Taxiway closed: A lifted." in board
    assert 'class="open" data-target="A"' in board
    assert "Recently lifted" in board and "by alice: cleaned and inspected" in board
    timeline = client.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert "alice lifted taxiway A: cleaned and inspected" in timeline


@pytest.mark.services
@pytest.mark.parametrize("role", [ADMIN, None])
def test_admins_can_lift(
    closure: Restriction, make_user: Callable[..., User], role: str | None
) -> None:
    user = (
        make_user("admin", role)
        if role
        else User.objects.create_superuser("root", password="pw-for-tests")
    )

    response = login(user).post(lift_url(closure), {"note": "runway inspection done"})

    assert response.status_code == 302
    closure.refresh_from_db()
    assert closure.lifted_by == user


@pytest.mark.services
@pytest.mark.parametrize("note", ["", "   "])
def test_lifting_needs_a_note(alice: User, closure: Restriction, note: str) -> None:
    response = login(alice).post(lift_url(closure), {"note": note}, follow=True)

    assert "Say why the restriction is lifted (a note is required)." in response.content.decode()
    closure.refresh_from_db()
    assert closure.is_active
    assert lift_entries(closure) == 0


@pytest.mark.services
def test_lifting_twice_says_so(alice: User, closure: Restriction) -> None:
    client = login(alice)
    client.post(lift_url(closure), {"note": "cleaned"})

    response = client.post(lift_url(closure), {"note": "cleaned again"}, follow=True)

    assert "Taxiway closed: A was already lifted." in response.content.decode()
    closure.refresh_from_db()
    assert closure.lift_note == "cleaned"
    assert lift_entries(closure) == 1


@pytest.mark.services
@pytest.mark.parametrize("persona", ["bob", "carol", "dave"])
def test_approvers_auditors_and_users_without_role_cannot_lift(
    closure: Restriction, persona: str, request: pytest.FixtureRequest
) -> None:
    user = request.getfixturevalue(persona)

    response = login(user).post(lift_url(closure), {"note": "cleaned"})

    assert response.status_code == 403
    closure.refresh_from_db()
    assert closure.is_active
    assert lift_entries(closure) == 0


@pytest.mark.services
def test_anonymous_cannot_lift(closure: Restriction) -> None:
    response = login(None).post(lift_url(closure), {"note": "cleaned"})

    assert response.status_code == 302
    assert response["Location"] == login_url(lift_url(closure))
    closure.refresh_from_db()
    assert closure.is_active


@pytest.mark.services
def test_lift_refuses_get(alice: User, closure: Restriction) -> None:
    assert login(alice).get(lift_url(closure)).status_code == 405


def test_unknown_restriction_is_404(alice: User) -> None:
    assert login(alice).post(lift_url(999_999), {"note": "cleaned"}).status_code == 404
