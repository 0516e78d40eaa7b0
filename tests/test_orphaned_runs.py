"""Runs left `running` by a dead job (its worker killed, PostgreSQL restarted under it)
are closed by the reconciler; the run of a job that holds its lease is left alone."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import connection

from diagnosis.jobs import close_orphaned_runs, lease
from diagnosis.models import AgentRun
from tests.web_helpers import waiting_session

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
    assert AgentRun.objects.get(pk=live_root).status == "running"  # its job holds the lease

    lease.release_lease(session.pk, taken[0])  # the job ended without closing its run
    assert close_orphaned_runs() == 1
    assert AgentRun.objects.get(pk=live_root).status == "failed"
    assert close_orphaned_runs() == 0
