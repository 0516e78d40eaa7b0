"""Real django-rq workers in other processes, on PostgreSQL: job 1 runs until the agent
asks and returns; job 2, in a different process, resumes from the checkpoint."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import django_rq
import pytest
from django.contrib.auth.models import User

from diagnosis.actions import do_answer, do_create_session
from diagnosis.jobs import stalled_sessions
from diagnosis.models import AgentRun, Event, LLMCall, Session, ToolCall
from scenarios_admin.models import Scenario
from tests.servers import run_worker_burst
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

    # Job 3, after the approvals: the enrichment, risk and impact steps of job 2 (a
    # third process) are not repeated; every tool call is one row.
    approve_everything(session, make_user("abel", "approver"))
    third = run_worker_burst(db_url, redis_url, checkpointer=checkpointer)
    assert third.returncode == 0, third.stderr[-2000:]
    session.refresh_from_db()
    assert session.status == "completed"
    types = Counter(Event.objects.filter(session=session).values_list("type", flat=True))
    assert types["risk.assessed"] == 1 and types["impact.analyzed"] == 1
    assert types["fields.extracted"] == 2
    calls = ToolCall.objects.filter(session=session)
    assert calls.count() == len(set(calls.values_list("call_id", flat=True)))
    assert all(c.status in ("completed", "failed") for c in calls if c.is_action)


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
