"""A waiting session's older checkpoints are pruned by the maintenance loop, not by the
job that stopped at the wait: the prune's ~16 statements were on the path of
every session queued behind that job. The session is the bench's (the worked example, a
scripted model answering its 3 calls at once), which leaves one checkpoint per model
wait."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from diagnosis import jobs
from diagnosis.actions import do_create_session
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.jobs import checkpoints as job_checkpoints
from diagnosis.maintenance import run_periodic_tasks
from diagnosis.models import Event, LLMCall, Session, SessionStatus, ToolCall
from scenarios_admin.models import Scenario
from tests.llm_helpers import fake_llm, fake_provider
from tests.test_llm_resume_cost import MESSAGE, THREE_CALLS, react_with_waits, run_the_runner
from tests.web_helpers import approve_everything

__all__ = ["fake_llm", "react_with_waits"]  # the fixtures

pytestmark = pytest.mark.services


def checkpoints(session: Session) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM checkpoints WHERE thread_id = %s", [str(session.pk)])
        return int(cursor.fetchone()[0])


def waited(session: Session, seconds: float) -> None:
    """As if the session's last step had been written `seconds` ago."""
    Session.objects.filter(pk=session.pk).update(
        updated_at=timezone.now() - timedelta(seconds=seconds)
    )


def drive(session: Session) -> None:
    """The session's jobs and its model calls, as the workers and the runner make them,
    until it waits for a person (or ends)."""
    for _ in range(12):
        status = jobs.advance_session(str(session.pk))
        if status != jobs.WAITING_MODEL or not run_the_runner():
            return
    raise AssertionError("the session never stopped")


@pytest.fixture
def waiting_session(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> Iterator[Session]:
    """At its first approvals, after 3 model waits: a checkpoint from each of its 3 jobs
    and the first one's input."""
    fake_llm.set_script(THREE_CALLS)
    fake_provider(fake_llm)
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )
    assert run_the_runner() == 1
    drive(session)
    session.refresh_from_db()
    assert session.status == SessionStatus.WAITING_USER
    yield session


@pytest.fixture(autouse=True)
def every_pass_due(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with the once-a-minute pass due."""
    monkeypatch.setattr(job_checkpoints, "_last_sweeps", {})


def test_the_job_that_stops_at_a_wait_leaves_the_prune_to_the_maintenance_loop(
    waiting_session: Session, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    session = waiting_session
    # The job did not prune: each job's checkpoint is there.
    assert checkpoints(session) == 4
    # Just stopped: the loop leaves it (an approver may answer in a moment).
    run_periodic_tasks()
    assert checkpoints(session) == 4

    waited(session, job_checkpoints.PRUNE_AFTER_SECONDS + 1)
    job_checkpoints._last_sweeps.clear()
    run_periodic_tasks()
    assert checkpoints(session) == 1  # the one the next job resumes from

    # The next job resumes from it: nothing done before runs again.
    approve_everything(session, make_user("abel", "approver"))
    drive(session)
    session.refresh_from_db()
    assert session.status in (SessionStatus.WAITING_USER, SessionStatus.COMPLETED)
    types = Counter(Event.objects.filter(session=session).values_list("type", flat=True))
    found = Event.objects.filter(session=session, type="finding.recorded")
    assert Counter(found.values_list("payload__kind", flat=True)) == {"risk": 1, "impact": 1}
    assert types["fields.extracted"] == 1
    # Every model call was made once: none repeated after the prune (a repeated call
    # would send the same conversation again).
    assert LLMCall.objects.filter(session=session, purpose="extract").count() == 1
    sent = [json.dumps(r["body"]["messages"], sort_keys=True) for r in fake_llm.requests]
    assert len(sent) >= 3 and len(sent) == len(set(sent))
    assert ToolCall.objects.filter(session=session, tool_name="assess_risk").count() == 1
    calls = ToolCall.objects.filter(session=session)
    assert calls.count() == len(set(calls.values_list("call_id", flat=True)))


def test_a_session_that_is_running_or_leased_is_not_pruned(waiting_session: Session) -> None:
    session = waiting_session
    waited(session, 3600)
    Session.objects.filter(pk=session.pk).update(
        lease_token="00000000-0000-0000-0000-000000000001",
        lease_expires_at=timezone.now() + timedelta(seconds=60),
    )
    assert jobs.prune_waiting_checkpoints(every=0) == 0
    assert checkpoints(session) == 4
    # A job holds it again (running): the job's own checkpoint write may be under way.
    Session.objects.filter(pk=session.pk).update(
        lease_token=None, lease_expires_at=None, status=SessionStatus.RUNNING
    )
    assert jobs.prune_waiting_checkpoints(every=0) == 0
    assert checkpoints(session) == 4
    # Its lease expired (its worker died) and it waits: pruned.
    Session.objects.filter(pk=session.pk).update(
        lease_token="00000000-0000-0000-0000-000000000001",
        lease_expires_at=timezone.now() - timedelta(seconds=1),
        status=SessionStatus.WAITING_USER,
    )
    assert jobs.prune_waiting_checkpoints(every=0) == 1
    assert checkpoints(session) == 1


def test_one_pass_at_a_time_across_processes_and_once_a_minute_per_process(
    waiting_session: Session,
) -> None:
    session = waiting_session
    waited(session, 3600)
    # Another process's pass holds the lock: this one leaves the threads to it.
    other = connection.copy()
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [job_checkpoints._PRUNE_LOCK])
        assert jobs.prune_waiting_checkpoints(every=0) == 0
        assert checkpoints(session) == 4
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [job_checkpoints._PRUNE_LOCK])
    finally:
        other.close()
    assert jobs.prune_waiting_checkpoints(every=0) == 1
    assert checkpoints(session) == 1
    # The lock was let go after the pass: the other process takes it.
    other = connection.copy()
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [job_checkpoints._PRUNE_LOCK])
            assert cursor.fetchone()[0] is True
    finally:
        other.close()
    # Within the minute, a pass does not even look.
    with CaptureQueriesContext(connection) as queries:
        assert jobs.prune_waiting_checkpoints() == 0
    assert len(queries) == 0


def test_a_pass_takes_the_longest_waiting_sessions_first_up_to_its_batch(
    waiting_session: Session, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    first = waiting_session
    second = do_create_session(
        make_user("oleg", "operator"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )
    assert run_the_runner() == 1
    drive(second)
    waited(first, 600)
    waited(second, 3600)
    assert jobs.prune_waiting_checkpoints(every=0, batch=1) == 1
    assert (checkpoints(first), checkpoints(second)) == (4, 1)
    assert jobs.prune_waiting_checkpoints(every=0, batch=1) == 1
    assert (checkpoints(first), checkpoints(second)) == (1, 1)


def test_the_loop_deletes_the_checkpoints_of_canceled_sessions_and_keeps_failed_ones(
    waiting_session: Session,
) -> None:
    """The other checkpoint sweep, which shares the once-a-minute gate: a
    canceled session's job may never run again to delete its own; a failed session keeps
    its checkpoints for a retry."""
    session = waiting_session
    Session.objects.filter(pk=session.pk).update(status=SessionStatus.FAILED)
    assert jobs.delete_ended_checkpoints() == 0
    assert checkpoints(session) == 4
    Session.objects.filter(pk=session.pk).update(status=SessionStatus.CANCELED)
    assert jobs.delete_ended_checkpoints() == 0  # within the minute: not even a look
    assert checkpoints(session) == 4
    job_checkpoints._last_sweeps.clear()
    assert jobs.delete_ended_checkpoints() == 1
    assert checkpoints(session) == 0
