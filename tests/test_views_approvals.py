"""Deciding approvals (approvals:decide): R1 once, R2 approve then confirm, R3 with a
reason, rejections with a reason; every decision audited.

Personas: bob and beth approve, alice operates, carol audits, dave has no role."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from aero.models import AuditLog
from aero.roles import ADMIN, APPROVER
from approvals.models import Approval, ApprovalStatus
from diagnosis.events import set_status
from diagnosis.models import Session, SessionStatus, ToolCallStatus
from packs.airport.models import Restriction
from tests.web_helpers import (
    STAND_FUEL_LEAK,
    TAXIWAY_FUEL_LEAK,
    approval_for,
    login,
    login_url,
    make_session,
)

if TYPE_CHECKING:
    from django.test.client import _MonkeyPatchedWSGIResponse as Response

HTMX = {"HX-Request": "true"}


@pytest.fixture
def beth(make_user: Callable[..., User]) -> User:
    return make_user("beth", APPROVER)


@pytest.fixture
def stand_leak(builtin: None, alice: User) -> Session:
    """Stand 105: R1 cleanup crew and fire standby, R2 stand suspension and taxiway closures."""
    session = make_session(alice, STAND_FUEL_LEAK)
    assert session.status == SessionStatus.WAITING_USER
    return session


@pytest.fixture
def taxiway_leak(builtin: None, alice: User) -> Session:
    """Taxiway node C1 next to runway 06/24: the impact reaches the runway (R3 close_runway)."""
    session = make_session(alice, TAXIWAY_FUEL_LEAK)
    assert session.snapshot["impact"]["runways"] == ["06/24"]
    return session


def decide(
    client: Client,
    approval: Approval,
    decision: str,
    reason: str = "",
    digest: str | None = None,
    *,
    follow: bool = False,
    headers: dict[str, str] | None = None,
) -> Response:
    data = {
        "decision": decision,
        "reason": reason,
        "digest": approval.digest if digest is None else digest,
    }
    return client.post(
        reverse("approvals:decide", args=[approval.pk]), data, follow=follow, headers=headers
    )


def decisions_recorded(approval: Approval) -> list[str]:
    return list(
        AuditLog.objects.filter(object_type="approvals.approval", object_id=str(approval.pk))
        .order_by("id")
        .values_list("action", flat=True)
    )


def detail(session: Session) -> str:
    return reverse("diagnosis:session-detail", args=[session.pk])


# --- access -------------------------------------------------------------------------


@pytest.mark.services
def test_anonymous_is_sent_to_login(stand_leak: Session) -> None:
    approval = approval_for(stand_leak, "dispatch_cleanup_crew")
    path = reverse("approvals:decide", args=[approval.pk])

    response = decide(login(None), approval, "approve")

    assert response.status_code == 302
    assert response["Location"] == login_url(path)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert decisions_recorded(approval) == []


@pytest.mark.services
@pytest.mark.parametrize("persona", ["alice", "carol", "dave"])
def test_operators_auditors_and_users_without_role_cannot_decide(
    stand_leak: Session, persona: str, request: pytest.FixtureRequest
) -> None:
    approval = approval_for(stand_leak, "dispatch_cleanup_crew")
    user = request.getfixturevalue(persona)

    response = decide(login(user), approval, "approve")

    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert approval.tool_call.status == ToolCallStatus.AWAITING_APPROVAL
    assert decisions_recorded(approval) == []


@pytest.mark.services
def test_get_is_not_allowed(bob: User, stand_leak: Session) -> None:
    approval = approval_for(stand_leak, "dispatch_cleanup_crew")

    response = login(bob).get(reverse("approvals:decide", args=[approval.pk]))

    assert response.status_code == 405


def test_unknown_approval_is_404(bob: User) -> None:
    response = login(bob).post(reverse("approvals:decide", args=[999_999]), {"decision": "approve"})

    assert response.status_code == 404


# --- R1 -----------------------------------------------------------------------------


@pytest.mark.services
def test_r1_is_approved_once_and_executed(bob: User, stand_leak: Session) -> None:
    approval = approval_for(stand_leak, "dispatch_cleanup_crew")
    client = login(bob)

    response = decide(client, approval, "approve")

    assert response.status_code == 302
    assert response["Location"] == detail(stand_leak)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.approver == bob
    call = approval.tool_call
    call.refresh_from_db()
    # the decision queued a resume; the inline job executed the action
    assert call.status == ToolCallStatus.COMPLETED
    assert call.decided_by == bob
    assert call.response_payload["summary"]
    assert decisions_recorded(approval) == ["approval.approved"]
    entry = AuditLog.objects.get(action="approval.approved", object_id=str(approval.pk))
    assert entry.actor == bob and entry.session_id == stand_leak.pk
    assert entry.detail["tool"] == "dispatch_cleanup_crew"
    assert entry.detail["args"] == {"position": "105"}
    page = client.get(detail(stand_leak)).content.decode()
    assert (
        'bob approved <span title="dispatch_cleanup_crew">Dispatch the cleanup crew (105)</span>'
        in page
    )


@pytest.mark.services
@pytest.mark.parametrize("role", [ADMIN, None])
def test_admins_can_decide(
    stand_leak: Session, make_user: Callable[..., User], role: str | None
) -> None:
    user = (
        make_user("admin", role)
        if role
        else User.objects.create_superuser("root", password="pw-for-tests")
    )
    approval = approval_for(stand_leak, "request_fire_standby")

    response = decide(login(user), approval, "approve")

    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.approver == user


# --- R2 -----------------------------------------------------------------------------


@pytest.mark.services
def test_r2_needs_an_approval_and_a_confirmation(bob: User, stand_leak: Session) -> None:
    approval = approval_for(stand_leak, "suspend_stand_operations")
    client = login(bob)

    decide(client, approval, "approve")

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.CONFIRMING
    assert approval.first_approved_by == bob
    assert approval.tool_call.status == ToolCallStatus.AWAITING_APPROVAL
    assert not Restriction.objects.exists()
    page = client.get(detail(stand_leak)).content.decode()
    assert "Approved once by bob: confirm this exact action." in page
    assert "Confirm (2 of 2)" in page

    decide(client, approval, "confirm")

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    approval.tool_call.refresh_from_db()
    assert approval.tool_call.status == ToolCallStatus.COMPLETED
    restriction = Restriction.objects.get()
    assert (restriction.kind, restriction.target) == ("stand", "105")
    assert decisions_recorded(approval) == ["approval.first_approved", "approval.approved"]


@pytest.mark.services
def test_a_repeated_approve_is_not_taken_as_the_confirmation(
    bob: User, stand_leak: Session
) -> None:
    approval = approval_for(stand_leak, "suspend_stand_operations")
    client = login(bob)
    decide(client, approval, "approve")

    response = decide(client, approval, "approve", follow=True)  # a double click

    assert "confirm it explicitly" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.CONFIRMING
    assert not Restriction.objects.exists()
    assert decisions_recorded(approval) == ["approval.first_approved"]


@pytest.mark.services
def test_r2_can_be_confirmed_by_a_second_approver(
    bob: User, beth: User, stand_leak: Session
) -> None:
    approval = approval_for(stand_leak, "close_taxiway", taxiway="A")

    decide(login(bob), approval, "approve")
    decide(login(beth), approval, "confirm")

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert (approval.first_approved_by, approval.approver) == (bob, beth)
    assert Restriction.objects.get().target == "A"


@pytest.mark.services
def test_r2_can_be_rejected_at_the_confirmation(bob: User, stand_leak: Session) -> None:
    approval = approval_for(stand_leak, "close_taxiway", taxiway="B")
    client = login(bob)
    decide(client, approval, "approve")

    decide(client, approval, "reject", "wrong taxiway")

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.REJECTED
    approval.tool_call.refresh_from_db()
    assert approval.tool_call.status == ToolCallStatus.REJECTED
    assert not Restriction.objects.exists()


# --- R3 -----------------------------------------------------------------------------


@pytest.mark.services
def test_r3_needs_a_written_reason(bob: User, taxiway_leak: Session) -> None:
    approval = approval_for(taxiway_leak, "close_runway")
    assert approval.risk_class == "R3"
    client = login(bob)
    assert "Confirm with reason" in client.get(detail(taxiway_leak)).content.decode()

    refused = decide(client, approval, "approve", "   ", follow=True)

    assert "An R3 action needs a written reason to be confirmed." in refused.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert decisions_recorded(approval) == []

    decide(client, approval, "approve", "fuel on the runway edge, confirmed by tower")

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.reason == "fuel on the runway edge, confirmed by tower"
    restriction = Restriction.objects.get()
    assert (restriction.kind, restriction.target) == ("runway", "06/24")
    entry = AuditLog.objects.get(action="approval.approved", object_id=str(approval.pk))
    assert entry.detail["risk_class"] == "R3"
    assert entry.detail["reason"] == "fuel on the runway edge, confirmed by tower"


# --- rejection ----------------------------------------------------------------------


@pytest.mark.services
def test_reject_needs_a_reason(bob: User, stand_leak: Session) -> None:
    approval = approval_for(stand_leak, "request_fire_standby")
    client = login(bob)

    refused = decide(client, approval, "reject", follow=True)

    assert "A rejection needs a reason." in refused.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert decisions_recorded(approval) == []

    decide(client, approval, "reject", "fire crew already on scene")

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.REJECTED
    assert approval.tool_call.status == ToolCallStatus.REJECTED
    assert approval.tool_call.decision_reason == "fire crew already on scene"
    assert decisions_recorded(approval) == ["approval.rejected"]
    page = client.get(detail(stand_leak)).content.decode()
    assert (
        'bob rejected <span title="request_fire_standby">Put the fire brigade on standby (105)'
        "</span>: “<bdi>fire crew already on scene</bdi>”" in page
    )


@pytest.mark.services
def test_unknown_decision_is_refused(bob: User, stand_leak: Session) -> None:
    approval = approval_for(stand_leak, "dispatch_cleanup_crew")

    response = decide(login(bob), approval, "maybe", follow=True)

    assert "Unknown decision: choose approve, confirm or reject." in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


# --- refusals -----------------------------------------------------------------------


@pytest.mark.services
def test_second_decision_is_refused_and_only_one_recorded(
    bob: User, beth: User, stand_leak: Session
) -> None:
    approval = approval_for(stand_leak, "dispatch_cleanup_crew")
    decide(login(bob), approval, "approve")

    response = decide(login(beth), approval, "reject", "too late", follow=True)

    assert (
        "This action was already approved; your decision was not recorded."
        in response.content.decode()
    )
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.approver == bob
    assert decisions_recorded(approval) == ["approval.approved"]


@pytest.mark.services
def test_a_stale_digest_is_refused(bob: User, stand_leak: Session) -> None:
    approval = approval_for(stand_leak, "dispatch_cleanup_crew")

    response = decide(login(bob), approval, "approve", digest="0" * 64, follow=True)

    assert (
        "This request is not the one you were shown; reload and decide again."
        in response.content.decode()
    )
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert decisions_recorded(approval) == []


@pytest.mark.services
def test_arguments_changed_after_the_request_are_refused(bob: User, stand_leak: Session) -> None:
    approval = approval_for(stand_leak, "dispatch_cleanup_crew")
    approval.tool_call.request_payload = {"position": "101"}
    approval.tool_call.save(update_fields=["request_payload"])

    response = decide(login(bob), approval, "approve", follow=True)

    assert (
        "The action&#x27;s arguments changed after it was requested; refused."
        in response.content.decode()
    )
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


@pytest.mark.services
def test_nothing_can_be_approved_in_an_ended_session(bob: User, stand_leak: Session) -> None:
    set_status(stand_leak.pk, SessionStatus.CANCELED, producer="test")
    approval = approval_for(stand_leak, "dispatch_cleanup_crew")

    response = decide(login(bob), approval, "approve", headers=HTMX)

    assert response.status_code == 400
    assert (
        "The session is canceled; nothing can be decided in it any more."
        in response.content.decode()
    )
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


# --- htmx ---------------------------------------------------------------------------


@pytest.mark.services
def test_htmx_decision_returns_the_actions_partial(bob: User, stand_leak: Session) -> None:
    approval = approval_for(stand_leak, "suspend_stand_operations")

    response = decide(login(bob), approval, "approve", headers=HTMX)

    page = response.content.decode()
    assert response.status_code == 200
    assert page.lstrip().startswith('<section id="session-actions"')
    assert "<html" not in page
    assert "Approved once by bob: confirm this exact action." in page


@pytest.mark.services
def test_htmx_refusal_shows_the_error_in_the_partial(bob: User, stand_leak: Session) -> None:
    approval = approval_for(stand_leak, "dispatch_cleanup_crew")

    response = decide(login(bob), approval, "reject", headers=HTMX)

    page = response.content.decode()
    assert response.status_code == 400
    assert page.lstrip().startswith('<section id="session-actions"')
    assert '<p class="error" role="alert">A rejection needs a reason.</p>' in page


# --- the whole session --------------------------------------------------------------


@pytest.mark.services
def test_every_decision_is_audited_and_the_session_completes(
    bob: User, stand_leak: Session
) -> None:
    client = login(bob)
    approvals = list(Approval.objects.filter(session=stand_leak).order_by("pk"))
    for approval in approvals:
        decide(client, approval, "approve")
        if approval.risk_class == "R2":
            decide(client, approval, "confirm")

    stand_leak.refresh_from_db()
    assert stand_leak.status == SessionStatus.COMPLETED
    for approval in approvals:
        expected = (
            ["approval.first_approved", "approval.approved"]
            if approval.risk_class == "R2"
            else ["approval.approved"]
        )
        assert decisions_recorded(approval) == expected
    assert set(Restriction.objects.values_list("kind", "target")) == {
        ("stand", "105"),
        ("taxiway", "A"),
        ("taxiway", "B"),
    }
