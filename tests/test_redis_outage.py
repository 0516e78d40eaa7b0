"""Redis is not a single point of failure for the web: with Redis unreachable every action
that committed answers as it would with Redis up (the user sees success, never a 500 for
something saved), the failed enqueue is logged, and the reconciler enqueues the session
once Redis is back."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import django_rq
import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from approvals.models import Approval
from diagnosis import jobs
from diagnosis.models import Event, Session
from scenarios_admin.models import Scenario
from tests.api_helpers import call, token_for
from tests.web_helpers import NO_POSITION, approval_for, login, make_session, waiting_session

pytestmark = pytest.mark.services


def closed_port() -> int:
    """A port nothing listens on: connecting to it is refused at once, as with Redis
    stopped."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def redis_down(settings: Any, clean_queue: None) -> Iterator[str]:
    """From here on the job queue and the channel layer point at a closed port, as in
    production with Redis stopped (the rq backend, not the tests' inline one)."""
    down = f"redis://127.0.0.1:{closed_port()}/0"
    live_queue = settings.RQ_QUEUES[settings.AERO_QUEUE]
    settings.AERO_JOB_BACKEND = "rq"
    settings.RQ_QUEUES = {
        name: {**live_queue, "URL": down}
        for name in (settings.AERO_QUEUE, settings.AERO_PRIORITY_QUEUE)
    }
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [{"address": down}], "prefix": settings.AERO_CHANNEL_PREFIX},
        }
    }
    yield down
    settings.RQ_QUEUES = {
        name: live_queue for name in (settings.AERO_QUEUE, settings.AERO_PRIORITY_QUEUE)
    }


def queued(settings: Any) -> list[str]:
    """The jobs waiting, in the order workers take them: the priority queue first."""
    return [
        name
        for queue in (settings.AERO_PRIORITY_QUEUE, settings.AERO_QUEUE)
        for name in django_rq.get_queue(queue).get_job_ids()
    ]


def enqueue_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "enqueue failed" in r.getMessage()]


def test_creating_a_session_with_redis_down_succeeds_and_the_reconciler_queues_it(
    builtin: None,
    alice: User,
    redis_down: str,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    oil_spill = Scenario.objects.get(slug="oil_spill")
    with caplog.at_level(logging.WARNING, logger="diagnosis.jobs"):
        response = login(alice).post(
            reverse("diagnosis:session-create"), {"scenario": oil_spill.pk, "message": NO_POSITION}
        )
    session = Session.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("diagnosis:session-detail", args=[session.pk])
    assert session.status == "queued"
    assert Event.objects.filter(session=session, type="session.created").count() == 1
    assert len(enqueue_warnings(caplog)) == 1
    assert "the reconciler will enqueue it" in enqueue_warnings(caplog)[0]
    page = login(alice).get(response["Location"])
    assert page.status_code == 200

    # Redis is back: the reconciler's next pass enqueues the session, once.
    settings.RQ_QUEUES = {
        name: {**settings.RQ_QUEUES[name], "URL": settings.REDIS_URL}
        for name in (settings.AERO_QUEUE, settings.AERO_PRIORITY_QUEUE)
    }
    Session.objects.filter(pk=session.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    assert jobs.requeue_stalled_sessions() == 1
    assert jobs.requeue_stalled_sessions() == 0
    assert queued(settings) == [jobs.job_id(session.pk)]


def test_the_api_create_with_redis_down_answers_201_and_a_retry_is_no_duplicate(
    builtin: None, alice: User, redis_down: str
) -> None:
    token = token_for(alice)
    body = {"problem_type": "oil_spill", "description": NO_POSITION}
    key = {"Idempotency-Key": "outage-1"}
    first = call("POST", "/api/v1/diagnosis-sessions", token, body, key)
    again = call("POST", "/api/v1/diagnosis-sessions", token, body, key)
    assert first.status_code == 201 and again.status_code == 201
    assert again.json()["session_id"] == first.json()["session_id"]
    assert Session.objects.count() == 1


def test_answering_with_redis_down_is_saved_and_shown(
    builtin: None, alice: User, settings: Any, request: pytest.FixtureRequest
) -> None:
    session = make_session(alice, NO_POSITION)  # asks where the spill is (inline jobs)
    assert session.snapshot["question"]
    request.getfixturevalue("redis_down")
    response = login(alice).post(
        reverse("diagnosis:session-answer", args=[session.pk]), {"message": "105机位"}
    )
    assert response.status_code in (200, 302)
    session.refresh_from_db()
    assert session.status == "queued"
    answer = Event.objects.filter(session=session, type="user.message").last()
    assert answer is not None and answer.payload["text"] == "105机位"


def test_deciding_with_redis_down_is_saved_and_shown(
    builtin: None,
    alice: User,
    bob: User,
    settings: Any,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    session = waiting_session(alice)
    crew = approval_for(session, "dispatch_cleanup_crew")
    request.getfixturevalue("redis_down")
    with caplog.at_level(logging.WARNING):
        response = login(bob).post(
            reverse("approvals:decide", args=[crew.pk]),
            {"decision": "approve", "digest": crew.digest},
            follow=True,
        )
    assert response.status_code == 200
    crew.refresh_from_db()
    assert crew.status == "approved" and crew.approver == bob
    assert Event.objects.filter(session=session, type="approval.approved").count() == 1
    assert enqueue_warnings(caplog)


def test_canceling_with_redis_down_is_saved_and_shown(
    builtin: None, alice: User, request: pytest.FixtureRequest
) -> None:
    session = waiting_session(alice)
    request.getfixturevalue("redis_down")
    response = login(alice).post(
        reverse("diagnosis:session-cancel", args=[session.pk]),
        {"reason": "drill over"},
        follow=True,
    )
    assert response.status_code == 200
    session.refresh_from_db()
    assert session.status == "canceled"
    assert not Approval.objects.filter(session=session).open().exists()


def test_an_enqueue_failure_is_never_raised_to_the_caller(
    builtin: None, make_user: Callable[..., User], redis_down: str
) -> None:
    session = make_session(make_user("olga", "operator"), NO_POSITION)
    assert jobs.dispatch_after_commit(session.pk) is False
    with pytest.raises(Exception):  # noqa: B017  (redis-py's connection error, whatever class)
        jobs.dispatch(session.pk)
