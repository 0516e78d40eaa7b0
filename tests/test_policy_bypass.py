"""The policy cannot be bypassed: decisions need the digest they were shown, each action
has a risk-class floor in code, and execution re-checks the decision behind a call.

Personas: olga operates, abel and bea approve."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from aero.models import AuditLog
from approvals.actions import APPROVE, CONFIRM, do_decide
from approvals.models import Approval
from diagnosis.actions import ActionError
from diagnosis.agent.tools import ToolContext, run_action
from diagnosis.models import Event, Session, ToolCall
from diagnosis.selfcheck import publish_check
from packs.airport.agent import policy
from packs.airport.graph import load_active_graph
from packs.airport.models import Restriction, ScenarioAction
from scenarios_admin.actions import ScenarioError, do_publish
from scenarios_admin.definition import Issue
from scenarios_admin.models import Scenario
from scenarios_admin.schema import definition_issues
from tests.builtin_data import builtin_definition, demo_graph
from tests.web_helpers import approval_for, login, waiting_session

FLOOR_R3 = (
    "close_runway needs at least R3 (its floor in code), not R0: "
    "a scenario may raise an action's risk class, never lower it"
)


@pytest.fixture
def people(builtin: None, make_user: Callable[..., User]) -> dict[str, User]:
    return {
        "olga": make_user("olga", "operator"),
        "abel": make_user("abel", "approver"),
        "bea": make_user("bea", "approver"),
    }


# --- the digest ---------------------------------------------------------------------


@pytest.mark.services
@pytest.mark.parametrize("digest", [None, ""])
def test_a_post_without_the_digest_is_refused(people: dict[str, User], digest: str | None) -> None:
    session = waiting_session(people["olga"])
    crew = approval_for(session, "dispatch_cleanup_crew")
    data = {"decision": "approve"} | ({} if digest is None else {"digest": digest})

    response = login(people["abel"]).post(
        reverse("approvals:decide", args=[crew.pk]), data, follow=True
    )

    assert "does not say which request it is for (no digest)" in response.content.decode()
    crew.refresh_from_db()
    assert crew.status == "pending"
    assert not AuditLog.objects.filter(action="approval.approved").exists()


@pytest.mark.services
def test_do_decide_refuses_an_empty_digest(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    crew = approval_for(session, "dispatch_cleanup_crew")

    with pytest.raises(ActionError, match="no digest"):
        do_decide(crew.pk, people["abel"], APPROVE, digest="")

    crew.refresh_from_db()
    assert crew.status == "pending"


# --- risk-class floors ----------------------------------------------------------------


def lowered(definition: dict[str, Any], tool: str, risk_class: str) -> dict[str, Any]:
    definition = copy.deepcopy(definition)  # the shipped one is shared
    for action in definition["actions"]:
        if action["tool"] == tool:
            action["risk_class"] = risk_class
    return definition


def test_validation_refuses_a_class_below_the_floor_with_its_path() -> None:
    definition = lowered(builtin_definition("oil_spill"), "close_runway", "R0")
    index = [a["tool"] for a in definition["actions"]].index("close_runway")

    assert definition_issues(definition) == [Issue(f"actions[{index}].risk_class", FLOOR_R3)]


def test_a_scenario_may_raise_a_class() -> None:
    definition = lowered(builtin_definition("oil_spill"), "dispatch_cleanup_crew", "R3")

    assert definition_issues(definition) == []


def test_the_publish_self_check_compares_risk_classes_too(builtin: None) -> None:
    """The self-check refuses on its own, even for a definition validation never saw."""
    definition = lowered(builtin_definition("oil_spill"), "close_runway", "R0")
    index = [a["tool"] for a in definition["actions"]].index("close_runway")

    assert publish_check(Scenario, definition) == [f"actions[{index}].risk_class: {FLOOR_R3}"]


def test_publishing_a_lowered_class_is_refused(builtin: None) -> None:
    scenario = Scenario.objects.get(slug="oil_spill")
    ScenarioAction.objects.filter(scenario=scenario, tool="close_runway").update(risk_class="R0")
    before = scenario.latest_version()

    with pytest.raises(ScenarioError) as refused:
        do_publish(scenario, actor_label="pytest")

    assert refused.value.message == "The draft is not valid, so it cannot be published."
    assert any(p.endswith(f"risk_class: {FLOOR_R3}") for p in refused.value.problems)
    assert scenario.latest_version() == before


def test_the_runtime_raises_a_published_class_to_the_floor() -> None:
    """A version published before the floors existed still proposes close_runway as R3."""
    definition = lowered(builtin_definition("oil_spill"), "close_runway", "R0")
    # Fuel, engine running at stand 101: three hops reach runway 06/24 through C1.
    fields = {
        "flight_no": "MU5678",
        "position": "101",
        "fluid_type": "FUEL",
        "engine_status": "RUNNING",
        "continuous": True,
    }
    graph = demo_graph()
    fields = policy.with_defaults(definition, fields)
    risk = policy.assess_risk(definition, fields, graph)
    impact = policy.analyze_impact(definition, fields, graph, risk["level"])

    proposals = policy.required_actions(definition, fields, graph, risk, impact)

    assert {p["tool"]: p["risk_class"] for p in proposals}["close_runway"] == "R3"


# --- execution re-checks the decision ------------------------------------------------


def context(session: Session) -> ToolContext:
    return ToolContext(session_id=session.pk, graph=load_active_graph(), run=None, producer="test")


def assert_refused(session: Session, call: ToolCall, reason: str) -> None:
    call.refresh_from_db()
    assert call.status == "refused"
    assert reason in call.error
    assert not Restriction.objects.filter(tool_call=call).exists()
    event = Event.objects.filter(session=session).order_by("-seq").first()
    assert event is not None and event.type == "tool.call_refused"
    assert reason in event.payload["problems"]
    entry = AuditLog.objects.get(action="action.refused", object_id=str(call.pk))
    assert reason in entry.detail["problems"]


@pytest.mark.services
def test_a_forged_approved_status_does_not_run(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    closure = approval_for(session, "close_taxiway", taxiway="A")
    ToolCall.objects.filter(pk=closure.tool_call_id).update(
        status="approved", decided_by=people["abel"]
    )

    call = run_action(context(session), closure.tool_call_id)

    assert_refused(session, call, "its approval is pending, not approved")


@pytest.mark.services
def test_a_forged_approval_row_does_not_run(people: dict[str, User]) -> None:
    """Approval and call both say approved, but no one approved, confirmed or was audited."""
    session = waiting_session(people["olga"])
    closure = approval_for(session, "close_taxiway", taxiway="A")
    Approval.objects.filter(pk=closure.pk).update(status="approved", approver=people["abel"])
    ToolCall.objects.filter(pk=closure.tool_call_id).update(
        status="approved", decided_by=people["abel"]
    )

    call = run_action(context(session), closure.tool_call_id)

    assert_refused(session, call, "an R2 action needs an approval and a confirmation")
    assert "no audit entry records this decision" in call.error


@pytest.mark.services
@pytest.mark.parametrize(
    ("risk_class", "reason"),
    [("R0", FLOOR_R3), ("R3", "an R3 action runs only after an approver's decision")],
)
def test_a_forged_proposed_row_does_not_run(
    people: dict[str, User], risk_class: str, reason: str
) -> None:
    session = waiting_session(people["olga"])
    forged = ToolCall.objects.create(
        session=session,
        call_id="action:close_runway:runway=06/24",
        idempotency_key=f"{session.pk}:forged",
        tool_name="close_runway",
        risk_class=risk_class,
        is_action=True,
        request_payload={"runway": "06/24"},
        status="proposed",
    )

    call = run_action(context(session), forged.pk)

    assert_refused(session, call, reason)


@pytest.mark.services
def test_arguments_changed_after_the_decision_do_not_run(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    closure = approval_for(session, "close_taxiway", taxiway="A")
    do_decide(closure.pk, people["abel"], APPROVE, digest=closure.digest)
    do_decide(closure.pk, people["bea"], CONFIRM, digest=closure.digest)
    call = ToolCall.objects.get(pk=closure.tool_call_id)
    assert call.status == "completed"  # the genuine decision ran

    Restriction.objects.filter(tool_call=call).delete()
    ToolCall.objects.filter(pk=call.pk).update(status="approved", request_payload={"taxiway": "B"})
    call = run_action(context(session), call.pk)

    assert_refused(session, call, "its tool or arguments changed after the decision")
