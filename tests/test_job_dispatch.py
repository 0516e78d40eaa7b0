"""A session's job: one fixed id, never enqueued while one waits or runs; the reconciler
re-enqueues only sessions with no job in the queue and no live lease; the compiled graph
is built once per process."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import django_rq
import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rq.job import JobStatus

from diagnosis import jobs
from diagnosis.actions import do_create_session
from diagnosis.models import Session
from scenarios_admin.models import Scenario

pytestmark = pytest.mark.services


def queued(settings: Any) -> list[str]:
    return list(django_rq.get_queue(settings.AERO_QUEUE).get_job_ids())


def stale(session: Session) -> None:
    Session.objects.filter(pk=session.pk).update(updated_at=timezone.now() - timedelta(hours=1))


@pytest.fixture
def rq_session(
    builtin: None, clean_queue: None, settings: Any, make_user: Callable[..., User]
) -> Session:
    settings.AERO_JOB_BACKEND = "rq"
    return do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏"
    )


def test_a_session_has_one_job_whatever_asks_for_it(rq_session: Session, settings: Any) -> None:
    assert queued(settings) == [jobs.job_id(rq_session.pk)]
    assert jobs.dispatch(rq_session.pk) is False  # an answer, a decision, a retry...
    assert jobs.dispatch(str(rq_session.pk)) is False
    assert queued(settings) == [jobs.job_id(rq_session.pk)]


def test_the_reconciler_leaves_queued_and_leased_sessions_alone(
    rq_session: Session, settings: Any
) -> None:
    stale(rq_session)
    assert jobs.stalled_sessions() == [str(rq_session.pk)]
    # Its job waits behind others: late, not lost. Every worker's pass agrees.
    assert [jobs.requeue_stalled_sessions() for _ in range(3)] == [0, 0, 0]
    assert queued(settings) == [jobs.job_id(rq_session.pk)]

    # Redis lost the job: exactly one pass re-enqueues it, once.
    django_rq.get_queue(settings.AERO_QUEUE).empty()
    assert [jobs.requeue_stalled_sessions() for _ in range(3)] == [1, 0, 0]
    assert queued(settings) == [jobs.job_id(rq_session.pk)]


def test_a_live_lease_means_a_running_job_takes_the_input(
    rq_session: Session, settings: Any
) -> None:
    django_rq.get_queue(settings.AERO_QUEUE).empty()
    token = jobs.acquire_lease(rq_session.pk)
    assert token is not None
    stale(rq_session)
    assert jobs.dispatch(rq_session.pk) is False
    assert jobs.requeue_stalled_sessions() == 0
    assert queued(settings) == []
    # The lease lapses (the worker died): now it is stalled and comes back once.
    Session.objects.filter(pk=rq_session.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert jobs.requeue_stalled_sessions() == 1
    assert queued(settings) == [jobs.job_id(rq_session.pk)]


def test_a_finished_job_frees_the_id_for_the_next_one(rq_session: Session, settings: Any) -> None:
    queue = django_rq.get_queue(settings.AERO_QUEUE)
    job = queue.fetch_job(jobs.job_id(rq_session.pk))
    assert job is not None
    queue.remove(job.id)
    job.set_status(JobStatus.FINISHED)
    assert jobs.dispatch(rq_session.pk) is True
    assert queued(settings) == [jobs.job_id(rq_session.pk)]


def test_the_graph_is_compiled_once_per_process(builtin: None) -> None:
    first = jobs.agent_graph()
    assert jobs.agent_graph() is first
    jobs._runtime.conn.close()  # type: ignore[union-attr]  # the connection died
    assert jobs.agent_graph() is not first  # rebuilt, not used broken


def test_a_session_whose_job_vanished_is_requeued_at_once(
    rq_session: Session, settings: Any
) -> None:
    """No grace period after its last change (it used to be 60 s): no job in the queue
    and no live lease is enough, and the next reconciler pass enqueues it, once."""
    assert jobs.requeue_stalled_sessions() == 0  # just created: its job waits
    django_rq.get_queue(settings.AERO_QUEUE).empty()
    assert [jobs.requeue_stalled_sessions() for _ in range(3)] == [1, 0, 0]
    assert queued(settings) == [jobs.job_id(rq_session.pk)]
