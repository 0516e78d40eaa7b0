"""Issue 12, the approval queue as an approver meets it: filters that survive a push and a
decision, errors on the card they are about, time left in seconds near the end (red in the
last minute), the open count in the nav and the tab title, one incident's R1 actions
decided at once (never R2/R3), the to-dos page for approvers, styled error pages.

Personas: olga operates, abel approves, carol audits."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from aero.models import AuditLog
from approvals.models import Approval, ManualTodo
from diagnosis.models import Event, Session
from tests.web_helpers import approval_for, login

pytestmark = pytest.mark.services
HTMX = {"HX-Request": "true"}


def card(html: str, approval: Approval) -> str:
    start = html.index(f'id="approval-{approval.pk}"')
    return html[start : html.index("</article>", start)]


# --- filters -----------------------------------------------------------------------


def test_a_filter_change_reconnects_the_live_socket_with_that_filter(
    stand_leak: Session, abel: User
) -> None:
    response = login(abel).get(
        "/approvals/?risk=R2", headers={**HTMX, "HX-Target": "approval-live"}
    )

    html = response.content.decode()
    # The swapped block carries the socket: its pushes re-render with risk=R2, not the
    # filter the page was first opened with.
    assert html.lstrip().startswith('<div id="approval-live"')
    socket = "/ws/approvals/?risk=R2&amp;scenario=&amp;after=&amp;incident=&amp;lang=en"
    assert f'ws-connect="{socket}"' in html
    assert set(re.findall(r'data-risk="(R\d)"', html)) == {"R2"}


def test_deciding_from_a_filtered_queue_keeps_the_filter(stand_leak: Session, abel: User) -> None:
    crew = approval_for(stand_leak, "dispatch_cleanup_crew")
    fire = approval_for(stand_leak, "request_fire_standby")

    response = login(abel).post(
        reverse("approvals:decide", args=[crew.pk]),
        {"decision": "approve", "digest": crew.digest, "next": "queue", "risk": "R1"},
        headers=HTMX,
    )

    html = response.content.decode()
    assert response.status_code == 200
    assert set(re.findall(r'data-risk="(R\d)"', html)) == {"R1"}
    assert f'id="approval-{fire.pk}"' in html


# --- errors on the card --------------------------------------------------------------


def test_a_refused_decision_shows_its_error_on_its_card(stand_leak: Session, abel: User) -> None:
    stand = approval_for(stand_leak, "suspend_stand_operations")
    crew = approval_for(stand_leak, "dispatch_cleanup_crew")

    response = login(abel).post(
        reverse("approvals:decide", args=[stand.pk]),
        {"decision": "reject", "digest": stand.digest, "next": "queue"},
        headers=HTMX,
    )

    html = response.content.decode()
    assert response.status_code == 400
    assert "A rejection needs a reason." in card(html, stand)
    assert "A rejection needs a reason." not in card(html, crew)
    assert html.count("A rejection needs a reason.") == 1  # not also at the top
    assert Approval.objects.get(pk=stand.pk).status == "pending"


# --- time left -----------------------------------------------------------------------


def test_time_left_reads_in_minutes_then_seconds_and_turns_red_in_the_last_minute(
    stand_leak: Session, abel: User
) -> None:
    crew = approval_for(stand_leak, "dispatch_cleanup_crew")
    fire = approval_for(stand_leak, "request_fire_standby")
    stand = approval_for(stand_leak, "suspend_stand_operations")
    now = timezone.now()
    Approval.objects.filter(pk=crew.pk).update(deadline=now + timedelta(minutes=4, seconds=30))
    Approval.objects.filter(pk=fire.pk).update(deadline=now + timedelta(seconds=100))
    Approval.objects.filter(pk=stand.pk).update(deadline=now + timedelta(seconds=45))

    html = login(abel).get("/approvals/").content.decode()

    assert "times out in 5 min" in card(html, crew)  # rounded up, never earlier than true
    assert re.search(r"times out in (9\d|100) s", card(html, fire))
    assert re.search(r"times out in [34]\d s", card(html, stand))
    assert 'class="deadline deadline-urgent"' in card(html, stand)
    assert "deadline-urgent" not in card(html, fire)
    # The countdown script reads translated texts, not English built into the script.
    assert 'data-text-sec="times out in {n} s"' in card(html, fire)


# --- the open count ------------------------------------------------------------------


def test_the_nav_and_the_tab_title_show_the_open_count_to_approvers(
    stand_leak: Session, abel: User, olga: User
) -> None:
    open_count = Approval.objects.open().count()

    html = login(abel).get(reverse("diagnosis:session-list")).content.decode()

    assert f"<title>({open_count}) " in html
    assert f'data-testid="pending-count">{open_count}</span>' in html
    operator_page = login(olga).get(reverse("diagnosis:session-list")).content.decode()
    assert "pending-count" not in operator_page and "<title>(" not in operator_page


# --- one incident's R1 items at once ---------------------------------------------------


def bulk(client: Client, session: Session, decision: str, approvals: list[Approval], **data: str):  # type: ignore[no-untyped-def]
    return client.post(
        reverse("approvals:bulk-decide", args=[session.pk]),
        {
            "decision": decision,
            "approval": [f"{a.pk}:{a.digest}" for a in approvals],
            **data,
        },
        headers=HTMX,
    )


def test_all_r1_actions_of_an_incident_are_approved_at_once(
    stand_leak: Session, abel: User
) -> None:
    r1 = list(Approval.objects.filter(session=stand_leak, risk_class="R1"))
    assert len(r1) == 2
    html = login(abel).get("/approvals/").content.decode()
    assert "Approve all 2 R1 actions" in html

    response = bulk(login(abel), stand_leak, "approve", r1)

    assert response.status_code == 200
    assert {a.status for a in Approval.objects.filter(session=stand_leak, risk_class="R1")} == {
        "approved"
    }
    # Each decision is its own event and audit row.
    decided = Event.objects.filter(session=stand_leak, type="approval.approved")
    assert sorted(e.payload["tool_call"] for e in decided) == sorted(a.tool_call_id for a in r1)
    assert AuditLog.objects.filter(action="approval.approved").count() == 2
    assert Approval.objects.filter(session=stand_leak, risk_class="R2", status="pending").exists()


def test_a_batch_never_takes_an_r2_action(stand_leak: Session, abel: User) -> None:
    crew = approval_for(stand_leak, "dispatch_cleanup_crew")
    stand = approval_for(stand_leak, "suspend_stand_operations")

    response = bulk(login(abel), stand_leak, "approve", [crew, stand])

    assert response.status_code == 400
    assert "only R1 actions are decided in a batch" in response.content.decode()
    assert Approval.objects.get(pk=crew.pk).status == "pending"  # all or nothing
    assert Approval.objects.get(pk=stand.pk).status == "pending"


def test_a_batch_rejection_needs_a_reason_and_changes_nothing_without(
    stand_leak: Session, abel: User
) -> None:
    r1 = list(Approval.objects.filter(session=stand_leak, risk_class="R1"))

    refused = bulk(login(abel), stand_leak, "reject", r1)
    rejected = bulk(login(abel), stand_leak, "reject", r1, reason="crew already on site")

    assert refused.status_code == 400 and "A rejection needs a reason." in refused.content.decode()
    assert rejected.status_code == 200
    assert {a.status for a in Approval.objects.filter(pk__in=[a.pk for a in r1])} == {"rejected"}


def test_a_batch_with_a_stale_digest_is_refused_whole(stand_leak: Session, abel: User) -> None:
    crew, fire = list(Approval.objects.filter(session=stand_leak, risk_class="R1"))
    response = login(abel).post(
        reverse("approvals:bulk-decide", args=[stand_leak.pk]),
        {"decision": "approve", "approval": [f"{crew.pk}:{crew.digest}", f"{fire.pk}:old"]},
        headers=HTMX,
    )

    assert response.status_code == 400
    assert "not the one you were shown" in response.content.decode()
    assert Approval.objects.get(pk=crew.pk).status == "pending"


@pytest.mark.parametrize("persona", ["olga", "carol"])
def test_operators_and_auditors_cannot_decide_a_batch(
    stand_leak: Session, persona: str, request: pytest.FixtureRequest
) -> None:
    r1 = list(Approval.objects.filter(session=stand_leak, risk_class="R1"))

    response = bulk(login(request.getfixturevalue(persona)), stand_leak, "approve", r1)

    assert response.status_code == 403
    assert {a.status for a in Approval.objects.filter(pk__in=[a.pk for a in r1])} == {"pending"}


# --- to-dos and error pages -------------------------------------------------------------


def test_approvers_read_the_todos_but_only_operators_resolve_them(
    stand_leak: Session, abel: User, olga: User
) -> None:
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")
    todo = ManualTodo.objects.create(approval=closure, session=stand_leak, title="close A by hand")

    page = login(abel).get(reverse("approvals:todo-list"))

    assert page.status_code == 200 and "close A by hand" in page.content.decode()
    assert reverse("approvals:todo-resolve", args=[todo.pk]) not in page.content.decode()
    nav = login(abel).get(reverse("diagnosis:session-list")).content.decode()
    assert f'href="{reverse("approvals:todo-list")}"' in nav
    refused = login(abel).post(reverse("approvals:todo-resolve", args=[todo.pk]), {"note": "x"})
    assert refused.status_code == 403
    assert ManualTodo.objects.get(pk=todo.pk).resolved_at is None


def test_error_pages_are_styled_pages_with_a_way_back(builtin: None, carol: User) -> None:
    forbidden = login(carol).get("/approvals/")
    missing = login(carol).get("/sessions/00000000-0000-0000-0000-000000000000/")

    for response, code in ((forbidden, 403), (missing, 404)):
        html = response.content.decode()
        assert response.status_code == code
        assert 'data-testid="error-page"' in html and f'class="code">{code}<' in html
        assert 'href="/"' in html and "aero.css" in html


def test_the_server_error_page_renders_without_a_request(settings: object) -> None:
    from django.template.loader import render_to_string

    html = render_to_string("500.html")

    assert 'data-testid="error-page"' in html and "500" in html and "aero.css" in html
