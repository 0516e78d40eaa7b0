"""Provider health (issue 33 item 4): a circuit breaker per provider, kept in PostgreSQL
so that every process routes by one state. Failed attempts in a row open it; an open
provider is skipped at once (no attempt, no retry), every skip is an `llm.skipped` event
and counted in `aero_llm_fallbacks`; after the cool-down one probe call goes to it, and
its success closes the breaker. Errors are classed right: a closed port is "refused",
not "timed out". Through real HTTP, with the calls made inside the job and as waits the
LLM runner answers."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from aero.models import AuditLog
from diagnosis.actions import do_create_session
from diagnosis.agent import fallback, providers
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.llm_runner import runner as runner_module
from diagnosis.models import Event, LLMCall, Session
from scenarios_admin import breaker
from scenarios_admin.models import ProviderConfig, ProviderHealth, Scenario
from tests.builtin_data import demo_graph, oil_spill
from tests.llm_helpers import fake_llm, fake_provider
from tests.servers import free_port
from tests.test_react import EXAMPLE_ONE, EXTRACTION

__all__ = ["fake_llm"]  # the fixture

pytestmark = pytest.mark.services

ANSWER = {**EXTRACTION, "usage": {"prompt_tokens": 120, "completion_tokens": 30}}


@pytest.fixture(autouse=True, params=[False, True], ids=["calls-in-the-job", "calls-as-waits"])
def model_calls(request: pytest.FixtureRequest, settings: Any) -> None:
    settings.AERO_LLM_WAITS = request.param
    settings.AERO_LLM_REACT = False  # one extraction call per session: easy to count
    settings.AERO_LLM_BREAKER_FAILURES = 2
    settings.AERO_LLM_BREAKER_COOLDOWN = 30


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoff waits, recorded instead of slept (both chains)."""
    asked: list[float] = []

    async def record(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr(runner_module, "backoff_sleep", record)
    monkeypatch.setattr(fallback, "backoff_sleep", asked.append)
    return asked


def metric(name: str, **labels: str) -> float:
    """A sample as /metrics gives it (summed over the processes)."""
    text = Client(REMOTE_ADDR="127.0.0.1").get("/metrics").content.decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def fallbacks_counted(provider: str, reason: str) -> float:
    return metric("aero_llm_fallbacks_total", provider=provider, reason=reason)


def open_session(user: User) -> Session:
    session = do_create_session(user, Scenario.objects.get(slug="oil_spill"), EXAMPLE_ONE)
    session.refresh_from_db()
    return session


def calls_of(session: Session) -> list[tuple[str, str, str]]:
    return [
        (c.provider, c.status, c.error_class)
        for c in LLMCall.objects.filter(session=session).order_by("id")
    ]


def admin_page(admin: User) -> str:
    client = Client()
    client.force_login(admin)
    return client.get("/admin/scenarios_admin/providerconfig/").content.decode()


def row_of(page: str, name: str) -> str:
    """The admin list's row of one provider (its cells up to the row's end)."""
    start = page.index(f">{name}</a>")
    return page[start : page.index("</tr>", start)]


def test_dead_providers_are_skipped_once_their_breakers_open_and_a_probe_closes_one(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    whole_timeline_on_page: None,
) -> None:
    # One provider nobody listens for (a closed port), one that hangs past its timeout.
    ProviderConfig.objects.create(
        name="refused",
        kind="openai",
        model="m",
        base_url=f"http://127.0.0.1:{free_port()}/v1",
        timeout_seconds=1,
        retries=3,
        priority=1,
    )
    fake_llm.set_script({"hang_seconds": 5, "rules": [{"fault": "hang"}]})
    fake_provider(fake_llm, name="hanging", timeout_seconds=1, retries=3, priority=2)
    admin = User.objects.create_superuser("root", password="pw-for-tests")
    olga = make_user("olga", "operator")

    # 1. Each provider fails twice (the threshold) and its breaker opens: the third
    # retry is not made, and the offline provider answers.
    first = open_session(olga)
    assert first.snapshot["risk"]["rule"] == "OS-01"
    assert calls_of(first) == [
        ("refused", "error", "refused"),
        ("refused", "error", "refused"),
        ("hanging", "error", "timeout"),
        ("hanging", "error", "timeout"),
        ("offline", "ok", ""),
    ]
    refused = LLMCall.objects.filter(session=first, provider="refused").first()
    assert refused is not None and "connection refused" in refused.error
    assert "timed out" not in refused.error
    opened = Event.objects.filter(session=first, type="llm.call", payload__breaker="opened")
    assert sorted(e.payload["provider"] for e in opened) == ["hanging", "refused"]
    assert len(fake_llm.requests) == 2
    for health in ProviderHealth.objects.all():
        assert breaker.state_of(health) == breaker.OPEN
    page = admin_page(admin)
    assert "open until" in row_of(page, "refused") and "open until" in row_of(page, "hanging")
    assert metric("aero_llm_provider_breaker", provider="refused", state="open") == 1
    root = Client()
    root.force_login(admin)
    refused_config = ProviderConfig.objects.get(name="refused")
    change = root.get(f"/admin/scenarios_admin/providerconfig/{refused_config.pk}/change/")
    assert "Circuit breaker" in change.content.decode()
    assert "open until" in change.content.decode() and "refused: connection refused" in (
        change.content.decode()
    )
    assert fallbacks_counted("refused", "failed") >= 1

    # 2. The next session: both skipped at once, no attempt, no request. (Counted from
    # here: the first session may itself skip the opened breaker on a later call.)
    skipped_before = fallbacks_counted("refused", "open")
    second = open_session(olga)
    assert second.snapshot["risk"]["rule"] == "OS-01"
    assert calls_of(second) == [("offline", "ok", "")]
    assert len(fake_llm.requests) == 2
    skips = Event.objects.filter(session=second, type="llm.skipped").order_by("seq")
    assert [(e.payload["provider"], e.payload["to"], e.payload["state"]) for e in skips] == [
        ("refused", "hanging", "open"),
        ("hanging", "offline", "open"),
    ]
    assert not Event.objects.filter(session=second, type="llm.fallback").exists()
    assert fallbacks_counted("refused", "open") == skipped_before + 1
    client = Client()
    client.force_login(second.created_by)
    timeline = client.get(f"/sessions/{second.pk}/").content.decode()
    assert "Model provider refused skipped: its circuit breaker is open" in timeline

    # 3. The cool-down is over and the hanging provider answers again: one probe each.
    # The refused one fails its probe (one attempt, no retry) and opens again; the other
    # answers and its breaker closes.
    ProviderHealth.objects.update(open_until=timezone.now() - timedelta(seconds=1))
    fake_llm.set_script({"rules": [ANSWER]})
    third = open_session(olga)
    assert calls_of(third) == [("refused", "error", "refused"), ("hanging", "ok", "")]
    assert len(fake_llm.requests) == 1
    closed = Event.objects.get(session=third, type="llm.call", payload__provider="hanging")
    assert closed.payload["breaker"] == "closed"
    hanging = ProviderHealth.objects.get(provider__name="hanging")
    assert breaker.state_of(hanging) == breaker.CLOSED and hanging.failures == 0
    again = ProviderHealth.objects.get(provider__name="refused")
    assert breaker.state_of(again) == breaker.OPEN
    page = admin_page(admin)
    assert "open until" in row_of(page, "refused")
    assert "open until" not in row_of(page, "hanging") and "closed" in row_of(page, "hanging")
    assert metric("aero_llm_provider_breaker", provider="hanging", state="closed") == 1


@pytest.mark.parametrize(
    ("script", "error_class", "words"),
    [
        ({"rules": [{"status": 404}]}, "4xx", "HTTP 404"),
        ({"rules": [{"status": 503}]}, "5xx", "HTTP 503"),
        ({"rules": [{"fault": "invalid_body"}]}, "bad_reply", "invalid response"),
        ({"hang_seconds": 3, "rules": [{"fault": "hang"}]}, "timeout", "timed out"),
        (None, "refused", "connection refused"),  # nothing listens
    ],
)
def test_error_classes(
    fake_llm: FakeLLMServer, script: dict[str, Any] | None, error_class: str, words: str
) -> None:
    url = fake_llm.url if script is not None else f"http://127.0.0.1:{free_port()}/v1"
    if script is not None:
        fake_llm.set_script(script)
    # Never saved: no breaker row, only the classes.
    config = ProviderConfig(
        pk=7, name="p", kind="openai", base_url=url, model="m", retries=1, timeout_seconds=1
    )
    recorded: list[providers.Attempt] = []

    def call(p: providers.Provider) -> tuple[Any, providers.Usage]:
        return p.extract(oil_spill(), "CA1234 在105机位燃油泄漏", demo_graph(), None)

    fallback.call_with_fallback(
        [providers.OpenAICompatibleProvider(config), providers.OfflineProvider()],
        "extract",
        call,
        recorded.append,
        lambda *hop: None,
    )
    failed = recorded[0]
    assert (failed.status, failed.error_class) == ("error", error_class)
    assert words in failed.error


def test_what_the_breaker_counts(builtin: None, fake_llm: FakeLLMServer) -> None:
    config = fake_provider(fake_llm)
    # A request the server refused as malformed says nothing about the provider.
    assert breaker.failed(config.pk, "4xx", 400, "HTTP 400: bad request", False) == ""
    assert not ProviderHealth.objects.exists()
    # A refused key, twice (the threshold here): open.
    assert breaker.failed(config.pk, "4xx", 401, "HTTP 401", False) == ""
    assert breaker.failed(config.pk, "4xx", 401, "HTTP 401", False) == breaker.OPENED
    assert not breaker.admit(config.pk, 1).allowed
    # A late failure of a call that started before: still open, not opened again.
    assert breaker.failed(config.pk, "timeout", None, "timed out", False) == breaker.OPEN
    # After the cool-down: one probe at a time.
    ProviderHealth.objects.update(open_until=timezone.now() - timedelta(seconds=1))
    probe = breaker.admit(config.pk, 5)
    assert probe.allowed and probe.probe
    other = breaker.admit(config.pk, 5)
    assert not other.allowed and other.state == breaker.HALF_OPEN
    assert breaker.succeeded(config.pk, probe) == breaker.RECLOSED
    health = ProviderHealth.objects.get()
    assert (health.failures, health.open_until, health.probe_until) == (0, None, None)
    assert breaker.admit(config.pk, 5) == breaker.Admission(True)


def test_a_successful_test_connection_closes_the_breaker(
    builtin: None, fake_llm: FakeLLMServer
) -> None:
    """The admin's "Test connection" is a probe a person makes: a provider that answers
    it is healthy again, and its breaker closes (the audit entry says so)."""
    fake_llm.set_script({"rules": [{"content": "ok"}]})
    config = fake_provider(fake_llm)
    for _ in range(2):  # the threshold in these tests
        breaker.failed(config.pk, "5xx", 503, "HTTP 503", False)
    assert breaker.state_of(ProviderHealth.objects.get()) == breaker.OPEN
    root = Client()
    root.force_login(User.objects.create_superuser("root", password="pw-for-tests"))
    response = root.post(
        "/admin/scenarios_admin/providerconfig/",
        {"action": "test_connection", "_selected_action": [config.pk]},
        follow=True,
    )
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    assert any("circuit breaker is closed again" in m for m in messages), messages
    assert breaker.state_of(ProviderHealth.objects.get()) == breaker.CLOSED
    entry = AuditLog.objects.filter(action="provider.tested").latest("pk")
    assert entry.detail["breaker_closed"] is True
