"""LLM providers through the simulated OpenAI-compatible server over real HTTP: structured
extraction with token and cost accounting, grounding of the model's values, retries done
by tenacity (Retry-After honoured, 4xx final), the fallback chain ending offline, the
per-call timeout below the lease, one client per provider config."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from diagnosis.actions import do_answer, do_create_session
from diagnosis.agent import clients, fallback, providers, structured
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.models import Event, LLMCall, Session
from scenarios_admin.models import ProviderConfig, Scenario
from tests.builtin_data import demo_graph, oil_spill
from tests.llm_helpers import fake_llm, fake_provider
from tests.servers import free_port

__all__ = ["fake_llm"]  # the fixture

pytestmark = pytest.mark.services

EXAMPLE_ONE = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"
EXAMPLE_ONE_REPLY = {
    "flight_no": {"value": "CA1234", "quote": "CA1234"},
    "position": {"value": "105", "quote": "105机位"},
    "fluid_type": {"value": "FUEL", "quote": "燃油"},
    "engine_status": {"value": "RUNNING", "quote": "发动机仍在运转"},
    "continuous": {"value": True, "quote": "还在持续漏"},
    "leak_size": None,
}


@pytest.fixture(autouse=True)
def extraction_only(settings: Any) -> None:
    """These tests are about extraction calls; the model's reasoning steps (ReAct) are
    tests/test_react.py's."""
    settings.AERO_LLM_REACT = False


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoff waits the chain asked for, without sleeping."""
    asked: list[float] = []
    monkeypatch.setattr(fallback, "backoff_sleep", asked.append)
    return asked


def start(make_user: Callable[..., User], text: str, slug: str = "oil_spill") -> Session:
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug=slug), text
    )
    session.refresh_from_db()
    return session


def attempts(session: Session) -> list[tuple[str, str]]:
    return [(a.provider, a.status) for a in LLMCall.objects.filter(session=session).order_by("id")]


def test_structured_extraction_with_cost_accounting(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    fake_llm.set_script(
        {
            "rules": [
                {
                    "json": EXAMPLE_ONE_REPLY,
                    "usage": {"prompt_tokens": 120, "completion_tokens": 30},
                }
            ]
        }
    )
    fake_provider(fake_llm)
    session = start(make_user, EXAMPLE_ONE)

    assert session.snapshot["risk"]["rule"] == "OS-01"
    assert session.snapshot["fields"]["engine_status"] == "RUNNING"
    # Evidence is the operator's words, tied to the value by the scenario's synonyms.
    assert session.snapshot["evidence"]["continuous"] == "持续"
    call = LLMCall.objects.get(session=session, provider="fake")
    assert (call.status, call.tokens_in, call.tokens_out) == ("ok", 120, 30)
    assert call.cost == Decimal("0.0018")
    assert (session.tokens_in, session.tokens_out, session.cost) == (120, 30, Decimal("0.0018"))
    request = fake_llm.requests[0]
    assert request["auth"] == "Bearer sk-test-123"
    assert request["body"]["model"] == "fake-1"
    # Structured output: the scenario's fields as a JSON schema, enum values included.
    response_format = request["body"]["response_format"]
    assert response_format["type"] == "json_schema"
    schema_text = str(response_format["json_schema"]["schema"])
    assert "HYDRAULIC" in schema_text and "quote" in schema_text
    # The prompt is the Chinese one for a Chinese message.
    assert "逐字照抄" in request["body"]["messages"][0]["content"]


def test_invented_values_are_confirmed_not_used(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    """The model invents flight, engine and leak: none of them drives a rule; the agent
    asks the operator to confirm each P1 value it could not ground."""
    fake_llm.set_script(
        {
            "rules": [
                {
                    "match": {"call": 1},
                    "json": {
                        "flight_no": {"value": "CA1234", "quote": "flight CA1234"},
                        "position": {"value": "105", "quote": "stand 105"},
                        "fluid_type": {"value": "FUEL", "quote": "fuel everywhere"},
                        "engine_status": {"value": "RUNNING", "quote": "engines running"},
                        "continuous": {"value": True, "quote": "still leaking"},
                        "leak_size": {"value": "HUGE", "quote": "everywhere"},
                    },
                },
                {"json": {}},  # the answers state no new field
            ]
        }
    )
    fake_provider(fake_llm)
    session = start(make_user, "fuel everywhere at the stand, hurry")

    snapshot = session.snapshot
    assert snapshot["fields"]["fluid_type"] == "FUEL"  # "fuel" ties to FUEL
    assert snapshot["fields"]["leak_size"] == "UNKNOWN"  # "HUGE" is no value; no invention
    for name in ("flight_no", "position", "engine_status", "continuous"):
        assert snapshot["fields"].get(name) is None, name
    extracted = Event.objects.filter(session=session, type="fields.extracted").last()
    assert extracted is not None
    assert set(extracted.payload["pending"]) == {
        "flight_no",
        "position",
        "engine_status",
        "continuous",
    }
    assert not snapshot.get("risk")
    assert not Event.objects.filter(session=session, type="finding.recorded").exists()
    question = snapshot["question"]
    assert question["field"] == "flight_no"
    assert question["text"].startswith('Please confirm: is the flight number "CA1234"?')

    do_answer(session.pk, session.created_by, "yes")
    session.refresh_from_db()
    assert session.snapshot["fields"]["flight_no"] == "CA1234"
    assert session.snapshot["evidence"]["flight_no"] == "confirmed: yes"
    assert session.snapshot["question"]["field"] == "position"
    assert "Please confirm" in session.snapshot["question"]["text"]
    assert not session.snapshot.get("risk")


def test_rate_limit_then_success_honours_retry_after(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User], waits: list[float]
) -> None:
    fake_llm.set_script(
        {
            "rules": [
                {"fault": "429", "retry_after": 7, "times": 1},
                {"json": EXAMPLE_ONE_REPLY},
            ]
        }
    )
    fake_provider(fake_llm)
    session = start(make_user, EXAMPLE_ONE)

    assert waits == [7.0]  # what the server asked for, not the 1 s backoff
    assert attempts(session) == [("fake", "error"), ("fake", "ok")]
    error = LLMCall.objects.get(session=session, status="error").error
    assert "429" in error
    assert not Event.objects.filter(session=session, type="llm.fallback").exists()
    events = Event.objects.filter(session=session, type="llm.call").order_by("seq")
    assert [e.payload["attempt"] for e in events] == [1, 2]
    assert session.snapshot["risk"]["rule"] == "OS-01"


def test_backoff_is_exponential_with_jitter_and_then_falls_back(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User], waits: list[float]
) -> None:
    fake_llm.set_script({"rules": [{"fault": "500"}]})
    fake_provider(fake_llm, retries=3)
    session = start(make_user, EXAMPLE_ONE)

    backoff = 0.01  # AERO_LLM_BACKOFF in the test settings: 1/2/4 s scaled down
    assert len(waits) == 2
    assert backoff <= waits[0] <= backoff * 1.25
    assert 2 * backoff <= waits[1] <= 2 * backoff * 1.125
    assert attempts(session) == [("fake", "error")] * 3 + [("offline", "ok")]
    assert session.snapshot["risk"]["rule"] == "OS-01"


def test_a_refused_key_is_not_retried(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User], waits: list[float]
) -> None:
    status = 401
    fake_llm.set_script({"rules": [{"status": status}]})
    fake_provider(fake_llm, retries=3)
    session = start(make_user, EXAMPLE_ONE)

    assert waits == []
    assert attempts(session) == [("fake", "error"), ("offline", "ok")]
    assert len(fake_llm.requests) == 1
    fallback = Event.objects.get(session=session, type="llm.fallback")
    assert f"HTTP {status}" in fallback.payload["error"]


@pytest.mark.parametrize(
    ("status", "retried"),
    [(400, False), (401, False), (403, False), (404, False), (408, True), (429, True), (500, True)],
)
def test_which_http_errors_are_retried(
    fake_llm: FakeLLMServer, status: int, retried: bool, waits: list[float]
) -> None:
    fake_llm.set_script({"rules": [{"status": status, "retry_after": 3}]})
    config = ProviderConfig(
        pk=1, name="fake", kind="openai", base_url=fake_llm.url, model="fake-1", retries=3
    )
    config.updated_at = timezone.now()  # a new version of config 1: a new client
    provider = providers.OpenAICompatibleProvider(config)
    recorded: list[providers.Attempt] = []
    hops: list[tuple[str, str, str]] = []

    def call(p: providers.Provider) -> tuple[Any, providers.Usage]:
        return p.extract(oil_spill(), EXAMPLE_ONE, demo_graph(), None)

    found = fallback.call_with_fallback(
        [provider, providers.OfflineProvider()],
        "extract",
        call,
        recorded.append,
        lambda *hop: hops.append(hop),
    )
    assert found["engine_status"].value == "RUNNING"  # offline answered
    assert len(fake_llm.requests) == (3 if retried else 1)
    assert [a.status for a in recorded] == ["error"] * (3 if retried else 1) + ["ok"]
    assert all(f"HTTP {status}" in a.error for a in recorded[:-1])
    # Retry-After counts only where a retry is allowed at all.
    assert waits == ([3.0, 3.0] if retried else [])
    assert hops[0][:2] == ("fake", "offline")


def test_no_wait_runs_past_the_chain_budget(
    fake_llm: FakeLLMServer, waits: list[float], settings: Any
) -> None:
    """A Retry-After longer than what is left of the chain's budget is not waited for:
    the chain moves on at once (the incident would wait on a sleeping job)."""
    settings.AERO_LLM_BUDGET_SECONDS = 10  # attempts may start within the first 10 s
    fake_llm.set_script({"rules": [{"fault": "429", "retry_after": 15}]})  # > the budget
    config = ProviderConfig(
        pk=2, name="slow", kind="openai", base_url=fake_llm.url, model="fake-1", retries=3
    )
    config.updated_at = timezone.now()
    recorded: list[providers.Attempt] = []
    hops: list[tuple[str, str, str]] = []

    def call(p: providers.Provider) -> tuple[Any, providers.Usage]:
        return p.extract(oil_spill(), EXAMPLE_ONE, demo_graph(), None)

    fallback.call_with_fallback(
        [providers.OpenAICompatibleProvider(config), providers.OfflineProvider()],
        "extract",
        call,
        recorded.append,
        lambda *hop: hops.append(hop),
    )
    assert waits == []
    assert [(a.provider, a.status) for a in recorded] == [("slow", "error"), ("offline", "ok")]
    assert hops[0][:2] == ("slow", "offline") and "HTTP 429" in hops[0][2]


def test_outage_of_every_real_provider_falls_back_to_offline_on_the_timeline(
    whole_timeline_on_page: None,
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    waits: list[float],
) -> None:
    ProviderConfig.objects.create(
        name="down",
        kind="openai",
        model="m",
        retries=2,
        priority=1,
        base_url=f"http://127.0.0.1:{free_port()}/v1",
        timeout_seconds=2,
    )
    fake_llm.set_script({"rules": [{"fault": "500"}]})
    fake_provider(fake_llm, retries=2, priority=2)
    session = start(make_user, EXAMPLE_ONE)

    assert session.snapshot["risk"]["rule"] == "OS-01"  # the offline provider took over
    assert attempts(session) == [
        ("down", "error"),
        ("down", "error"),
        ("fake", "error"),
        ("fake", "error"),
        ("offline", "ok"),
    ]
    hops = Event.objects.filter(session=session, type="llm.fallback").order_by("seq")
    assert [(e.payload["from"], e.payload["to"]) for e in hops] == [
        ("down", "fake"),
        ("fake", "offline"),
    ]
    assert "connection refused" in hops[0].payload["error"]  # a closed port: refused
    assert "HTTP 500" in hops[1].payload["error"]

    client = Client()
    client.force_login(session.created_by)
    page = client.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert "Model provider fake failed, falling back to offline" in page


def test_invalid_json_is_an_attempt_that_failed_and_was_paid_for(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User], waits: list[float]
) -> None:
    fake_llm.set_script(
        {
            "rules": [
                {
                    "fault": "invalid_json",
                    "json": EXAMPLE_ONE_REPLY,
                    "times": 1,
                    "usage": {"prompt_tokens": 100, "completion_tokens": 10},
                },
                {
                    "json": EXAMPLE_ONE_REPLY,
                    "usage": {"prompt_tokens": 100, "completion_tokens": 40},
                },
            ]
        }
    )
    fake_provider(fake_llm)
    session = start(make_user, EXAMPLE_ONE)

    failed, ok = LLMCall.objects.filter(session=session).order_by("id")
    assert failed.status == "error" and "not valid JSON" in failed.error
    assert (failed.tokens_in, failed.tokens_out) == (100, 10)
    assert ok.status == "ok"
    assert (session.tokens_in, session.tokens_out) == (200, 50)
    assert session.snapshot["risk"]["rule"] == "OS-01"


def test_an_unparsable_http_body_is_retried(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User], waits: list[float]
) -> None:
    fake_llm.set_script(
        {"rules": [{"fault": "invalid_body", "times": 1}, {"json": EXAMPLE_ONE_REPLY}]}
    )
    fake_provider(fake_llm)
    session = start(make_user, EXAMPLE_ONE)
    assert attempts(session) == [("fake", "error"), ("fake", "ok")]


def test_a_hang_is_cut_by_a_timeout_below_the_lease(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    waits: list[float],
    settings: Any,
) -> None:
    settings.AERO_LEASE_SECONDS = 4  # a 30 s provider timeout is clamped to 3 s
    fake_llm.set_script({"rules": [{"fault": "hang"}]})
    config = fake_provider(fake_llm, retries=1, timeout_seconds=30)
    assert clients.call_timeout(config) == 3.0
    session = start(make_user, EXAMPLE_ONE)

    failed = LLMCall.objects.get(session=session, provider="fake")
    assert failed.error == "timed out"
    assert failed.latency_ms < 10_000
    assert attempts(session) == [("fake", "error"), ("offline", "ok")]


def test_one_client_per_provider_config_until_it_changes(
    builtin: None, fake_llm: FakeLLMServer
) -> None:
    config = fake_provider(fake_llm)
    first = clients.client_for(config)
    assert clients.client_for(ProviderConfig.objects.get(pk=config.pk)) is first
    config.model = "fake-2"
    config.save()
    second = clients.client_for(config)
    assert second is not first
    assert second.model_name == "fake-2"


def test_admin_never_renders_the_api_key_back(
    builtin: None, make_user: Callable[..., User]
) -> None:
    admin = User.objects.create_superuser("root", password="pw-for-tests")
    client = Client()
    client.force_login(admin)
    response = client.post(
        "/admin/scenarios_admin/providerconfig/add/",
        {
            "name": "deepseek",
            "kind": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "model": "deepseek-chat",
            "price_input_per_1k": "0.001",
            "price_output_per_1k": "0.002",
            "timeout_seconds": "30",
            "retries": "3",
            "priority": "10",
            "enabled": "on",
            "api_key": "sk-very-secret",
        },
    )
    assert response.status_code == 302
    config = ProviderConfig.objects.get(name="deepseek")
    assert config.api_key() == "sk-very-secret"
    assert "sk-very-secret" not in config.api_key_encrypted
    page = client.get(f"/admin/scenarios_admin/providerconfig/{config.pk}/change/")
    assert page.status_code == 200
    assert "sk-very-secret" not in page.content.decode()
    assert config.api_key_encrypted not in page.content.decode()
    assert not Session.objects.exists()


def test_the_reply_schema_follows_an_edited_scenario() -> None:
    # Built once per process and scenario fields: an edit is a new schema, and
    # what one caller does to its copy never reaches the next call.
    definition = copy.deepcopy(oil_spill())  # the shipped one is shared: never edited
    before = structured.response_schema(structured.extraction_model(definition))
    before["schema"]["title"] = "changed by a caller"
    again = structured.response_schema(structured.extraction_model(oil_spill()))
    assert again["schema"]["title"] != "changed by a caller"
    definition["fields"]["fluid_type"]["values"]["DEICING"] = {
        "label": {"zh": "除冰液", "en": "De-icing fluid"},
        "synonyms": ["除冰液"],
    }
    edited = structured.response_schema(structured.extraction_model(definition))
    assert "DEICING" in json.dumps(edited) and "DEICING" not in json.dumps(again)
    model = structured.extraction_model(definition)
    claims, dropped = structured.parse_reply(
        model, json.dumps({"fluid_type": {"value": "DEICING", "quote": "除冰液"}})
    )
    assert claims["fluid_type"].value == "DEICING" and dropped == []
