"""LLM providers: an OpenAI-compatible endpoint (a fake one on localhost) extracts the
fields with token and cost accounting; a failing one falls back to the offline provider,
recorded, and the incident is handled all the same."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from diagnosis.actions import do_create_session
from diagnosis.models import Event, LLMCall, Session
from scenarios_admin.models import ProviderConfig, Scenario
from tests.servers import free_port

pytestmark = pytest.mark.services


class FakeOpenAI(BaseHTTPRequestHandler):
    reply: dict[str, Any] = {}
    requests: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeOpenAI.requests.append(
            {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
        )
        payload = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": json.dumps(self.reply)},
                }
            ],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def fake_openai() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), FakeOpenAI)
    FakeOpenAI.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_openai_compatible_provider_extracts_with_cost_accounting(
    builtin: None, fake_openai: str, make_user: Callable[..., User]
) -> None:
    FakeOpenAI.reply = {
        "flight_no": "CA1234",
        "position": "105",
        "fluid_type": "FUEL",
        "engine_status": "RUNNING",
        "continuous": True,
        "leak_size": "HUGE",
    }
    config = ProviderConfig(
        name="fake",
        kind="openai",
        base_url=fake_openai,
        model="fake-1",
        price_input_per_1k=Decimal("0.01"),
        price_output_per_1k=Decimal("0.02"),
    )
    config.set_api_key("sk-test-123")
    config.save()
    session = do_create_session(
        make_user("olga", "operator"),
        Scenario.objects.get(slug="oil_spill"),
        "fuel everywhere at the stand, hurry",
    )
    session.refresh_from_db()

    assert session.snapshot["risk"]["rule"] == "OS-01"
    assert session.snapshot["fields"]["leak_size"] == "UNKNOWN"  # "HUGE" is not a value: dropped
    assert session.snapshot["evidence"]["flight_no"] == "llm:fake"
    call = LLMCall.objects.get(session=session, provider="fake")
    assert (call.status, call.tokens_in, call.tokens_out) == ("ok", 120, 30)
    assert call.cost == Decimal("0.0018")
    assert (session.tokens_in, session.tokens_out, session.cost) == (120, 30, Decimal("0.0018"))
    assert FakeOpenAI.requests[0]["auth"] == "Bearer sk-test-123"
    assert FakeOpenAI.requests[0]["body"]["model"] == "fake-1"


def test_failing_provider_falls_back_to_offline(
    builtin: None, make_user: Callable[..., User]
) -> None:
    ProviderConfig.objects.create(
        name="down",
        kind="openai",
        model="m",
        retries=2,
        base_url=f"http://127.0.0.1:{free_port()}/v1",
        timeout_seconds=2,
    )
    session = do_create_session(
        make_user("olga", "operator"),
        Scenario.objects.get(slug="oil_spill"),
        "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏",
    )
    session.refresh_from_db()

    assert session.snapshot["risk"]["rule"] == "OS-01"  # the offline provider took over
    attempts = LLMCall.objects.filter(session=session).order_by("id")
    assert [(a.provider, a.status) for a in attempts] == [
        ("down", "error"),
        ("down", "error"),
        ("offline", "ok"),
    ]
    fallback = Event.objects.get(session=session, type="llm.fallback")
    assert fallback.payload["from"] == "down" and fallback.payload["to"] == "offline"
    assert "Connect" in fallback.payload["error"] or "connect" in fallback.payload["error"]


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
