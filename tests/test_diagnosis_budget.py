"""The model budget in an IT diagnosis (issue 35): with a scripted model (the simulated
provider over HTTP), a diagnosis whose step budget is spent does not ask the model
again: it waits in the approval queue as the R1 request to continue, showing what was
spent (`budget.exhausted`); approving raises the budget (`budget.raised`) and the model
goes on where it stopped; refusing (`budget.stopped`) leaves the rest to the playbook,
which concludes exactly as expected.yaml, with no model call after the refusal. Every
test runs with the model's calls in the job and as waits the LLM runner answers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings

from approvals.actions import APPROVE, CONFIRM, REJECT, do_decide
from approvals.models import OPEN_STATUSES, Approval, ApprovalStatus
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.fold import fold_events
from diagnosis.models import Event, LLMCall, Session, SessionStatus
from packs.diagnosis.sessions import start_from_bundle, summarize
from tests.llm_helpers import fake_llm, fake_provider
from tests.test_diagnosis_model import BUNDLE, CITED, PLAN_RULE, REACT_RULES, WORDS
from tests.test_diagnosis_sessions import EXPECTED

__all__ = ["fake_llm"]  # the fixture

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True, params=[False, True], ids=["calls-in-the-job", "calls-as-waits"])
def model_calls(request: pytest.FixtureRequest, settings: Any) -> bool:
    settings.AERO_LLM_WAITS = request.param
    return bool(request.param)


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


def payloads(session: Session, kind: str) -> list[dict[str, Any]]:
    return [e.payload for e in Event.objects.filter(session=session, type=kind).order_by("seq")]


def model_calls_of(session: Session, purpose: str) -> int:
    return LLMCall.objects.filter(session=session, purpose=purpose, status="ok").count()


def paused(session: Session) -> Approval:
    return Approval.objects.get(session=session, action_name="continue_budget", status="pending")


def start(user: User, mode: str) -> Session:
    session = start_from_bundle(user, BUNDLE, {"producer": "t", "preferred_mode": mode})
    session.refresh_from_db()
    return session


def decide(approval: Approval, user: User, decision: str, reason: str = "") -> None:
    do_decide(approval.pk, user, decision, reason, digest=approval.digest, producer="t")


def approve_the_fix(session: Session, user: User) -> None:
    for approval in Approval.objects.filter(session=session, status__in=OPEN_STATUSES):
        while approval.is_open:
            step = CONFIRM if approval.status == ApprovalStatus.CONFIRMING else APPROVE
            approval = do_decide(
                approval.pk, user, step, "approved", digest=approval.digest, producer="t"
            )


def test_a_spent_step_budget_pauses_the_diagnosis_and_each_approval_lets_the_model_go_on(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    fake_llm.set_script({"rules": [*REACT_RULES, CITED]})
    fake_provider(fake_llm, max_steps=2)
    chief = make_user("chief", "operator", "approver")
    session = start(chief, "react")

    # Two steps the model chose, then the session waits instead of asking a third time.
    assert session.status == SessionStatus.WAITING_USER
    assert model_calls_of(session, "reason") == 2
    request = paused(session)
    assert request.risk_class == "R1"
    assert request.tool_call.request_payload["spent"]["steps"] == 2
    (spent,) = payloads(session, "budget.exhausted")
    assert spent["exhausted"] == ["steps"]
    assert not [p for p in payloads(session, "finding.recorded") if p["kind"] == "root_cause"]

    decide(request, chief, APPROVE)
    session.refresh_from_db()
    # Raised to 4 steps: two more, then it waits again.
    assert session.status == SessionStatus.WAITING_USER
    assert payloads(session, "budget.raised")[0]["limits"]["steps"] == 4
    assert model_calls_of(session, "reason") == 4

    decide(paused(session), chief, APPROVE)
    approve_the_fix(session, chief)
    session.refresh_from_db()
    result = summarize(session)
    assert result["status"] == "completed"
    assert len(payloads(session, "budget.exhausted")) == 2
    assert [p["limits"]["steps"] for p in payloads(session, "budget.raised")] == [4, 6]
    # The model chose every call and worded the conclusion, as without a budget.
    assert model_calls_of(session, "reason") == 5 and model_calls_of(session, "conclude") == 1
    assert result["root_cause"]["summary"] == WORDS
    folded = fold_events(Event.objects.filter(session=session).order_by("seq"))
    assert folded.snapshot["budget"] == session.snapshot["budget"]


def test_refusing_to_continue_leaves_the_rest_of_the_diagnosis_to_the_playbook(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    fake_llm.set_script({"rules": [*REACT_RULES, CITED]})
    fake_provider(fake_llm, max_steps=2)
    chief = make_user("chief", "operator", "approver")
    session = start(chief, "react")

    decide(paused(session), make_user("abel", "approver"), REJECT, "too costly")

    session.refresh_from_db()
    (stopped,) = payloads(session, "budget.stopped")
    assert (stopped["by"], stopped["reason"]) == ("abel", "too costly")
    assert session.snapshot["budget"]["state"] == "stopped"
    approve_the_fix(session, chief)
    session.refresh_from_db()
    result = summarize(session)
    assert result["status"] == "completed"
    # No model call after the refusal: the playbook chose the rest and its words stand.
    assert model_calls_of(session, "reason") == 2
    assert model_calls_of(session, "conclude") == 0
    expected = EXPECTED["ex-deploy-payments"]
    assert result["root_cause"]["hypothesis"] == expected["hypothesis"]
    assert result["root_cause"]["summary"] != WORDS
    assert len(payloads(session, "budget.stopped")) == 1


def test_in_plan_execute_the_conclusion_waits_for_the_budget_too(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    fake_llm.set_script({"rules": [PLAN_RULE, CITED]})
    fake_provider(fake_llm, max_steps=1)
    chief = make_user("chief", "operator", "approver")
    session = start(chief, "plan_execute")

    # The plan was the model's; its calls ran; the conclusion waits for the budget.
    assert session.status == SessionStatus.WAITING_USER
    (plan,) = payloads(session, "diagnosis.plan")
    assert plan["by"] == "fake"
    assert model_calls_of(session, "conclude") == 0
    decide(paused(session), chief, APPROVE)
    session.refresh_from_db()
    assert model_calls_of(session, "conclude") == 1
    assert summarize(session)["root_cause"]["summary"] == WORDS
