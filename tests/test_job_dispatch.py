"""A session's job: one fixed id, never enqueued while one waits or runs; the reconciler
re-enqueues only sessions with no job in the queue and no live lease; the compiled graph
is built once per process."""

from __future__ import annotations

import socket
import subprocess
import threading
import uuid
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
from diagnosis.jobs import checkpoints, lease, reconciler
from diagnosis.jobs.graph_executor import InlineExecutor
from diagnosis.models import AgentRun, Session
from scenarios_admin.models import Scenario

pytestmark = pytest.mark.services


def queued(settings: Any) -> list[str]:
    """The jobs waiting, in the order workers take them: the priority queue first."""
    return [
        name
        for queue in (settings.AERO_PRIORITY_QUEUE, settings.AERO_QUEUE)
        for name in django_rq.get_queue(queue).get_job_ids()
    ]


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
    token = lease.acquire_lease(rq_session.pk)
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
    checkpoints._runtime.conn.close()  # type: ignore[union-attr]  # the connection died
    assert jobs.agent_graph() is not first  # rebuilt, not used broken


def test_a_job_runs_its_graph_and_saves_its_checkpoint_on_its_own_thread(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangGraph's loop opened a thread pool per invoke for its checkpoint writes: two
    new threads per job, which the job waited for anyway. A job now starts none, and
    its checkpoint is saved all the same (the session resumes from it)."""
    started: list[str] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏"
    )
    session.refresh_from_db()
    assert session.status == "waiting_user"  # it asks what it lacks: a graph run ended
    assert [name for name in started if name.startswith("ThreadPoolExecutor")] == []
    assert (
        jobs.agent_graph().get_state({"configurable": {"thread_id": str(session.pk)}}).interrupts
    )  # the wait's checkpoint was saved


def test_a_failed_write_on_the_jobs_thread_still_fails_the_run() -> None:
    """What the loop's pool did with a call's exception: its future holds it, for the
    loop to raise when it collects it."""

    def refused() -> None:
        raise RuntimeError("checkpoint write refused")

    future = InlineExecutor().submit(refused)
    assert future.done()
    with pytest.raises(RuntimeError, match="refused"):
        future.result()
    assert InlineExecutor().submit(lambda a, b=0: a + b, 2, b=3).result() == 5


def test_a_session_whose_job_vanished_is_requeued_at_once(
    rq_session: Session, settings: Any
) -> None:
    """No grace period after its last change (it used to be 60 s): no job in the queue
    and no live lease is enough, and the next reconciler pass enqueues it, once."""
    assert jobs.requeue_stalled_sessions() == 0  # just created: its job waits
    django_rq.get_queue(settings.AERO_QUEUE).empty()
    assert [jobs.requeue_stalled_sessions() for _ in range(3)] == [1, 0, 0]
    assert queued(settings) == [jobs.job_id(rq_session.pk)]


def held_by(session: Session, pid: int, token: Any) -> None:
    """The lease `token`, as acquire_lease records its holder (host and pid), and the
    session's running job as _advance_locked records it."""
    Session.objects.filter(pk=session.pk, lease_token=token).update(
        lease_holder=f"{socket.gethostname()}:{pid}"
    )
    AgentRun.objects.create(
        session=session,
        agent_name="incident_agent",
        input_snapshot={"pid": pid, "host": socket.gethostname(), "lease": str(token)},
    )


def gone_pid() -> int:
    """The pid of a process that ran on this host and is gone (exited and reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_lease_whose_worker_is_gone_is_released_and_the_session_requeued_first(
    rq_session: Session, settings: Any, make_user: Callable[..., User]
) -> None:
    """A worker killed with -9 holds its lease until it runs out (the lease length);
    the reconciler sees the process is gone from this host, expires exactly that lease
    and re-enqueues the session at the front of the queue (it had waited its turn)."""
    queue = django_rq.get_queue(settings.AERO_QUEUE)
    queue.empty()
    other = do_create_session(
        make_user("otto", "operator"), Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏"
    )
    assert queued(settings) == [jobs.job_id(other.pk)]  # another session waits already
    token = lease.acquire_lease(rq_session.pk)
    held_by(rq_session, gone_pid(), token)

    assert jobs.requeue_stalled_sessions() == 1
    assert queued(settings) == [jobs.job_id(rq_session.pk), jobs.job_id(other.pk)]
    assert not jobs.lease_is_live(rq_session.pk)
    assert Session.objects.get(pk=rq_session.pk).lease_token == token  # expired, not taken


def test_a_live_or_newer_holder_keeps_its_lease(rq_session: Session, settings: Any) -> None:
    django_rq.get_queue(settings.AERO_QUEUE).empty()
    alive = subprocess.Popen(["sleep", "30"])
    try:
        token = lease.acquire_lease(rq_session.pk)
        held_by(rq_session, alive.pid, token)
        # A run of a dead worker whose lease another job took since: not that lease.
        held_by(rq_session, gone_pid(), uuid.uuid4())
        assert reconciler.release_dead_holders() == 0
        assert jobs.requeue_stalled_sessions() == 0
        assert jobs.lease_is_live(rq_session.pk)
        assert queued(settings) == []
    finally:
        alive.kill()
        alive.wait()


def test_a_lease_taken_by_a_process_that_died_at_once_is_released_at_the_next_pass(
    rq_session: Session, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed right after it took the lease, before it wrote anything else (no run row:
    a fresh worker was still building its graph). The lease names its holder from the
    UPDATE that took it, so the next reconciler pass sees the holder gone and
    re-enqueues the session at once instead of after the whole lease."""
    queue = django_rq.get_queue(settings.AERO_QUEUE)
    queue.empty()
    dead = gone_pid()
    monkeypatch.setattr(lease.os, "getpid", lambda: dead)  # the lease taken in process `dead`
    token = lease.acquire_lease(rq_session.pk)
    monkeypatch.undo()
    assert token is not None
    assert not AgentRun.objects.filter(session=rq_session).exists()
    assert jobs.lease_is_live(rq_session.pk)

    assert jobs.requeue_stalled_sessions() == 1
    assert queued(settings) == [jobs.job_id(rq_session.pk)]
    assert jobs.requeue_stalled_sessions() == 0  # once


def test_a_lease_taken_by_this_live_process_is_kept(rq_session: Session, settings: Any) -> None:
    django_rq.get_queue(settings.AERO_QUEUE).empty()
    token = lease.acquire_lease(rq_session.pk)
    assert Session.objects.get(pk=rq_session.pk).lease_holder == lease.lease_holder()
    assert jobs.requeue_stalled_sessions() == 0
    assert jobs.lease_is_live(rq_session.pk)
    lease.release_lease(rq_session.pk, token)  # type: ignore[arg-type]
    assert Session.objects.get(pk=rq_session.pk).lease_holder == ""


def test_a_job_started_by_a_worker_that_died_before_the_lease_is_enqueued_again(
    rq_session: Session, settings: Any
) -> None:
    """A worker killed after it dequeued the job and before it took the lease: the job
    stays "started" in rq with no lease. Its worker is gone from this host, so the next
    pass replaces the job instead of taking it for one just starting."""
    queue = django_rq.get_queue(settings.AERO_QUEUE)
    job = queue.fetch_job(jobs.job_id(rq_session.pk))
    assert job is not None
    queue.remove(job.id)
    job.worker_name = f"aero-{socket.gethostname()}-{gone_pid()}-abcdef"
    job.save()
    job.set_status(JobStatus.STARTED)

    assert jobs.requeue_stalled_sessions() == 1
    assert queued(settings) == [jobs.job_id(rq_session.pk)]


def test_a_job_started_by_a_live_worker_is_left_to_it(rq_session: Session, settings: Any) -> None:
    queue = django_rq.get_queue(settings.AERO_QUEUE)
    job = queue.fetch_job(jobs.job_id(rq_session.pk))
    assert job is not None
    queue.remove(job.id)
    alive = subprocess.Popen(["sleep", "30"])
    try:
        job.worker_name = f"aero-{socket.gethostname()}-{alive.pid}-abcdef"
        job.save()
        job.set_status(JobStatus.STARTED)
        assert jobs.requeue_stalled_sessions() == 0
        assert queued(settings) == []
    finally:
        alive.kill()
        alive.wait()


def test_sessions_whose_job_was_lost_run_in_the_order_they_were_lost(
    rq_session: Session, settings: Any, make_user: Callable[..., User]
) -> None:
    """Re-enqueued sessions go ahead of the queue, first lost first run: one whose job
    is lost again and again does not keep jumping ahead of one lost before it (pushed
    at the front of one queue, the last re-enqueued ran first)."""
    user = make_user("otto", "operator")
    scenario = Scenario.objects.get(slug="oil_spill")
    first, again = (do_create_session(user, scenario, "105机位燃油泄漏") for _ in range(2))
    for queue in (settings.AERO_QUEUE, settings.AERO_PRIORITY_QUEUE):
        django_rq.get_queue(queue).empty()
    fresh = do_create_session(user, scenario, "105机位燃油泄漏")  # waits its turn
    assert jobs.dispatch(rq_session.pk, at_front=True) is True  # lost first
    assert jobs.dispatch(first.pk, at_front=True) is True
    assert jobs.dispatch(again.pk, at_front=True) is True  # lost last
    assert queued(settings) == [jobs.job_id(s.pk) for s in (rq_session, first, again, fresh)]


def test_a_queued_job_taken_by_a_worker_that_died_is_enqueued_again(
    rq_session: Session, settings: Any
) -> None:
    """A worker popped the job and was killed before starting it: the job says
    "queued" and is in no queue. It is lost, not waiting: the next pass enqueues it."""
    queue = django_rq.get_queue(settings.AERO_QUEUE)
    assert queue.connection.lpop(queue.key) == jobs.job_id(rq_session.pk).encode()
    job = queue.fetch_job(jobs.job_id(rq_session.pk))
    assert job is not None and job.get_status() == JobStatus.QUEUED

    assert jobs.requeue_stalled_sessions() == 1
    assert queued(settings) == [jobs.job_id(rq_session.pk)]


def test_a_dead_job_whose_execution_record_expired_is_replaced(
    rq_session: Session, settings: Any
) -> None:
    """A worker killed mid-job leaves an execution whose record expires (90 s) a minute
    before its entry in the job's registry: rq's own delete raised on such a job, and
    the session stayed "running" with nothing to run it. The next pass replaces it."""
    from rq.executions import Execution

    queue = django_rq.get_queue(settings.AERO_QUEUE)
    job = queue.fetch_job(jobs.job_id(rq_session.pk))
    assert job is not None
    queue.remove(job.id)
    dead = f"aero-{socket.gethostname()}-{gone_pid()}-abcdef"
    with queue.connection.pipeline() as pipeline:
        execution = Execution.create(job, 90, pipeline=pipeline, worker_name=dead)
        pipeline.execute()
    job.worker_name = dead
    job.save()
    job.set_status(JobStatus.STARTED)
    queue.connection.delete(execution.key)  # expired: the registry still lists it

    assert jobs.requeue_stalled_sessions() == 1
    assert queued(settings) == [jobs.job_id(rq_session.pk)]
    started = job.started_job_registry
    assert execution.composite_key.encode() not in queue.connection.zrange(started.key, 0, -1)


def test_a_session_that_cannot_be_enqueued_does_not_hold_up_the_others(
    rq_session: Session, settings: Any, make_user: Callable[..., User], monkeypatch: Any
) -> None:
    """One session's job that cannot be handled this pass (an error) is retried at the
    next pass; the other stalled sessions are enqueued in this one."""
    other = do_create_session(
        make_user("otto", "operator"), Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏"
    )
    for queue in (settings.AERO_QUEUE, settings.AERO_PRIORITY_QUEUE):
        django_rq.get_queue(queue).empty()
    dispatch = jobs.dispatch

    def broken_for_one(session_id: Any, **kwargs: Any) -> bool:
        if str(session_id) == str(rq_session.pk):
            raise ValueError("Execution 0 not found in Redis")
        return dispatch(session_id, **kwargs)

    monkeypatch.setattr(reconciler, "dispatch", broken_for_one)
    assert jobs.requeue_stalled_sessions() == 1
    assert queued(settings) == [jobs.job_id(other.pk)]

    monkeypatch.setattr(reconciler, "dispatch", dispatch)
    assert jobs.requeue_stalled_sessions() == 1  # the next pass
    assert sorted(queued(settings)) == sorted(jobs.job_id(s.pk) for s in (rq_session, other))
