"""Run modes of an IT diagnosis (DIAGNOSIS.md §4, seed 003 §5.2): which mode runs and
why (the reporter's choice > the routing matrix > the default), what each mode looks
like in the log (ReAct's steps, plan-execute's plan shown before its calls, the
hierarchical orchestrator's specialists as child runs), and the two switches: ReAct to
plan-execute after steps that add nothing, hierarchical to the minimal path when too
many specialists fail. The examples conclude alike in every mode
(tests/test_diagnosis_sessions.py)."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse
from pydantic import ValidationError

from diagnosis.actions import do_retry
from diagnosis.agent.nodes import waiting
from diagnosis.chain import verify_chain
from diagnosis.models import AgentRun, Event, Session, ToolCall
from packs.diagnosis import slow
from packs.diagnosis.code import CodeToolError
from packs.diagnosis.modes import choose_mode
from packs.diagnosis.playbook_data import Playbook, RunModes, default_playbook
from packs.diagnosis.sessions import start_from_bundle
from replay.export import render_export
from tests.api_helpers import token_for
from tests.bundles import START, BundleWriter, config_change, deploy
from tests.test_diagnosis_sessions import SPEC, run_bundle
from tests.web_helpers import login
from tools.client import PYTHON, ServerSpec

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


def events(session_id: str, kind: str) -> list[dict[str, Any]]:
    rows = Event.objects.filter(session_id=session_id, type=kind).order_by("seq")
    return [e.payload for e in rows]


def unpacked(tmp_path: Path, name: str) -> Path:
    with tarfile.open(SPEC / f"{name}.tar.gz") as archive:
        archive.extractall(tmp_path / "x", filter="data")
    return tmp_path / "x" / name


# --- the choice ------------------------------------------------------------------------------


def test_the_reporters_choice_beats_the_routing_matrix_which_beats_the_default() -> None:
    modes = RunModes(default="react", routing={"slow_response": "hierarchical"})
    assert choose_mode("plan_execute", "react", "slow_response", modes) == (
        "plan_execute",
        "preferred",
    )
    assert choose_mode("", "plan_execute", "slow_response", modes) == ("plan_execute", "preferred")
    assert choose_mode("", "", "slow_response", modes) == ("hierarchical", "routing")
    assert choose_mode("", "", "error_spike", modes) == ("react", "default")


def test_a_route_for_a_problem_type_the_playbook_does_not_declare_is_refused() -> None:
    data = default_playbook().model_dump()
    data["modes"]["routing"] = {"slow_respnse": "hierarchical"}
    with pytest.raises(ValidationError, match="slow_respnse"):
        Playbook.model_validate(data)
    data["modes"]["routing"] = {"slow_response": "parallel"}
    with pytest.raises(ValidationError, match=r"routing\.slow_response"):
        Playbook.model_validate(data)


def test_without_a_preference_the_route_of_the_stated_problem_type_runs(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # the inventory example states slow_response: the pack routes it to hierarchical
    routed = run_bundle(capsys, SPEC / "ex-pool-inventory.tar.gz")
    assert (routed["mode"], routed["mode_source"]) == ("hierarchical", "routing")
    # the cache example states no problem type: the default
    default = run_bundle(capsys, SPEC / "ex-upstream-cache.tar.gz")
    assert (default["mode"], default["mode_source"]) == ("react", "default")
    chosen = events(default["session"], "diagnosis.mode_chosen")
    assert chosen == [{"mode": "react", "source": "default", "problem_type": "", "preferred": ""}]
    # every job's root run of the session (it ran until the approval, then on) has it
    roots = AgentRun.objects.filter(session_id=routed["session"], parent=None)
    assert roots.count() == 2
    assert {root.mode for root in roots} == {"hierarchical"}


def test_the_mode_chosen_on_the_form_shows_on_the_page_and_in_the_api(
    builtin: None, alice: User
) -> None:
    client = login(alice)
    response = client.post(
        reverse("diagnosis_pack:new"),
        {"demo": "ex-upstream-cache", "preferred_mode": "plan_execute"},
    )
    assert response.status_code == 302
    session = Session.objects.get()
    page = client.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert 'data-field="mode">Plan and execute<' in page
    assert "from the reporter&#x27;s choice" in page or "from the reporter's choice" in page
    body = (
        Client()
        .get(
            f"/api/v1/diagnosis-sessions/{session.pk}",
            HTTP_AUTHORIZATION=f"Bearer {token_for(alice, 'operator')}",
        )
        .json()
    )
    assert body["snapshot"]["run_mode"] == {"mode": "plan_execute", "source": "preferred"}


def test_the_mode_chosen_in_an_api_upload_runs(builtin: None, alice: User) -> None:
    token = token_for(alice, "operator")
    with (SPEC / "ex-upstream-cache.tar.gz").open("rb") as bundle:
        response = Client().post(
            "/api/v1/diagnosis-sessions",
            {"bundle": bundle, "preferred_mode": "hierarchical"},
            headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "mode-1"},
        )
    assert response.status_code == 201, response.content
    session_id = response.json()["session_id"]
    assert events(session_id, "diagnosis.mode_chosen")[0]["mode"] == "hierarchical"
    assert AgentRun.objects.filter(session_id=session_id, agent_name="orchestrate").exists()
    with (SPEC / "ex-upstream-cache.tar.gz").open("rb") as bundle:
        refused = Client().post(
            "/api/v1/diagnosis-sessions",
            {"bundle": bundle, "preferred_mode": "swarm"},
            headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "mode-2"},
        )
    assert refused.status_code == 422
    assert Session.objects.count() == 1  # nothing made of the refused one


# --- what each mode does -------------------------------------------------------------------


def evidence_ids(result: dict[str, Any]) -> set[str]:
    return {e["id"] for e in result["evidence"]}


def test_each_mode_works_its_own_way_and_reads_the_same_evidence(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = SPEC / "ex-deploy-payments.tar.gz"
    react = run_bundle(capsys, bundle, "--mode", "react")
    planned = run_bundle(capsys, bundle, "--mode", "plan_execute")
    hierarchical = run_bundle(capsys, bundle, "--mode", "hierarchical")
    assert evidence_ids(react) == evidence_ids(planned) == evidence_ids(hierarchical)
    assert {"ev-code-1", "ev-similar_cases"} <= evidence_ids(react)
    # the past cases were searched once in each mode, written with their call
    for result in (react, planned, hierarchical):
        assert len(events(result["session"], "diagnosis.similar_cases")) == 1
    for result in (planned, hierarchical):
        for key in ("root_cause", "confidence", "related_services", "code_locations"):
            assert result[key] == react[key], key

    # ReAct: one step per evidence call, each saying whether it added evidence
    steps = AgentRun.objects.filter(session_id=react["session"], agent_name="react_step")
    assert steps.count() == len(react["evidence"]) - 1  # read_bundle is the intake's
    words = [s.output_summary["summary"] for s in steps.order_by("id")]
    assert words[0].startswith("log_signatures: new evidence")
    assert words[-1].endswith("enough evidence: conclude")

    # plan-execute: the plan lists the reads with their arguments before any of them runs
    plan_event = Event.objects.get(session_id=planned["session"], type="diagnosis.plan")
    assert [c["tool"] for c in plan_event.payload["calls"]] == [
        "log_signatures",
        "anomalies",
        "deploys",
    ]
    assert plan_event.payload["then"] == ["topology", "similar_cases", "code"]
    first_read = Event.objects.filter(
        session_id=planned["session"], type="tool.call_started", payload__tool_name="log_signatures"
    ).get()
    assert plan_event.seq < first_read.seq

    # hierarchical: four specialists, child runs of the orchestrator, in parallel
    session = hierarchical["session"]
    orchestrator = AgentRun.objects.get(session_id=session, agent_name="orchestrate")
    assert orchestrator.mode == "hierarchical"
    specialists = AgentRun.objects.filter(session_id=session, agent_name__startswith="specialist_")
    assert {(s.agent_name, s.parent_id, s.mode, s.status) for s in specialists} == {
        (f"specialist_{name}", orchestrator.pk, "react", "completed")
        for name in ("logs", "metrics", "changes_code", "knowledge")
    }
    assert all(s.ended_at and s.ended_at >= s.started_at for s in specialists)
    # each specialist's calls are recorded under its own steps
    for call_id, specialist in (
        ("ev-code-1", "specialist_changes_code"),
        ("ev-log_signatures", "specialist_logs"),
        ("ev-topology-payments", "specialist_knowledge"),
        ("ev-similar_cases", "specialist_knowledge"),
    ):
        call = ToolCall.objects.get(session_id=session, call_id=call_id)
        assert AgentRun.objects.get(children__tool_calls=call).agent_name == specialist
    reported = events(session, "diagnosis.specialist_reported")
    assert sorted((r["specialist"], r["status"]) for r in reported) == [
        ("changes_code", "completed"),
        ("knowledge", "completed"),
        ("logs", "completed"),
        ("metrics", "completed"),
    ]
    tree = {(r["agent"], r["mode"]) for r in hierarchical["agent_tree"]}
    assert ("orchestrate", "hierarchical") in tree and ("specialist_logs", "react") in tree
    assert not events(session, "diagnosis.mode_switched")


# --- the switches --------------------------------------------------------------------------


def quiet_bundle(tmp_path: Path) -> Path:
    """Nothing wrong in the logs or the metrics, and changes from before the window: three
    reads in a row that add nothing, and a fourth left to make."""
    old = START.replace(day=START.day - 2)
    writer = BundleWriter(
        deploys=[deploy("D-1", "orders", old, ["orders/app.py"])],
        config_changes=[config_change("C-1", "orders", "pool_size", 10, 20, old)],
    )
    return writer.write(tmp_path / "quiet")


def test_react_switches_to_plan_execute_after_three_steps_that_add_nothing(
    builtin: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = run_bundle(capsys, quiet_bundle(tmp_path), "--mode", "react")

    session = result["session"]
    switched = events(session, "diagnosis.mode_switched")
    assert switched == [
        {
            "from": "react",
            "to": "plan_execute",
            "reason": "no_new_evidence",
            "steps": 3,
            "calls": ["ev-log_signatures", "ev-anomalies", "ev-deploys"],
        }
    ]
    # the plan takes what is left, then one conclusion
    plan_event = events(session, "diagnosis.plan")
    assert [c["id"] for c in plan_event[0]["calls"]] == ["ev-config_changes"]
    assert (result["mode"], result["mode_switched_to"]) == ("react", "plan_execute")
    assert result["root_cause"]["hypothesis"] == "unknown"
    # the switch is on the timeline, in replay and in the export, with its reason
    owner = Session.objects.get(pk=session).created_by
    page = login(owner).get(reverse("diagnosis:session-detail", args=[session])).content.decode()
    assert 'data-testid="mode-switch-line"' in page
    assert "3 steps in a row added no new evidence" in page
    seq = Event.objects.get(session_id=session, type="diagnosis.mode_switched").seq
    replay = (
        login(owner)
        .get(reverse("replay:replay-step", args=[session]), {"seq": seq})
        .content.decode()
    )
    assert "3 steps in a row added no new evidence" in replay
    markdown = render_export(Session.objects.get(pk=session), owner, masked=False)
    assert "switched from ReAct to Plan and execute: 3 steps in a row" in markdown


def test_one_failed_specialist_of_four_does_not_degrade(
    builtin: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = unpacked(tmp_path, "ex-deploy-payments")
    (folder / "metrics.csv").unlink()
    react = run_bundle(capsys, folder, "--mode", "react")
    result = run_bundle(capsys, folder, "--mode", "hierarchical")

    metrics = AgentRun.objects.get(session_id=result["session"], agent_name="specialist_metrics")
    assert metrics.status == "failed"
    assert not events(result["session"], "diagnosis.mode_switched")
    assert result["root_cause"] == react["root_cause"]
    assert result["confidence"] == react["confidence"]


def crash_the_code_server(monkeypatch: pytest.MonkeyPatch, words: str) -> None:
    def crashed(repo: Path, **kwargs: Any) -> Any:
        raise CodeToolError(words)

    monkeypatch.setattr(slow, "code", crashed)


@pytest.mark.parametrize(
    "broken",
    ["crashed", "timed_out"],
)
def test_two_failed_specialists_of_four_degrade_to_the_minimal_path(
    builtin: None,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    broken: str,
) -> None:
    folder = unpacked(tmp_path, "ex-deploy-payments")
    (folder / "metrics.csv").unlink()  # the metrics specialist has nothing to read
    if broken == "crashed":
        crash_the_code_server(monkeypatch, "the MCP server exited before it answered")
        limits = override_settings(AERO_TOOL_RETRIES=0, AERO_TOOL_BACKOFF=0)
    else:  # the MCP git server hangs: the code tool times out
        hung = ServerSpec("git", PYTHON, ["-c", "import time; time.sleep(60)"], timeout=1)
        monkeypatch.setattr("packs.diagnosis.code.code_server", lambda repo: hung)
        limits = override_settings(AERO_TOOL_RETRIES=0, AERO_TOOL_BACKOFF=0)
    with limits:
        result = run_bundle(capsys, folder, "--mode", "hierarchical")

    session = result["session"]
    failed = AgentRun.objects.filter(session_id=session, status="failed").values_list(
        "agent_name", flat=True
    )
    assert sorted(failed) == ["specialist_changes_code", "specialist_metrics"]
    (switch,) = events(session, "diagnosis.mode_switched")
    assert switch == {
        "from": "hierarchical",
        "to": "minimal",
        "reason": "specialists_failed",
        "failed": ["metrics", "changes_code"],
        "of": 4,
        "threshold": 0.4,
    }
    code = ToolCall.objects.get(session_id=session, call_id="ev-code-1")
    assert code.status == "failed"
    assert ("no answer within" if broken == "timed_out" else "MCP server exited") in code.error
    # the conclusion rests on the minimal path: the changes (no metrics to read), not logs
    finding = Event.objects.get(
        session_id=session, type="finding.recorded", payload__kind="root_cause"
    )
    assert set(finding.payload["evidence"]) <= {"ev-bundle", "ev-deploys", "ev-min-anomalies"}
    assert "logs" in finding.payload["missing"] and "metrics" in finding.payload["missing"]
    assert result["mode_switched_to"] == "minimal"
    owner = Session.objects.get(pk=session).created_by
    page = login(owner).get(reverse("diagnosis:session-detail", args=[session])).content.decode()
    assert "2 of 4 specialists failed (Metrics, Changes and code), over the 40% limit" in page


# --- re-run after a crash ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["react", "plan_execute", "hierarchical"])
def test_every_step_run_again_after_a_crash_writes_nothing_twice(
    builtin: None, alice: User, monkeypatch: pytest.MonkeyPatch, settings: Any, mode: str
) -> None:
    """The worker dies after the evidence steps committed and before their checkpoint (at
    the approval wait, every attempt); the retry runs every step again from the start,
    the specialists' branches too. Each event is written once, each call and each
    specialist's run exists once, and the chain verifies."""
    original = waiting.wait_for_user
    crashes = {"left": settings.AERO_JOB_ATTEMPTS}

    def crash_before_the_wait(*args: Any) -> Any:
        if crashes["left"]:
            crashes["left"] -= 1
            raise RuntimeError("worker lost its database connection")
        return original(*args)

    monkeypatch.setattr(waiting, "wait_for_user", crash_before_the_wait)
    session = start_from_bundle(
        alice, SPEC / "ex-deploy-payments.tar.gz", {"producer": "t", "preferred_mode": mode}
    )
    session.refresh_from_db()
    assert session.status == "failed"
    before = {
        kind: Event.objects.filter(session=session, type=kind).count()
        for kind in ("diagnosis.mode_chosen", "diagnosis.plan", "tool.call_completed")
    }
    with connection.cursor() as cursor:  # as if the process died before its checkpoint
        for table in ("checkpoint_writes", "checkpoint_blobs", "checkpoints"):
            cursor.execute(f"DELETE FROM {table} WHERE thread_id = %s", [str(session.pk)])
    do_retry(session.pk, alice)
    session.refresh_from_db()
    assert session.status == "waiting_user"

    logged = list(Event.objects.filter(session=session).order_by("seq"))
    keys = [e.key for e in logged if e.key]
    assert len(keys) == len(set(keys))
    for kind, count in before.items():
        assert sum(e.type == kind for e in logged) == count, kind
    calls = list(ToolCall.objects.filter(session=session).values_list("call_id", flat=True))
    assert len(calls) == len(set(calls)) and "ev-code-1" in calls
    assert sum(e.type == "diagnosis.similar_cases" for e in logged) == 1
    specialists = AgentRun.objects.filter(session=session, agent_name__startswith="specialist_")
    assert specialists.count() == (4 if mode == "hierarchical" else 0)
    assert sum(e.type == "diagnosis.specialist_reported" for e in logged) == specialists.count()
    # each specialist's start and end are one event each, however often its branch ran
    assert sum(e.type == "agent.run_started" for e in logged) == specialists.count()
    assert sum(e.type == "agent.run_ended" for e in logged) == specialists.count()
    assert (
        sum(e.type == "finding.recorded" and e.payload["kind"] == "root_cause" for e in logged) == 1
    )
    assert verify_chain(session.pk).ok
