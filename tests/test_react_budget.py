"""Budgets that pause, not fail (issue 11 item 6), with a scripted model through the
simulated server over HTTP: when the session's step or cost budget runs out it waits in
the approval queue as an R1 request to continue, showing what was spent; approving
raises the budget and the agent goes on, rejecting ends the session with a report of
what was done. Every step is an event, and the fold shows it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.actions import do_decide, sweep_expired_approvals
from approvals.models import Approval, ManualTodo
from diagnosis.agent.budget import Amounts, base_limits, check
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.agent.providers import OpenAICompatibleProvider
from diagnosis.agent.state import AgentContext
from diagnosis.fold import fold_events
from diagnosis.models import (
    AgentRun,
    Event,
    LLMCall,
    Report,
    Session,
    SessionStatus,
    ToolCall,
)
from packs.airport.graph import load_active_graph
from scenarios_admin.draft import normalize
from scenarios_admin.models import ProviderConfig
from scenarios_admin.schema import validate_definition
from tests.builtin_data import oil_spill
from tests.llm_helpers import fake_llm, fake_provider
from tests.test_react import EXTRACTION, OFFLINE_ACTIONS, proposed, reasoning_rules, start

__all__ = ["fake_llm"]  # the fixture


@pytest.fixture(autouse=True, params=[False, True], ids=["calls-in-the-job", "calls-as-waits"])
def model_calls(request: pytest.FixtureRequest, settings: Any) -> None:
    """Every scripted-model test both ways: calls made inside the job (the CLI's inline
    backend), and as waits that the LLM runner answers (production; run inline here)."""
    settings.AERO_LLM_WAITS = request.param


pytestmark = pytest.mark.services


def events(session: Session, kind: str) -> list[Event]:
    return list(Event.objects.filter(session=session, type=kind).order_by("seq"))


def paused_request(session: Session) -> Approval:
    return Approval.objects.get(session=session, action_name="continue_budget", status="pending")


def reason_calls(session: Session) -> int:
    return LLMCall.objects.filter(session=session, purpose="reason", status="ok").count()


def test_a_spent_step_budget_waits_for_an_approver_and_approval_resumes(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    fake_llm.set_script({"rules": [EXTRACTION, *reasoning_rules()]})
    fake_provider(fake_llm, max_steps=2)
    session = start(make_user)

    # Two reasoning steps (lookups, risk), then the agent waits instead of a third call.
    assert session.status == SessionStatus.WAITING_USER
    assert reason_calls(session) == 2
    assert session.snapshot["risk"]["rule"] == "OS-01" and not session.snapshot.get("impact")
    request = paused_request(session)
    assert request.risk_class == "R1"
    assert request.tool_call.request_payload["spent"]["steps"] == 2
    assert request.tool_call.request_payload["raise"]["steps"] == 2
    (spent,) = events(session, "budget.exhausted")
    assert spent.payload["exhausted"] == ["steps"]
    assert proposed(session) == []  # nothing proposed, nothing executed while paused
    # A re-run of the step (a job killed before its checkpoint) finds the request it
    # opened and waits again: one pause, one request, one event.
    config = ProviderConfig.objects.get(name="fake")
    ctx = AgentContext(
        session.pk,
        session.scenario_version.definition,
        load_active_graph(),
        [OpenAICompatibleProvider(config)],
        AgentRun.objects.filter(session=session).first(),  # type: ignore[arg-type]
        "test",
    )
    assert check({}, ctx, [OpenAICompatibleProvider(config)]) == {"step": "await"}
    assert ToolCall.objects.filter(session=session, tool_name="continue_budget").count() == 1
    assert len(events(session, "budget.exhausted")) == 1

    do_decide(request.pk, make_user("abel", "approver"), "approve", digest=request.digest)

    session.refresh_from_db()
    (raised,) = events(session, "budget.raised")
    assert raised.payload["by"] == "abel" and raised.payload["limits"]["steps"] == 4
    assert reason_calls(session) == 4  # impact and actions, within the raised budget
    assert proposed(session) == OFFLINE_ACTIONS
    assert session.snapshot["budget"]["state"] == "running"
    # The fold of the log gives the same budget state as the live snapshot.
    folded = fold_events(Event.objects.filter(session=session).order_by("seq"))
    assert folded.snapshot["budget"] == session.snapshot["budget"]


def test_rejecting_the_continuation_ends_the_session_with_a_report(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    fake_llm.set_script({"rules": [EXTRACTION, *reasoning_rules()]})
    fake_provider(fake_llm, max_steps=2)
    session = start(make_user)
    request = paused_request(session)

    do_decide(
        request.pk, make_user("abel", "approver"), "reject", "too costly", digest=request.digest
    )

    session.refresh_from_db()
    assert session.status == SessionStatus.COMPLETED
    (stopped,) = events(session, "budget.stopped")
    assert stopped.payload == {**stopped.payload, "by": "abel", "reason": "too costly"}
    report = Report.objects.get(session=session).markdown
    assert "已停止" in report and "too costly" in report  # the session's language
    assert "OS-01" in report  # what was done: the risk it assessed
    assert reason_calls(session) == 2  # no model call after the refusal
    assert proposed(session) == []
    folded = fold_events(Event.objects.filter(session=session).order_by("seq"))
    assert folded.snapshot["budget"]["state"] == "stopped"


def test_a_cost_budget_pauses_showing_the_money_spent(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    priced = [
        {**rule, "usage": {"prompt_tokens": 1000, "completion_tokens": 0}}
        for rule in [EXTRACTION, *reasoning_rules()]
    ]
    fake_llm.set_script({"rules": priced})
    # ¥0.01 per 1,000 tokens in: extraction + one reasoning step reach ¥0.02.
    fake_provider(fake_llm, max_cost=Decimal("0.02"))
    session = start(make_user)

    request = paused_request(session)
    payload = request.tool_call.request_payload
    assert payload["exhausted"] == ["cost"]
    assert Decimal(payload["spent"]["cost"]) == Decimal("0.02")
    assert Decimal(payload["raise"]["cost"]) == Decimal("0.02")
    assert reason_calls(session) == 1


@pytest.mark.parametrize(
    ("language", "expected"),
    [
        ("en", ["continue with 2 more steps", "spent so far: 2 steps", "model budget"]),
        ("zh-hans", ["再继续 2 步", "已花费：2 步", "模型预算"]),
    ],
)
def test_the_queue_card_reads_well(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    language: str,
    expected: list[str],
) -> None:
    fake_llm.set_script({"rules": [EXTRACTION, *reasoning_rules()]})
    fake_provider(fake_llm, max_steps=2)
    session = start(make_user)
    request = paused_request(session)
    client = Client()
    client.force_login(make_user("abel", "approver"))
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = language

    page = client.get(reverse("approvals:queue")).content.decode()

    card = page[page.index(f'id="approval-{request.pk}"') :]
    card = card[: card.index("</article>")]
    for text in expected:
        assert text in card
    assert "raise=" not in card  # not the raw payload
    assert 'data-testid="bulk-r1"' not in page  # money is decided on its own, not in a batch
    # The session page shows it among the decisions to take, with its approve button.
    page = client.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    row = page[page.index(f'id="action-{request.tool_call_id}"') :]
    row = row[: row.index("</tr>")]
    assert expected[0] in row and 'value="approve"' in row


def test_the_budget_comes_from_the_scenario_before_the_provider(
    builtin: None, fake_llm: FakeLLMServer
) -> None:
    provider = OpenAICompatibleProvider(fake_provider(fake_llm, max_steps=5, max_tokens=900))
    definition = {**oil_spill(), "budget": {"steps": 3, "cost": 1.5}}

    assert base_limits(definition, [provider]) == Amounts(3, 900, Decimal("1.5"))
    assert base_limits(oil_spill(), [provider]) == Amounts(5, 900, None)
    assert not base_limits(oil_spill(), [])
    assert validate_definition(definition) == []
    # The admin editor's rows keep it (scenario fields budget_steps/_tokens/_cost).
    assert normalize(definition)["budget"] == {"steps": 3, "cost": 1.5}
    assert "budget" not in normalize(oil_spill())
    # In the order of the document.
    assert validate_definition({**oil_spill(), "budget": {"steps": 0, "coins": 1}}) == [
        "budget.steps: must be a positive whole number",
        "budget.coins: unknown key (allowed: steps, tokens, cost)",
    ]


def test_without_a_budget_nothing_pauses(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    fake_llm.set_script({"rules": [EXTRACTION, *reasoning_rules()]})
    fake_provider(fake_llm)
    session = start(make_user)

    assert not ToolCall.objects.filter(session=session, tool_name="continue_budget").exists()
    assert proposed(session) == OFFLINE_ACTIONS


def test_an_undecided_continuation_stops_at_its_deadline_without_a_todo(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    fake_llm.set_script({"rules": [EXTRACTION, *reasoning_rules()]})
    fake_provider(fake_llm, max_steps=2)
    session = start(make_user)
    request = paused_request(session)
    Approval.objects.filter(pk=request.pk).update(deadline=timezone.now() - timedelta(seconds=1))

    assert sweep_expired_approvals() == 1

    session.refresh_from_db()
    assert session.status == SessionStatus.COMPLETED
    (stopped,) = events(session, "budget.stopped")
    assert stopped.payload["outcome"] == "timeout"
    assert Report.objects.filter(session=session).exists()
    assert not ManualTodo.objects.exists()  # nothing people could do by hand
