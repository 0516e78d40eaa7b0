"""A specialist's run as events (issue 35): its start and its end (status, times, tokens)
are `agent.run_started` / `agent.run_ended`, shown on the session page's timeline, in
replay and in the export, folded with the session, written once however often the
branch runs; and a job's root run reads as ended the moment the job is over (its row's
end is written with the lease's release, after the session's move the page is pushed)."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import reverse

from diagnosis.fold import fold_events
from diagnosis.models import AgentRun, Event, Session
from packs.diagnosis.sessions import start_from_bundle
from replay.export import render_export
from tests.api_helpers import call, token_for
from tests.test_agent_tree import find, tree_url
from tests.test_diagnosis_sessions import SPEC, run_bundle
from tests.web_helpers import login

pytestmark = pytest.mark.services

SPECIALISTS = ("logs", "metrics", "changes_code", "knowledge")


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


def without_metrics(tmp_path: Path) -> Path:
    """The payments example without its metrics.csv: the metrics specialist fails."""
    with tarfile.open(SPEC / "ex-deploy-payments.tar.gz") as archive:
        archive.extractall(tmp_path / "x", filter="data")
    folder = tmp_path / "x" / "ex-deploy-payments"
    (folder / "metrics.csv").unlink()
    return folder


def test_each_specialists_start_and_end_are_events_the_page_replay_and_export_show(
    builtin: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = run_bundle(capsys, without_metrics(tmp_path), "--mode", "hierarchical")
    session = Session.objects.get(pk=result["session"])
    runs = {
        r.agent_name: r
        for r in AgentRun.objects.filter(session=session, agent_name__startswith="specialist_")
    }
    started = list(Event.objects.filter(session=session, type="agent.run_started"))
    ended = list(Event.objects.filter(session=session, type="agent.run_ended"))
    assert sorted(e.payload["agent"] for e in started) == sorted(runs)
    assert sorted(e.payload["agent"] for e in ended) == sorted(runs)
    for event in ended:
        run = runs[event.payload["agent"]]
        # the event says what the row says: status, times, tokens; under its own run
        assert event.run_id == run.pk and event.payload["run"] == run.pk
        assert event.payload["status"] == run.status
        assert event.payload["started_at"] == run.started_at.isoformat()
        assert event.payload["ended_at"] == run.ended_at.isoformat()  # type: ignore[union-attr]
        assert (event.payload["tokens_in"], event.payload["tokens_out"]) == (0, 0)
    for event in started:
        run = runs[event.payload["agent"]]
        assert event.payload["parent"] == run.parent_id
        assert event.payload["mode"] == "react"
        assert event.seq < next(e.seq for e in ended if e.payload["run"] == run.pk)
    assert runs["specialist_metrics"].status == "failed"
    assert {r.status for n, r in runs.items() if n != "specialist_metrics"} == {"completed"}

    # the fold keeps each one as its events tell it
    state = fold_events(Event.objects.filter(session=session).order_by("seq"))
    assert {r.agent: r.status for r in state.agent_runs.values()} == {
        n: r.status for n, r in runs.items()
    }

    # the page's timeline says how each ended, in words; the API's tree agrees
    owner = session.created_by
    page = login(owner).get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert page.count('data-testid="agent-run-ended"') == 4
    assert "metrics specialist failed after" in page
    assert "logs specialist completed after" in page
    body = call("GET", tree_url(session), token_for(owner)).json()
    for name, run in runs.items():
        node = find(body["runs"], run.pk)
        assert node is not None and node["status"] == run.status, name

    # replay at the metrics specialist's end shows it; the export tells each one
    seq = next(e.seq for e in ended if e.payload["agent"] == "specialist_metrics")
    replay = (
        login(owner)
        .get(reverse("replay:replay-step", args=[session.pk]), {"seq": seq})
        .content.decode()
    )
    assert "metrics specialist failed after" in replay
    markdown = render_export(session, owner, masked=False)
    assert "metrics specialist failed (tokens in/out 0/0)" in markdown
    assert "knowledge specialist completed (tokens in/out 0/0)" in markdown


def test_a_finished_jobs_root_run_reads_ended_before_its_row_is(builtin: None, alice: User) -> None:
    """Between the session's move (pushed to the page) and the lease's release (which
    ends the job's run row), the tree must not say the job still runs."""
    session = start_from_bundle(
        alice, SPEC / "ex-deploy-payments.tar.gz", {"producer": "t", "preferred_mode": "react"}
    )
    session.refresh_from_db()
    assert session.status == "waiting_user"  # at the fix's approval: no job runs
    root = AgentRun.objects.get(session=session, parent=None)
    last_step = AgentRun.objects.filter(parent=root).order_by("-ended_at").first()
    assert last_step is not None and last_step.ended_at is not None
    # the moment before the release: the row still says running
    AgentRun.objects.filter(pk=root.pk).update(status="running", ended_at=None)

    body = call("GET", tree_url(session), token_for(alice)).json()
    node = find(body["runs"], root.pk)
    assert node is not None
    assert node["status"] == "completed"
    assert node["ended_at"] is not None and node["current_tool"] is None
    page = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk]))
    assert 'data-status="running"' not in page.content.decode()

    # a session a job runs now: its root run is running, as its row says
    Session.objects.filter(pk=session.pk).update(status="running")
    node = find(call("GET", tree_url(session), token_for(alice)).json()["runs"], root.pk)
    assert node is not None and node["status"] == "running"
