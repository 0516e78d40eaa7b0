"""Real django-rq workers in other processes, on PostgreSQL: job 1 runs until the agent
asks and returns; job 2, in a different process, resumes from the checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import django_rq
import pytest
from django.contrib.auth.models import User
from django.db import connection

from diagnosis.actions import do_answer, do_create_session
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.jobs import prune_waiting_checkpoints, stalled_sessions
from diagnosis.models import AgentRun, Event, LLMCall, Session, ToolCall, WorkerBeat
from scenarios_admin.models import ProviderConfig, Scenario
from tests.llm_helpers import fake_llm, fake_provider  # noqa: F401  (fixture)
from tests.servers import PYTHON, ROOT, run_worker_burst, service_env
from tests.web_helpers import approve_everything

pytestmark = pytest.mark.services


@pytest.mark.parametrize(
    "checkpointer",
    [
        "postgres",
        # The proof that this test needs the checkpoint: a worker that loses it between
        # processes re-runs the completed nodes, and the test fails (strict).
        pytest.param("memory", marks=pytest.mark.xfail(strict=True, raises=AssertionError)),
    ],
)
def test_resume_in_a_different_process(
    builtin: None,
    clean_queue: None,
    db_url: str,
    redis_url: str,
    settings: Any,
    make_user: Callable[..., User],
    checkpointer: str,
) -> None:
    settings.AERO_JOB_BACKEND = "rq"
    operator = make_user("olga", "operator")
    session = do_create_session(
        operator,
        Scenario.objects.get(slug="oil_spill"),
        "MU5678 stand 101 hydraulic leak, engines off",
    )
    queue = django_rq.get_queue(settings.AERO_QUEUE)
    assert queue.count == 1  # enqueued on commit, not run here

    first = run_worker_burst(db_url, redis_url)
    assert first.returncode == 0, first.stderr[-2000:]
    session.refresh_from_db()
    assert session.status == "waiting_user"
    assert session.snapshot["question"]["field"] == "continuous"

    do_answer(session.pk, operator, "no longer leaking, about 2 m2")
    second = run_worker_burst(db_url, redis_url, checkpointer=checkpointer)
    assert second.returncode == 0, second.stderr[-2000:]
    session.refresh_from_db()
    # R1 cleanup crew and R2 taxiway closure now wait for an approver: the job returned.
    assert session.status == "waiting_user"
    assert session.snapshot["risk"]["rule"] == "OS-12"

    pids = [
        run.input_snapshot["pid"]
        for run in AgentRun.objects.filter(session=session, parent__isnull=True).order_by("id")
    ]
    assert len(pids) == 2
    assert pids[0] != pids[1] and os.getpid() not in pids
    # The second job resumed: the input parser read only the answer, not the first message.
    parsed = Event.objects.filter(session=session, type="fields.extracted").order_by("seq")
    assert [e.payload["through_seq"] for e in parsed][-1] > parsed[0].payload["through_seq"]
    # Nothing the first job completed ran again: one model call per message, and the
    # input parser completed once per message.
    extract_calls = LLMCall.objects.filter(session=session, purpose="extract")
    assert extract_calls.count() == 2
    completed = Counter(
        e.payload["node"]
        for e in Event.objects.filter(session=session, type="agent.node_completed")
    )
    assert completed["input_parser"] == 2  # the message, then the answer

    # Waiting, once it has waited a while, the maintenance loop keeps one checkpoint
    # (the one job 3 resumes from).
    Session.objects.filter(pk=session.pk).update(updated_at=session.updated_at.replace(year=2000))
    assert prune_waiting_checkpoints(every=0) == 1
    assert checkpoints(session) == 1

    # Job 3, after the approvals: the enrichment, risk and impact steps of job 2 (a
    # third process) are not repeated; every tool call is one row.
    approve_everything(session, make_user("abel", "approver"))
    third = run_worker_burst(db_url, redis_url, checkpointer=checkpointer)
    assert third.returncode == 0, third.stderr[-2000:]
    session.refresh_from_db()
    assert session.status == "completed"
    types = Counter(Event.objects.filter(session=session).values_list("type", flat=True))
    found = Event.objects.filter(session=session, type="finding.recorded")
    assert Counter(found.values_list("payload__kind", flat=True)) == {"risk": 1, "impact": 1}
    assert types["fields.extracted"] == 2
    calls = ToolCall.objects.filter(session=session)
    assert calls.count() == len(set(calls.values_list("call_id", flat=True)))
    assert all(c.status in ("completed", "failed") for c in calls if c.is_action)
    assert checkpoints(session) == 0  # completed: the event log is the history


def checkpoints(session: Session) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM checkpoints WHERE thread_id = %s", [str(session.pk)])
        return int(cursor.fetchone()[0])


def test_reconciler_requeues_a_session_whose_job_vanished(
    builtin: None,
    clean_queue: None,
    db_url: str,
    redis_url: str,
    settings: Any,
    make_user: Callable[..., User],
) -> None:
    settings.AERO_JOB_BACKEND = "rq"
    operator = make_user("olga", "operator")
    session = do_create_session(
        operator,
        Scenario.objects.get(slug="oil_spill"),
        "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏",
    )
    django_rq.get_queue(settings.AERO_QUEUE).empty()  # Redis lost the job
    Session.objects.filter(pk=session.pk).update(updated_at=session.updated_at.replace(year=2000))
    assert stalled_sessions() == [str(session.pk)]

    result = run_worker_burst(db_url, redis_url)  # its maintenance pass re-enqueues
    assert result.returncode == 0, result.stderr[-2000:]
    run_worker_burst(db_url, redis_url)
    session.refresh_from_db()
    assert session.status == "waiting_user"
    assert stalled_sessions() == []


def test_sigterm_finishes_the_step_and_lets_the_lease_go(
    builtin: None,
    clean_queue: None,
    db_url: str,
    redis_url: str,
    settings: Any,
    make_user: Callable[..., User],
    fake_llm: FakeLLMServer,  # noqa: F811
) -> None:
    """A worker told to stop mid-step (a model call that takes 4 s) finishes that step,
    starts no other, releases the session's lease at once (not after it expires) and
    exits; the next worker carries on from the step's checkpoint, nothing repeated."""
    settings.AERO_JOB_BACKEND = "rq"
    fake_provider(fake_llm, retries=1)
    fake_llm.set_script({"hang_seconds": 4, "rules": [{"fault": "hang"}]})
    session = do_create_session(
        make_user("olga", "operator"),
        Scenario.objects.get(slug="oil_spill"),
        "MU5678 stand 101 hydraulic leak, engines off",
    )
    worker = subprocess.Popen(
        [PYTHON, "manage.py", "aero_worker"],
        cwd=ROOT,
        # A model call inside the step: the blocking design (waits are
        # tests/test_llm_runner.py's), the slow step this test needs.
        env=service_env(db_url, redis_url, AERO_RECONCILE_SECONDS="3600", AERO_LLM_WAITS="0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not fake_llm.requests and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fake_llm.requests, "the worker never called the model"
        assert WorkerBeat.objects.get(pid=worker.pid).session_id == session.pk
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, output[-2000:]
    session.refresh_from_db()
    assert session.lease_token is None  # released, not left to expire
    assert session.status == "running"  # not failed: another worker resumes it
    assert not WorkerBeat.objects.filter(pid=worker.pid).exists()
    nodes = [
        e.payload["node"]
        for e in Event.objects.filter(session=session, type="agent.node_completed")
    ]
    assert nodes == ["input_parser"]  # the step it was in, and no other

    ProviderConfig.objects.update(enabled=False)  # the rest runs on the offline provider
    assert run_worker_burst(db_url, redis_url).returncode == 0  # reconciler + the job
    session.refresh_from_db()
    assert session.status == "waiting_user"
    assert session.snapshot["question"]["field"] == "continuous"
    types = Counter(Event.objects.filter(session=session).values_list("type", flat=True))
    assert types["fields.extracted"] == 1


def test_a_job_killed_before_its_checkpoint_reruns_without_writing_anything_twice(
    builtin: None, make_user: Callable[..., User]
) -> None:
    """Checkpoints are saved when the graph exits: a worker killed mid-run
    leaves only the checkpoint its job started from, and the next job runs the same
    steps again. Their events are keyed by that checkpoint, the step and the node, not by
    LangGraph's task ids (new ones for every unsaved step): nothing is written twice."""
    from diagnosis.jobs import advance_session, agent_graph
    from tests.web_helpers import make_session

    session = make_session(make_user("olga", "operator"))
    assert session.status == "waiting_user"

    def log() -> Counter[str]:
        kinds = Event.objects.filter(session=session).values_list("type", flat=True)
        return Counter(kind for kind in kinds if kind != "session.status_changed")

    before = log()
    calls = ToolCall.objects.filter(session=session).count()
    assert before["agent.node_completed"] >= 5 and before["approval.required"] >= 1
    # The job was killed before its exit checkpoint: the thread has none (its first job).
    agent_graph().checkpointer.delete_thread(str(session.pk))

    assert advance_session(str(session.pk)) == "waiting_user"
    assert log() == before
    assert ToolCall.objects.filter(session=session).count() == calls
    assert LLMCall.objects.filter(session=session).count() == before["llm.call"]
