"""Token accounting is never silently zero (issue 33 item 3): a provider whose reply
carries no usage (a stream without its usage chunk, a plain reply without `usage`) is
counted by AERO's stated estimate, marked `estimated` on the call's row, its `llm.call`
event, the session's snapshot and every page that shows the usage (zh-hans and en), and
budgets count the estimate: a token budget pauses the session as it would with reported
usage. Through the simulated server over real HTTP, with the calls made inside the job
and as waits the LLM runner answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.agent.usage import estimate_reply, estimate_request, estimate_tokens
from diagnosis.fold import fold_events
from diagnosis.models import Event, LLMCall, Session
from tests.api_helpers import call as api_call
from tests.api_helpers import token_for
from tests.llm_helpers import fake_llm, fake_provider
from tests.test_react import EXTRACTION, reasoning_rules, start

__all__ = ["fake_llm"]  # the fixture

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True, params=[False, True], ids=["calls-in-the-job", "calls-as-waits"])
def model_calls(request: pytest.FixtureRequest, settings: Any) -> None:
    """Both ways a call is made: inside the job (a plain chat completion) and by the LLM
    runner (streamed; the server leaves out the usage chunk it was asked for)."""
    settings.AERO_LLM_WAITS = request.param


def no_usage(rule: dict[str, Any]) -> dict[str, Any]:
    return {**rule, "no_usage": True}


def test_the_stated_estimate() -> None:
    # One token per CJK character, one per four other characters, rounded up.
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("燃油泄漏") == 4
    assert estimate_tokens("CA1234 在105机位") == 3 + 3  # 3 CJK, 10 other characters
    # A request: 4 tokens per message for the chat format, plus the tools' schemas.
    assert estimate_request([("system", "abcd"), ("human", "燃油")]) == 4 + 1 + 4 + 2
    assert estimate_request([("human", "abcd")], [{"x": 1}]) == 4 + 1 + 2  # '{"x": 1}'
    # A reply costs at least one token, and its tool calls count.
    assert estimate_reply("") == 1
    assert estimate_reply("", [{"name": "assess_risk", "args": {}}]) == 3 + 1


def test_a_reply_without_usage_is_estimated_and_marked(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User], settings: Any
) -> None:
    settings.AERO_LLM_REACT = False  # one extraction call
    fake_llm.set_script({"rules": [no_usage(EXTRACTION)]})
    fake_provider(fake_llm)
    session = start(make_user)

    call = LLMCall.objects.get(session=session, provider="fake")
    assert call.status == "ok" and call.tokens_estimated
    # The request (system prompt with the schema, the message) and the reply's JSON.
    assert call.tokens_in > 100 and call.tokens_out > 20
    assert call.cost > 0  # priced like reported tokens
    event = Event.objects.get(session=session, type="llm.call", payload__provider="fake")
    assert event.payload["estimated"] is True
    assert (event.payload["tokens_in"], event.payload["tokens_out"]) == (
        call.tokens_in,
        call.tokens_out,
    )
    assert (session.tokens_in, session.tokens_out, session.cost) == (
        call.tokens_in,
        call.tokens_out,
        call.cost,
    )
    assert session.snapshot["usage_estimated"] is True
    folded = fold_events(Event.objects.filter(session=session).order_by("seq"))
    assert folded.tokens_estimated and folded.tokens_in == call.tokens_in
    if settings.AERO_LLM_WAITS:
        # The runner asked for the usage chunk; the server sent none.
        assert fake_llm.requests[0]["body"]["stream_options"] == {"include_usage": True}

    client = Client()
    client.force_login(session.created_by)
    url = reverse("diagnosis:session-detail", args=[session.pk])
    page = client.get(url).content.decode()  # the tests' language: English
    assert 'data-testid="usage-estimated"' in page and "(estimated)" in page
    assert f"{call.tokens_in}/{call.tokens_out} tokens" in page
    replay = client.get(
        reverse("replay:replay-step", args=[session.pk]), {"seq": session.last_seq}
    ).content.decode()
    assert "(estimated)" in replay
    client.post(reverse("set-language"), {"language": "zh-hans", "next": url})
    page = client.get(url).content.decode()
    assert '<html lang="zh-Hans">' in page and "（估算）" in page
    token = token_for(session.created_by, "operator")
    api = api_call("GET", f"/api/v1/diagnosis-sessions/{session.pk}", token).json()
    assert api["tokens_estimated"] is True and api["tokens_in"] == call.tokens_in


def test_reported_usage_is_not_marked(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User], settings: Any
) -> None:
    settings.AERO_LLM_REACT = False
    fake_llm.set_script(
        {"rules": [{**EXTRACTION, "usage": {"prompt_tokens": 120, "completion_tokens": 30}}]}
    )
    fake_provider(fake_llm)
    session = start(make_user)

    call = LLMCall.objects.get(session=session, provider="fake")
    assert (call.tokens_in, call.tokens_out, call.tokens_estimated) == (120, 30, False)
    event = Event.objects.get(session=session, type="llm.call", payload__provider="fake")
    assert "estimated" not in event.payload
    assert "usage_estimated" not in session.snapshot
    client = Client()
    client.force_login(session.created_by)
    page = client.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert 'data-testid="usage-estimated"' not in page


def test_a_token_budget_counts_estimated_tokens(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    """The provider never reports usage; its token budget still runs out: the session
    pauses for an approver before the reasoning step that would go past it."""
    fake_llm.set_script(
        {"rules": [no_usage(EXTRACTION), *(no_usage(rule) for rule in reasoning_rules())]}
    )
    fake_provider(fake_llm, max_tokens=200)
    session = start(make_user)

    calls = list(LLMCall.objects.filter(session=session, provider="fake", status="ok"))
    assert calls and all(c.tokens_estimated and c.tokens_in > 0 for c in calls)
    spent = sum(c.tokens_in + c.tokens_out for c in calls)
    assert spent >= 200
    (exhausted,) = Event.objects.filter(session=session, type="budget.exhausted")
    assert exhausted.payload["exhausted"] == ["tokens"]
    assert exhausted.payload["spent"]["tokens"] == spent
    session = Session.objects.get(pk=session.pk)
    assert session.snapshot["budget"]["state"] == "paused"
