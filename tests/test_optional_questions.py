"""Issue 32, item 2: an optional (P2) question never holds the response up. It is asked
alongside the approvals; its answer re-assesses (open approvals superseded, with the
reason on the page); left unanswered, the session completes and the page and report say so.

Personas: alice operates, bob approves."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import reverse

from approvals.models import Approval
from diagnosis.actions import ActionError, do_answer, do_create_session
from diagnosis.models import Event, Session
from scenarios_admin.models import Scenario
from tests.web_helpers import approve_everything, login

pytestmark = pytest.mark.services

TAXI_DEBRIS = "3U8888 在滑行道B2滑行时爆胎，地面有碎片"  # fire or smoke (P2) not said


def tire_burst(user: User, message: str = TAXI_DEBRIS) -> Session:
    session = do_create_session(user, Scenario.objects.get(slug="tire_burst"), message)
    session.refresh_from_db()
    return session


def page(user: User, session: Session, language: str = "en") -> str:
    url = reverse("diagnosis:session-detail", args=[session.pk])
    with override_settings(LANGUAGE_CODE=language):
        return login(user).get(url, HTTP_ACCEPT_LANGUAGE=language).content.decode()


def test_the_page_shows_the_question_as_optional_beside_the_approvals(
    builtin: None, alice: User, bob: User
) -> None:
    session = tire_burst(alice)

    assert session.status == "waiting_user"
    assert session.snapshot["risk"]["rule"] == "TB-04"
    assert Approval.objects.filter(session=session).open().exists()
    english = page(bob, session)
    assert 'data-testid="question-optional"' in english
    assert "(optional: the response goes on without it)" in english
    assert "（可选：处置不等待此回答）" in page(bob, session, "zh-hans")


def test_an_answer_supersedes_the_open_approvals_with_the_reason_shown(
    builtin: None, alice: User, bob: User
) -> None:
    session = tire_burst(alice)

    login(alice).post(reverse("diagnosis:session-answer", args=[session.pk]), {"message": "冒烟了"})

    session.refresh_from_db()
    assert session.snapshot["risk"]["rule"] == "TB-01"
    english = page(bob, session)
    assert "Re-assessed after an answer (was" in english
    assert 'data-testid="superseded"' in english
    assert "an answer re-assessed the risk: asked again below for the new facts" in english
    chinese = page(bob, session, "zh-hans")
    assert "根据回答重新评估" in chinese and "因回答而被取代" in chinese


def test_left_unanswered_the_session_completes_and_says_so(
    builtin: None, alice: User, bob: User
) -> None:
    session = tire_burst(alice)
    question = session.snapshot["question"]

    approve_everything(session, bob)

    assert session.status == "completed"
    assert session.snapshot["question"] is None
    closed = Event.objects.get(session=session, type="agent.question_closed")
    assert (closed.payload["question"], closed.payload["field"], closed.payload["answered"]) == (
        question["key"],
        "fire_or_smoke",
        False,
    )
    assert "可选问题未获回答" in session.report.markdown
    english = page(bob, session)
    assert 'data-testid="question-unanswered"' in english
    # Closed: it can no longer be answered.
    with pytest.raises(ActionError):
        do_answer(session.pk, alice, "有烟")
