"""Session pages: list, create, detail, answer, cancel, retry, events, report download.

Personas: alice operates, bob approves, carol audits (read-only), dave has no role,
root is a superuser."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from playwright.sync_api import Browser, expect
from pytest_django import Settings

from aero.models import AuditLog
from aero.roles import ADMIN
from approvals.models import Approval
from diagnosis.events import set_status
from diagnosis.models import Event, Report, Session, SessionStatus
from packs.airport.agent import policy
from scenarios_admin.models import Scenario
from tests.browser_helpers import sign_in
from tests.web_helpers import (
    NO_POSITION,
    STAND_FUEL_LEAK,
    approve_everything,
    login,
    login_url,
    make_session,
)

if TYPE_CHECKING:
    from django.test.client import _MonkeyPatchedWSGIResponse as Response

SESSION_ENDPOINTS = [
    "session-detail",
    "session-answer",
    "session-cancel",
    "session-retry",
    "session-events",
    "session-report",
]
POST_ONLY = ["session-create", "session-answer", "session-cancel", "session-retry"]
GET_ONLY = ["session-list", "session-detail", "session-events", "session-report"]


def url(name: str, session_id: uuid.UUID | None = None) -> str:
    if name in SESSION_ENDPOINTS:
        return reverse(f"diagnosis:{name}", args=[session_id or uuid.uuid4()])
    return reverse(f"diagnosis:{name}")


def call(
    client: Client,
    name: str,
    session_id: uuid.UUID | None = None,
    data: dict[str, str] | None = None,
) -> Response:
    if name in POST_ONLY:
        return client.post(url(name, session_id), data or {})
    return client.get(url(name, session_id))


@pytest.fixture
def oil_spill(builtin: None) -> Scenario:
    return Scenario.objects.get(slug="oil_spill")


@pytest.fixture
def waiting(builtin: None, alice: User) -> Session:
    """Every P1 field given: the session waits for approvals, no question open."""
    return make_session(alice, STAND_FUEL_LEAK)


@pytest.fixture
def asking(builtin: None, alice: User) -> Session:
    """The position is missing: the agent has asked where the spill is."""
    return make_session(alice, NO_POSITION)


@pytest.fixture
def failed(
    builtin: None, alice: User, monkeypatch: pytest.MonkeyPatch, settings: Settings
) -> Session:
    """The risk rules crash while the agent runs: the job gives up and the session fails."""
    settings.AERO_JOB_ATTEMPTS = 1

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("risk rules unavailable")

    with monkeypatch.context() as patch:
        patch.setattr(policy, "assess_risk", crash)
        session = make_session(alice, STAND_FUEL_LEAK)
    assert session.status == SessionStatus.FAILED
    return session


def user_messages(session: Session) -> int:
    return Event.objects.filter(session=session, type="user.message").count()


# --- access -------------------------------------------------------------------------


@pytest.mark.parametrize("name", POST_ONLY + GET_ONLY)
def test_anonymous_is_sent_to_login(db: None, name: str) -> None:
    session_id = uuid.uuid4()
    response = call(login(None), name, session_id, data={"message": "x"})

    assert response.status_code == 302
    assert response["Location"] == login_url(url(name, session_id))


@pytest.mark.parametrize("name", POST_ONLY + GET_ONLY)
def test_user_without_role_is_refused(dave: User, name: str) -> None:
    response = call(login(dave), name, data={"message": "x"})

    assert response.status_code == 403


# session-create answers a GET with the page its form is on: the address a sign-in may
# return to (tests/test_signed_out.py).
@pytest.mark.parametrize("name", [name for name in POST_ONLY if name != "session-create"])
def test_post_only_endpoints_refuse_get(alice: User, name: str) -> None:
    response = login(alice).get(url(name))

    assert response.status_code == 405


@pytest.mark.parametrize("name", GET_ONLY)
def test_read_only_endpoints_refuse_post(alice: User, name: str) -> None:
    response = login(alice).post(url(name))

    assert response.status_code == 405


@pytest.mark.services
@pytest.mark.parametrize("persona", ["bob", "carol"])
def test_approver_and_auditor_cannot_create(
    oil_spill: Scenario, persona: str, request: pytest.FixtureRequest
) -> None:
    user = request.getfixturevalue(persona)
    response = login(user).post(
        url("session-create"), {"scenario": oil_spill.pk, "message": STAND_FUEL_LEAK}
    )

    assert response.status_code == 403
    assert not Session.objects.exists()


@pytest.mark.services
@pytest.mark.parametrize("persona", ["bob", "carol"])
def test_approver_and_auditor_cannot_answer(
    asking: Session, persona: str, request: pytest.FixtureRequest
) -> None:
    user = request.getfixturevalue(persona)
    before = user_messages(asking)

    response = login(user).post(url("session-answer", asking.pk), {"message": "stand 105"})

    assert response.status_code == 403
    assert user_messages(asking) == before
    asking.refresh_from_db()
    assert asking.snapshot["question"]["field"] == "position"


@pytest.mark.services
@pytest.mark.parametrize("persona", ["bob", "carol"])
def test_approver_and_auditor_cannot_cancel(
    waiting: Session, persona: str, request: pytest.FixtureRequest
) -> None:
    user = request.getfixturevalue(persona)

    response = login(user).post(url("session-cancel", waiting.pk))

    assert response.status_code == 403
    waiting.refresh_from_db()
    assert waiting.status == SessionStatus.WAITING_USER


@pytest.mark.services
@pytest.mark.parametrize("persona", ["bob", "carol"])
def test_approver_and_auditor_cannot_retry(
    failed: Session, persona: str, request: pytest.FixtureRequest
) -> None:
    user = request.getfixturevalue(persona)

    response = login(user).post(url("session-retry", failed.pk))

    assert response.status_code == 403
    failed.refresh_from_db()
    assert failed.status == SessionStatus.FAILED


# --- list ---------------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["alice", "bob", "carol"])
def test_every_role_can_read_the_list(persona: str, request: pytest.FixtureRequest) -> None:
    user = request.getfixturevalue(persona)

    response = login(user).get(url("session-list"))

    assert response.status_code == 200
    assert "No sessions yet." in response.content.decode()


@pytest.mark.services
def test_list_shows_sessions_and_filters_by_status(
    alice: User, bob: User, waiting: Session, asking: Session
) -> None:
    Session.objects.filter(pk=asking.pk).update(status=SessionStatus.COMPLETED)
    client = login(bob)

    everything = client.get(url("session-list")).content.decode()
    completed = client.get(url("session-list"), {"status": "completed"}).content.decode()
    failed = client.get(url("session-list"), {"status": "failed"}).content.decode()

    assert waiting.title in everything and asking.title in everything
    assert asking.title in completed and waiting.title not in completed
    assert '<option value="completed" selected>' in completed
    assert "No sessions yet." in failed


@pytest.mark.services
def test_list_offers_the_new_session_form_only_to_runners(
    oil_spill: Scenario, alice: User, carol: User
) -> None:
    assert "Open session" in login(alice).get(url("session-list")).content.decode()
    assert "Open session" not in login(carol).get(url("session-list")).content.decode()


# --- create -------------------------------------------------------------------------


@pytest.mark.services
def test_create_runs_the_agent_until_it_asks(oil_spill: Scenario, alice: User) -> None:
    response = login(alice).post(
        url("session-create"), {"scenario": oil_spill.pk, "message": NO_POSITION}
    )

    session = Session.objects.get()
    assert response.status_code == 302
    assert response["Location"] == url("session-detail", session.pk)
    assert session.created_by == alice
    assert session.status == SessionStatus.WAITING_USER
    assert session.snapshot["question"]["field"] == "position"
    assert AuditLog.objects.filter(action="session.created", session_id=session.pk).count() == 1


@pytest.mark.services
def test_create_with_every_fact_reaches_the_approvals(oil_spill: Scenario, alice: User) -> None:
    response = login(alice).post(
        url("session-create"), {"scenario": oil_spill.pk, "message": STAND_FUEL_LEAK}
    )

    session = Session.objects.get()
    assert response.status_code == 302
    assert session.status == SessionStatus.WAITING_USER
    assert session.snapshot["risk"]["level"] == "HIGH"
    assert session.approvals.filter(status="pending").exists()


@pytest.mark.services
@pytest.mark.parametrize("role", [ADMIN, None])
def test_admins_can_create(
    oil_spill: Scenario, make_user: Callable[..., User], role: str | None
) -> None:
    user = (
        make_user("admin", role)
        if role
        else User.objects.create_superuser("root", password="pw-for-tests")
    )

    response = login(user).post(
        url("session-create"), {"scenario": oil_spill.pk, "message": NO_POSITION}
    )

    assert response.status_code == 302
    assert Session.objects.get().created_by == user


@pytest.mark.services
@pytest.mark.parametrize("message", ["", "   \n  "])
def test_create_with_an_empty_message_is_refused(
    oil_spill: Scenario, alice: User, message: str
) -> None:
    response = login(alice).post(
        url("session-create"), {"scenario": oil_spill.pk, "message": message}
    )

    assert response.status_code == 400
    assert "Please describe the incident: the message is empty." in response.content.decode()
    assert not Session.objects.exists()


@pytest.mark.services
def test_create_with_an_unknown_scenario_is_refused(oil_spill: Scenario, alice: User) -> None:
    response = login(alice).post(
        url("session-create"), {"scenario": oil_spill.pk + 1000, "message": STAND_FUEL_LEAK}
    )

    assert response.status_code == 400
    assert "Select a valid choice" in response.content.decode()
    assert not Session.objects.exists()


@pytest.mark.services
def test_create_with_a_too_long_message_is_refused(oil_spill: Scenario, alice: User) -> None:
    response = login(alice).post(
        url("session-create"), {"scenario": oil_spill.pk, "message": "漏" * 4001}
    )

    assert response.status_code == 400
    assert "at most 4000 characters" in response.content.decode()
    assert not Session.objects.exists()


# --- detail -------------------------------------------------------------------------


@pytest.mark.services
def test_detail_shows_facts_risk_impact_actions_and_timeline(
    alice: User, waiting: Session, whole_timeline_on_page: None
) -> None:
    response = login(alice).get(url("session-detail", waiting.pk))

    page = response.content.decode()
    assert response.status_code == 200
    assert f"<h1>{waiting.title}</h1>" in page
    assert 'data-testid="session-status">Waiting for people<' in page
    assert 'data-field="flight_no">CA1234<' in page
    assert 'data-field="position">' in page and "105" in page
    # plain words, the codes in tooltips
    assert '<strong title="HIGH">High</strong> · score 95' in page
    assert 'title="rule OS-01"' in page
    assert "<svg" in page and "isolated zone 103 104 105 106" in page
    assert 'data-tool="dispatch_cleanup_crew"' in page
    assert 'data-tool="suspend_stand_operations"' in page
    assert "Proposed:" in page
    assert "Session opened by alice (Apron fluid spill v1)" in page  # the slug in a tooltip
    assert "Waiting for approvals." in page
    assert "Cancel session" in page
    # alice operates: she sees the actions but may not decide them
    assert "Awaiting an approver" in page
    assert 'name="decision"' not in page


@pytest.mark.services
def test_detail_shows_the_open_question_with_an_answer_form(alice: User, asking: Session) -> None:
    page = login(alice).get(url("session-detail", asking.pk)).content.decode()

    assert "The agent asks" in page
    assert "Where is the spill?" in page
    assert 'name="message"' in page
    assert 'data-field="flight_no">CA1234<' in page


@pytest.mark.services
def test_auditor_reads_but_cannot_act(carol: User, asking: Session) -> None:
    response = login(carol).get(url("session-detail", asking.pk))

    page = response.content.decode()
    assert response.status_code == 200
    assert "Where is the spill?" in page
    assert "An operator will answer." in page
    assert 'name="message"' not in page
    assert "Cancel session" not in page


@pytest.mark.services
def test_approver_sees_decision_buttons_but_no_answer_form(bob: User, waiting: Session) -> None:
    page = login(bob).get(url("session-detail", waiting.pk)).content.decode()

    assert "Approve (1 of 2)" in page
    assert 'name="decision"' in page
    assert "Cancel session" not in page


@pytest.mark.parametrize(
    "name",
    [
        "session-detail",
        "session-events",
        "session-report",
        "session-answer",
        "session-cancel",
        "session-retry",
    ],
)
def test_unknown_session_is_404(alice: User, name: str) -> None:
    response = call(login(alice), name, uuid.uuid4(), data={"message": "stand 105"})

    assert response.status_code == 404


@pytest.mark.services
def test_deleted_session_is_404(alice: User, asking: Session) -> None:
    Session.objects.filter(pk=asking.pk).update(deleted_at="2024-01-01T00:00:00Z")

    assert login(alice).get(url("session-detail", asking.pk)).status_code == 404


# --- answer -------------------------------------------------------------------------


@pytest.mark.services
def test_answer_is_recorded_and_the_agent_moves_on(alice: User, asking: Session) -> None:
    response = login(alice).post(url("session-answer", asking.pk), {"message": "stand 105"})

    assert response.status_code == 302
    assert response["Location"] == url("session-detail", asking.pk)
    answer = Event.objects.filter(session=asking, type="user.message").last()
    assert answer is not None
    assert answer.payload["text"] == "stand 105"
    assert answer.payload["answers"] == "q1"
    asking.refresh_from_db()
    assert asking.snapshot["fields"]["position"] == "105"
    assert (asking.snapshot.get("question") or {}).get("field") != "position"


@pytest.mark.services
def test_htmx_answer_returns_the_composer_partial(alice: User, asking: Session) -> None:
    response = login(alice).post(
        url("session-answer", asking.pk), {"message": "stand 105"}, headers={"HX-Request": "true"}
    )

    page = response.content.decode()
    assert response.status_code == 200
    assert page.lstrip().startswith('<section id="session-composer"')
    assert "<html" not in page
    assert "Where is the spill?" not in page
    assert user_messages(asking) == 2


@pytest.mark.services
def test_a_second_answer_before_the_agent_resumes_is_refused(
    alice: User, asking: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No job runs between the two posts: the agent has not picked up the first answer.
    monkeypatch.setattr("diagnosis.actions.enqueue_advance", lambda session_id: None)
    client = login(alice)
    first = client.post(
        url("session-answer", asking.pk), {"message": "stand 105"}, headers={"HX-Request": "true"}
    )
    second = client.post(
        url("session-answer", asking.pk), {"message": "stand 106"}, headers={"HX-Request": "true"}
    )

    assert first.status_code == 200
    assert "The agent is working" in first.content.decode()  # the question is gone at once
    assert second.status_code == 400
    assert "there is nothing to answer" in second.content.decode()
    texts = [e.payload["text"] for e in Event.objects.filter(session=asking, type="user.message")]
    assert texts[1:] == ["stand 105"]


@pytest.mark.services
@pytest.mark.parametrize("htmx", [False, True])
def test_empty_answer_is_refused(alice: User, asking: Session, htmx: bool) -> None:
    headers = {"HX-Request": "true"} if htmx else {}

    response = login(alice).post(
        url("session-answer", asking.pk), {"message": "  "}, headers=headers, follow=not htmx
    )

    page = response.content.decode()
    assert response.status_code == (400 if htmx else 200)
    assert "Please type an answer: the message is empty." in page
    assert user_messages(asking) == 1
    asking.refresh_from_db()
    assert asking.snapshot["question"]["field"] == "position"


@pytest.mark.services
@pytest.mark.parametrize("htmx", [False, True])
def test_answer_when_nothing_was_asked_is_refused(
    alice: User, waiting: Session, htmx: bool
) -> None:
    headers = {"HX-Request": "true"} if htmx else {}

    response = login(alice).post(
        url("session-answer", waiting.pk),
        {"message": "stand 105"},
        headers=headers,
        follow=not htmx,
    )

    page = response.content.decode()
    assert response.status_code == (400 if htmx else 200)
    assert "The agent has not asked anything; there is nothing to answer." in page
    assert user_messages(waiting) == 1


@pytest.mark.services
def test_answer_in_an_ended_session_is_refused(alice: User, asking: Session) -> None:
    set_status(asking.pk, SessionStatus.CANCELED, producer="test")

    response = login(alice).post(
        url("session-answer", asking.pk), {"message": "stand 105"}, headers={"HX-Request": "true"}
    )

    assert response.status_code == 400
    assert "This session is canceled." in response.content.decode()
    assert user_messages(asking) == 1


# --- cancel -------------------------------------------------------------------------


@pytest.mark.services
def test_cancel_ends_the_session(alice: User, waiting: Session) -> None:
    client = login(alice)

    response = client.post(url("session-cancel", waiting.pk), {"reason": "false alarm"})

    assert response.status_code == 302
    assert response["Location"] == url("session-detail", waiting.pk)
    waiting.refresh_from_db()
    assert waiting.status == SessionStatus.CANCELED
    entry = AuditLog.objects.get(action="session.canceled", session_id=waiting.pk)
    closed = list(
        Approval.objects.filter(session=waiting, status="canceled").values_list("pk", flat=True)
    )
    assert closed  # the waiting session had approvals open; they closed with it
    assert entry.actor == alice
    assert entry.detail["reason"] == "false alarm"
    assert sorted(entry.detail["approvals_closed"]) == sorted(closed)
    page = client.get(url("session-detail", waiting.pk)).content.decode()
    assert "This session is canceled." in page
    assert "Cancel session" not in page
    assert 'name="decision"' not in page


@pytest.mark.services
def test_cancel_twice_says_so(alice: User, waiting: Session) -> None:
    client = login(alice)
    client.post(url("session-cancel", waiting.pk))

    response = client.post(url("session-cancel", waiting.pk), follow=True)

    assert "This session is already canceled." in response.content.decode()
    assert AuditLog.objects.filter(action="session.canceled").count() == 1


# --- retry --------------------------------------------------------------------------


@pytest.mark.services
def test_retry_resumes_a_failed_session(alice: User, failed: Session) -> None:
    client = login(alice)
    failed_page = client.get(url("session-detail", failed.pk)).content.decode()
    assert "Failed: ToolFailure: assess_risk failed: risk rules unavailable" in failed_page
    assert ">Retry</button>" in failed_page

    response = client.post(url("session-retry", failed.pk))

    assert response.status_code == 302
    assert response["Location"] == url("session-detail", failed.pk)
    failed.refresh_from_db()
    # the agent resumed from its checkpoint, assessed the risk and proposed the actions
    assert failed.status == SessionStatus.WAITING_USER
    assert failed.snapshot["risk"]["level"] == "HIGH"
    assert failed.approvals.filter(status="pending").exists()
    assert AuditLog.objects.filter(action="session.retried", session_id=failed.pk).count() == 1
    page = client.get(url("session-detail", failed.pk)).content.decode()
    assert ">Retry</button>" not in page


@pytest.mark.services
def test_retry_of_a_session_that_did_not_fail_is_refused(alice: User, waiting: Session) -> None:
    response = login(alice).post(url("session-retry", waiting.pk), follow=True)

    assert "Only a failed session can be retried." in response.content.decode()
    waiting.refresh_from_db()
    assert waiting.status == SessionStatus.WAITING_USER
    assert not AuditLog.objects.filter(action="session.retried").exists()


# --- events -------------------------------------------------------------------------


@pytest.mark.services
def test_events_page_lists_the_whole_timeline(carol: User, asking: Session) -> None:
    response = login(carol).get(url("session-events", asking.pk))

    page = response.content.decode()
    assert response.status_code == 200
    assert f"{asking.last_seq} events · showing those after #0" in page
    assert page.count('<li id="event-') == asking.last_seq
    assert "Session opened by alice" in page
    assert 'rel="next"' not in page


@pytest.mark.services
def test_events_page_paginates_with_after(carol: User, asking: Session) -> None:
    extra = 250
    Event.objects.bulk_create(
        Event(
            session=asking,
            seq=asking.last_seq + i,
            type="agent.node_started",
            payload={"node": f"filler-{i}"},
            producer="test",
        )
        for i in range(1, extra + 1)
    )
    Session.objects.filter(pk=asking.pk).update(last_seq=asking.last_seq + extra)
    total = asking.last_seq + extra
    client = login(carol)

    first = client.get(url("session-events", asking.pk)).content.decode()
    second = client.get(url("session-events", asking.pk), {"after": 200}).content.decode()

    assert first.count('<li id="event-') == 200
    assert 'href="?after=200" rel="next"' in first
    assert second.count('<li id="event-') == total - 200
    assert 'id="event-201"' in second and 'id="event-200"' not in second
    assert 'rel="next"' not in second


@pytest.mark.services
@pytest.mark.parametrize("after", ["abc", "-5", "", "1e3"])
def test_events_page_treats_a_bad_after_as_the_start(
    carol: User, asking: Session, after: str
) -> None:
    response = login(carol).get(url("session-events", asking.pk), {"after": after})

    assert response.status_code == 200
    assert "showing those after #0" in response.content.decode()
    assert 'id="event-1"' in response.content.decode()


@pytest.mark.services
@pytest.mark.parametrize("after", ["10000", "99999999999999999999999"])
def test_events_page_after_the_end_says_nothing_more(
    carol: User, asking: Session, after: str
) -> None:
    response = login(carol).get(url("session-events", asking.pk), {"after": after})

    assert response.status_code == 200
    assert f"No events after #{after}." in response.content.decode()


@pytest.mark.services
def test_htmx_events_returns_only_the_list(carol: User, asking: Session) -> None:
    response = login(carol).get(
        url("session-events", asking.pk), {"after": 3}, headers={"HX-Request": "true"}
    )

    page = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in page
    assert 'id="event-4"' in page and 'id="event-3"' not in page


# --- report -------------------------------------------------------------------------


@pytest.mark.services
def test_report_is_404_until_it_exists(carol: User, waiting: Session) -> None:
    response = login(carol).get(url("session-report", waiting.pk))

    assert response.status_code == 404
    page = response.content.decode()
    # Says why, and leads back to the session: not "nothing at this address".
    assert "This session has no report yet." in page
    assert "once every action has been decided" in page
    assert f'href="{url("session-detail", waiting.pk)}"' in page
    assert "There is nothing at this address" not in page


@pytest.mark.services
def test_report_downloads_as_markdown_once_every_action_is_decided(
    bob: User, carol: User, waiting: Session
) -> None:
    approve_everything(waiting, bob)
    assert waiting.status == SessionStatus.COMPLETED
    client = login(carol)

    response = client.get(url("session-report", waiting.pk))

    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"] == (
        f'attachment; filename="aero-report-{waiting.pk}.md"'
    )
    body = response.content.decode()
    stored = Report.objects.get(session=waiting).markdown
    assert "CA1234" in body
    # An auditor's copy hides what the masking rule hides (the closed taxiways); an
    # approver's is the report as stored.
    assert body != stored and "taxiway=A" not in body and "masked" in body
    # (in the session's language, as stored: the reader may choose it)
    approver = login(bob).get(url("session-report", waiting.pk), {"lang": "zh"})
    assert approver.content.decode() == stored
    page = client.get(url("session-detail", waiting.pk)).content.decode()
    assert "Download report (.md)" in page
    assert 'data-testid="report"' in page


# --- in a browser -------------------------------------------------------------------


@pytest.mark.services
@pytest.mark.browser
def test_a_refused_htmx_answer_shows_its_error_in_the_page(
    asgi_server: str,
    browser: Browser,
    alice: User,
    asking: Session,
) -> None:
    # htmx 2 swaps no 4xx response unless told to (base.html's htmx-config): without it
    # the 400 partial with the error never reaches the page and the click seems to do nothing.
    page = sign_in(browser, asgi_server, alice)
    page.goto(f"{asgi_server}{url('session-detail', asking.pk)}")
    page.fill("#answer-input", "   ")
    page.click("text=Answer")

    expect(page.locator("#session-composer .error")).to_have_text(
        "Please type an answer: the message is empty."
    )
    assert user_messages(asking) == 1


@pytest.mark.services
def test_without_javascript_the_page_reloads_itself_only_while_the_agent_works(
    alice: User, asking: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    refresh = '<noscript><meta http-equiv="refresh" content="3"'
    client = login(alice)
    # A question waits for the operator: nothing to wait for.
    assert refresh not in client.get(url("session-detail", asking.pk)).content.decode()

    # Answered, and no job has picked it up yet: the agent is working.
    monkeypatch.setattr("diagnosis.actions.enqueue_advance", lambda session_id: None)
    client.post(url("session-answer", asking.pk), {"message": "stand 105"})
    page = client.get(url("session-detail", asking.pk)).content.decode()
    assert "The agent is working" in page
    assert refresh in page.split("</head>")[0]

    set_status(asking.pk, SessionStatus.CANCELED, producer="test")
    assert refresh not in client.get(url("session-detail", asking.pk)).content.decode()


@pytest.mark.services
def test_closing_with_open_approvals_asks_once_first(alice: User, asking: Session) -> None:
    client = login(alice)
    # Nothing to approve yet: closing cancels nothing, so it does not ask.
    page = client.get(url("session-detail", asking.pk)).content.decode()
    close_form = page.split('data-testid="close-session"')[1].split(">")[0]
    assert "data-confirm" not in close_form

    waiting = make_session(alice, STAND_FUEL_LEAK)
    open_count = Approval.objects.filter(
        session=waiting, status__in=["pending", "confirming"]
    ).count()
    assert open_count > 1
    page = client.get(url("session-detail", waiting.pk)).content.decode()
    close_form = page.split('data-testid="close-session"')[1].split(">")[0]
    assert f'data-confirm="Closing also cancels {open_count} open approvals.' in close_form
    # The one question, in Chinese too.
    client.cookies[django_settings.LANGUAGE_COOKIE_NAME] = "zh-hans"
    zh = client.get(url("session-detail", waiting.pk)).content.decode()
    assert f"关闭会话也会取消 {open_count} 项未决审批" in zh
