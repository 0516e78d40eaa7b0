"""Rules the agent keeps whatever happens around it: slow or broken data sources degrade,
a step out of order is refused and corrected, actions run once, a finished session stays
finished."""

# Chinese incident reports use full-width punctuation on purpose.

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from pytest_django.fixtures import Settings

from approvals.actions import do_decide
from approvals.models import Approval
from diagnosis.agent import tools
from diagnosis.agent.state import AgentContext
from diagnosis.jobs import advance_session
from diagnosis.models import (
    AgentRun,
    Event,
    Report,
    Session,
    ToolCall,
    ToolCallStatus,
)
from packs.airport.agent import planning
from packs.airport.agent.nodes import reasoning
from packs.airport.agent.state import ApronState
from packs.airport.graph import load_active_graph
from packs.airport.models import Restriction

EXAMPLE_ONE = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"
EXAMPLE_TWO = "MU5678 stand 101 hydraulic leak, engines off, no longer leaking, about 2 m2"

pytestmark = pytest.mark.services


def run_incident(capsys: pytest.CaptureFixture[str], message: str, *options: str) -> dict[str, Any]:
    capsys.readouterr()
    call_command(
        "incident", "run", "--scenario", "oil_spill", "--message", message, *options, "--json"
    )
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


# --- (a) enrichment degrades, never blocks ----------------------------------------------


def test_a_failing_and_a_slow_source_degrade_the_report_not_the_session(
    builtin: None,
    capsys: pytest.CaptureFixture[str],
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.AERO_ENRICHMENT_TIMEOUT = 0.2
    release = threading.Event()

    def flight_plan_down(args: dict[str, Any]) -> dict[str, Any]:
        raise tools.ToolFailure("flight plan service down")

    def aircraft_info_hangs(args: dict[str, Any]) -> dict[str, Any]:
        release.wait(timeout=30)  # until the test lets go, far beyond the timeout
        return {
            "flight_no": args["flight_no"],
            "airline": "too late",
            "aircraft": "",
            "registration": "",
        }

    monkeypatch.setitem(tools.ENRICHMENT_SOURCES, "lookup_flight_plan", flight_plan_down)
    monkeypatch.setitem(tools.ENRICHMENT_SOURCES, "lookup_aircraft_info", aircraft_info_hangs)
    try:
        result = run_incident(capsys, EXAMPLE_TWO, "--decide", "approve")
    finally:
        release.set()

    assert result["status"] == "completed"
    assert result["risk"] == {"rule": "OS-12", "level": "LOW", "score": 25}
    assert [a["status"] for a in result["actions"]] == ["completed"] * 3

    lookups = {c.tool_name: c for c in ToolCall.objects.filter(tool_name__startswith="lookup_")}
    assert lookups["lookup_flight_plan"].status == ToolCallStatus.FAILED
    assert lookups["lookup_flight_plan"].error == "flight plan service down"
    assert lookups["lookup_aircraft_info"].status == ToolCallStatus.FAILED
    assert lookups["lookup_aircraft_info"].error == "timed out after 0.2 s"
    assert lookups["lookup_stand_location"].status == ToolCallStatus.COMPLETED

    report = result["report_markdown"]
    assert "Source lookup_flight_plan unavailable: flight plan service down" in report
    assert "Source lookup_aircraft_info unavailable: timed out after 0.2 s" in report
    assert "too late" not in report
    assert "Position: 101 (stand), next to A1" in report  # the healthy source still counts


# --- (b) compliance: a step out of order is refused and corrected ----------------------


CLOSE_RUNWAY = {
    "call_id": "action:close_runway:runway=06/24",
    "tool": "close_runway",
    "args": {"runway": "06/24"},
    "risk_class": "R3",
    "is_action": True,
    "mode": "propose",
    "position": 0,
}


def test_closing_a_runway_before_impact_analysis_is_refused(
    builtin: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[ApronState] = []

    def misbehaving_planner(state: ApronState, ctx: AgentContext) -> dict[str, Any]:
        seen.append(state)
        tried = any(s.get("risk") and not s.get("impact") for s in seen[:-1])
        if state.get("risk") and not state.get("impact") and not tried:
            return {"step": "call", "calls": [dict(CLOSE_RUNWAY)]}
        return planning.offline_plan(state, ctx)

    monkeypatch.setitem(reasoning.PLANNER, "plan", misbehaving_planner)
    result = run_incident(capsys, EXAMPLE_ONE, "--decide", "approve")

    violations = list(Event.objects.filter(type="fsm.violation").values_list("payload", flat=True))
    assert violations == [
        {
            "call_id": CLOSE_RUNWAY["call_id"],
            "tool": "close_runway",
            "violation": "close_runway needs state IMPACT_ANALYZED but the session is in "
            "RISK_ASSESSED",
        }
    ]
    # Not executed, not even proposed.
    assert not ToolCall.objects.filter(tool_name="close_runway").exists()
    assert not Restriction.objects.filter(kind=Restriction.Kind.RUNWAY).exists()
    assert not Event.objects.filter(
        type__startswith="tool.call", payload__tool_name="close_runway"
    ).exists()
    # The agent was told.
    assert any(violations[0]["violation"] in s.get("corrections", []) for s in seen)

    # And the session still ends as the policy requires.
    assert result["status"] == "completed"
    assert result["risk"] == {"rule": "OS-01", "level": "HIGH", "score": 95}
    assert [a["tool"] for a in result["actions"]] == [
        "notify_atc",
        "dispatch_cleanup_crew",
        "request_fire_standby",
        "suspend_stand_operations",
        "close_taxiway",
        "close_taxiway",
    ]
    assert {(r.kind, r.target) for r in Restriction.objects.all()} == {
        ("taxiway", "A"),
        ("taxiway", "B"),
        ("stand", "105"),
    }
    assert "OS-01" in result["report_markdown"]


# --- (c) an action runs once ----------------------------------------------------------


def test_running_an_approved_action_twice_closes_the_taxiway_once(
    builtin: None,
    capsys: pytest.CaptureFixture[str],
    make_user: Callable[..., User],
) -> None:
    result = run_incident(capsys, EXAMPLE_ONE)  # stops at the approvals
    call = ToolCall.objects.get(
        session_id=result["session"], tool_name="close_taxiway", request_payload__taxiway="A"
    )
    assert call.status == ToolCallStatus.AWAITING_APPROVAL
    # A real R2 decision (run_action re-checks it at execution time); the job it enqueues
    # runs the action once.
    abel = make_user("abel", "approver")
    approval = Approval.objects.get(tool_call=call)
    do_decide(approval.pk, abel, "approve", digest=approval.digest)
    do_decide(approval.pk, abel, "confirm", digest=approval.digest)
    context = tools.ToolContext(call.session_id, load_active_graph(), None, "test")

    tools.run_action(context, call.pk)  # a retried job
    tools.run_action(context, call.pk)  # and another

    call.refresh_from_db()
    assert call.status == ToolCallStatus.COMPLETED
    assert call.attempts == 1
    assert list(Restriction.objects.values_list("kind", "target", "tool_call_id")) == [
        ("taxiway", "A", call.pk)
    ]
    assert (
        Event.objects.filter(type="tool.call_completed", payload__call_id=call.call_id).count() == 1
    )


def test_a_late_duplicate_after_execution_changes_nothing(
    builtin: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = run_incident(capsys, EXAMPLE_ONE, "--decide", "approve")
    context = tools.ToolContext(result["session"], load_active_graph(), None, "test")
    restrictions = set(Restriction.objects.values_list("pk", flat=True))
    events = Event.objects.count()

    for call in ToolCall.objects.filter(session_id=result["session"], is_action=True):
        tools.run_action(context, call.pk)

    assert set(Restriction.objects.values_list("pk", flat=True)) == restrictions
    assert len(restrictions) == 3
    assert Event.objects.count() == events
    assert set(ToolCall.objects.filter(is_action=True).values_list("attempts", flat=True)) == {1}


# --- (d) a finished session stays finished ----------------------------------------------


def test_advancing_a_completed_session_again_does_nothing(
    builtin: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = run_incident(capsys, EXAMPLE_TWO, "--decide", "approve")
    session = Session.objects.get(pk=result["session"])
    assert session.status == "completed"
    before = (
        Event.objects.count(),
        AgentRun.objects.count(),
        ToolCall.objects.count(),
        Restriction.objects.count(),
        Report.objects.get().markdown,
        session.last_seq,
    )

    assert advance_session(str(session.pk)) == "completed"

    session.refresh_from_db()
    after = (
        Event.objects.count(),
        AgentRun.objects.count(),
        ToolCall.objects.count(),
        Restriction.objects.count(),
        Report.objects.get().markdown,
        session.last_seq,
    )
    assert after == before
    assert session.status == "completed"
