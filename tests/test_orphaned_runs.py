"""Runs left `running` by a dead job (its worker killed, PostgreSQL restarted under it)
are closed by the reconciler, each with its `agent.run_ended` event (on the timeline,
in the fold, once however many passes run); the run of a job that holds its lease is
left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Callable

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse

from diagnosis.chain import verify_chain
from diagnosis.fold import fold_events
from diagnosis.jobs import close_orphaned_runs, lease
from diagnosis.jobs.reconciler import release_dead_holders
from diagnosis.models import AgentRun, Event, Session
from tests.servers import PYTHON, ROOT, service_env
from tests.web_helpers import login, waiting_session

pytestmark = pytest.mark.services


def test_a_root_run_its_dead_job_left_running_is_closed(
    builtin: None, make_user: Callable[..., User]
) -> None:
    assert connection.vendor == "postgresql"
    session = waiting_session(make_user("olga", "operator"))
    dead = AgentRun.objects.create(
        session=session, agent_name=lease.ROOT_AGENT, input_snapshot={"lease": str(uuid.uuid4())}
    )
    taken = lease.take_lease(session.pk, root=lease.root_snapshot())
    assert taken is not None
    live_root = taken[1].root_id  # type: ignore[attr-defined]

    assert close_orphaned_runs() == 1
    dead.refresh_from_db()
    assert dead.status == "failed" and dead.ended_at is not None
    assert dead.output_summary["status"] == "interrupted"
    (ended,) = run_ended(session, dead.pk)
    assert ended.producer == "reconciler"
    assert ended.payload["status"] == "failed" and ended.payload["reason"] == "job_gone"
    assert AgentRun.objects.get(pk=live_root).status == "running"  # its job holds the lease

    lease.release_lease(session.pk, taken[0])  # the job ended without closing its run
    assert close_orphaned_runs() == 1
    assert AgentRun.objects.get(pk=live_root).status == "failed"
    assert close_orphaned_runs() == 0
    assert len(run_ended(session, live_root)) == 1  # a second pass writes nothing again


def run_ended(session: Session, run: int) -> list[Event]:
    return list(Event.objects.filter(session=session, type="agent.run_ended", payload__run=run))


# A job's start as a worker makes it (the lease and its root run in one statement), then
# the process hangs until it is killed.
HOLD = (
    "import django, sys, time; django.setup(); "
    "from diagnosis.jobs import lease; "
    "taken = lease.take_lease(sys.argv[1], root=lease.root_snapshot()); "
    "print(taken[1].root_id, flush=True); time.sleep(600)"
)


def test_a_job_killed_with_sigkill_has_its_run_closed_by_the_reconcile_pass_with_an_event(
    builtin: None, make_user: Callable[..., User], db_url: str, redis_url: str
) -> None:
    olga = make_user("olga", "operator")
    session = waiting_session(olga)
    process = subprocess.Popen(
        [PYTHON, "-c", HOLD, str(session.pk)],
        cwd=ROOT,
        env=service_env(db_url, redis_url),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        root = int(process.stdout.readline())
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    assert AgentRun.objects.get(pk=root).status == "running"

    # The reconcile pass: the dead holder's lease goes at once, then its run is closed.
    assert release_dead_holders() == 1
    assert close_orphaned_runs() == 1
    (ended,) = run_ended(session, root)
    assert ended.payload["agent"] == lease.ROOT_AGENT
    run = AgentRun.objects.get(pk=root)
    assert run.status == "failed" and run.ended_at is not None
    assert close_orphaned_runs() == 0 and len(run_ended(session, root)) == 1
    # The log says it: the fold, the chain, and the session's timeline in words.
    folded = fold_events(Event.objects.filter(session=session).order_by("seq"))
    assert folded.agent_runs[root].status == "failed"
    assert verify_chain(session.pk).ok
    reader = login(olga)
    reader.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    page = reader.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert "incident agent failed after" in page
    assert "(tokens in/out 0/0): its job ended without closing it" in page
