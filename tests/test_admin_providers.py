"""Provider configs in admin: the API key is write-only and encrypted with the key from
the environment; "Test connection" calls the configured OpenAI-compatible endpoint (a
fake one on 127.0.0.1 here) and reports success or the exact error."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client
from pytest_django.fixtures import Settings

from aero.models import AuditLog
from scenarios_admin.models import ProviderConfig
from scenarios_admin.probe import NO_ANSWER
from tests.admin_helpers import admin_client, staff_with
from tests.servers import free_port

pytestmark = pytest.mark.services
CHANGELIST = "/admin/scenarios_admin/providerconfig/"


@dataclass
class Endpoint:
    url: str
    status: int = 200
    body: str = ""
    hang: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    state = Endpoint(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(
                {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
            )
            if state.hang:
                state.release.wait(10)
                return
            data = state.body.encode()
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in state.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    state.release.set()
    server.shutdown()


def completion(model: str) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
        }
    )


@pytest.fixture
def root(db: None) -> Client:
    return admin_client(User.objects.create_superuser("root", password="pw-for-tests"))


def provider(base_url: str, *, key: str = "sk-test-123", timeout: float = 5) -> ProviderConfig:
    config = ProviderConfig(
        name="fake", kind="openai", base_url=base_url, model="fake-1", timeout_seconds=timeout
    )
    config.set_api_key(key)
    config.save()
    return config


def press_test_connection(client: Client, *configs: ProviderConfig) -> list[str]:
    response = client.post(
        CHANGELIST,
        {"action": "test_connection", "_selected_action": [c.pk for c in configs]},
        follow=True,
    )
    assert response.status_code == 200
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_a_working_endpoint(root: Client, endpoint: Endpoint) -> None:
    endpoint.body = completion("fake-1-0613")
    config = provider(endpoint.url)
    assert 'value="test_connection"' in root.get(CHANGELIST).content.decode()

    [message] = press_test_connection(root, config)

    # The configured model: the answer's own "model" text is the endpoint's, not shown.
    assert message.startswith("fake: OK: model fake-1 answered in ")
    assert message.endswith(" ms, 12 + 1 tokens")
    [request] = endpoint.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["auth"] == "Bearer sk-test-123"
    assert request["body"]["model"] == "fake-1"
    entry = AuditLog.objects.get(action="provider.tested")
    assert (entry.actor_label, entry.object_id, entry.detail["ok"]) == (
        "root",
        str(config.pk),
        True,
    )


def test_a_rejected_key_reports_a_classified_error_never_the_body(
    root: Client, endpoint: Endpoint
) -> None:
    endpoint.status = 401
    endpoint.body = json.dumps(
        {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}
    )

    assert press_test_connection(root, provider(endpoint.url)) == [
        "fake: failed: HTTP 401: the API key was refused"
    ]
    assert AuditLog.objects.get(action="provider.tested").detail["ok"] is False


@pytest.fixture
def not_http() -> Iterator[str]:
    """A port where something that is not HTTP listens (it greets and hangs up)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/v1"
    stop.set()
    thread.join(timeout=5)
    server.close()


@pytest.mark.parametrize("kind", ["closed", "not HTTP", "silent", "no such host", "unroutable"])
def test_test_connection_answers_the_same_for_every_unreachable_target(
    root: Client,
    endpoint: Endpoint,
    not_http: str,
    kind: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No port oracle: a closed port, a service that is not HTTP, one that never answers,
    a name that does not resolve and an address nothing routes to read the same on the
    page, after the same wait (the provider's whole timeout); only the server log says
    which it was."""
    endpoint.hang = True
    url = {
        "closed": f"http://127.0.0.1:{free_port()}/v1",
        "not HTTP": not_http,
        "silent": endpoint.url,
        "no such host": "http://no-such-host.invalid/v1",
        "unroutable": "http://192.0.2.1:8443/v1",  # TEST-NET-1: reaches nothing
    }[kind]
    timeout = 0.5
    started = time.monotonic()

    with caplog.at_level(logging.WARNING, logger="scenarios_admin.probe"):
        [message] = press_test_connection(root, provider(url, timeout=timeout))

    assert message == f"fake: failed: {NO_ANSWER}"
    assert time.monotonic() - started >= timeout  # a refusal waits as long as silence
    assert "test connection of provider fake" in caplog.text  # the cause, for the operator
    assert "sk-test-123" not in caplog.text


def test_test_connection_goes_only_to_the_base_urls_own_host(
    root: Client, endpoint: Endpoint
) -> None:
    """A redirect is not followed (not even to the same host), and a URL naming another
    host before an @ (read as the host by people, as credentials by HTTP clients) is not
    tested at all."""
    endpoint.status = 307
    endpoint.headers = {"Location": endpoint.url + "/elsewhere/chat/completions"}
    config = provider(endpoint.url)

    assert press_test_connection(root, config) == [
        "fake: failed: HTTP 307: a redirect (not followed)"
    ]
    assert [r["path"] for r in endpoint.requests] == ["/v1/chat/completions"]

    port = endpoint.url.split(":")[2].split("/")[0]
    config.base_url = f"http://api.openai.com@127.0.0.1:{port}/v1"
    config.save()
    [message] = press_test_connection(root, config)
    assert message.startswith("fake: failed: the base URL is not tested")
    assert len(endpoint.requests) == 1  # nothing sent


def test_an_endpoint_that_is_not_openai_compatible(root: Client, endpoint: Endpoint) -> None:
    endpoint.body = json.dumps({"status": "healthy"})

    assert press_test_connection(root, provider(endpoint.url)) == [
        "fake: failed: HTTP 200: the answer is not an OpenAI-compatible chat completion"
    ]


def test_the_offline_provider_needs_no_connection(root: Client) -> None:
    offline = ProviderConfig.objects.create(name="local", kind="offline")
    assert press_test_connection(root, offline) == [
        "local: OK: the offline provider needs no connection"
    ]


def test_the_key_is_encrypted_with_the_environments_key(
    root: Client, endpoint: Endpoint, settings: Settings
) -> None:
    settings.AERO_ENCRYPTION_KEYS = ["key-one"]
    config = provider(endpoint.url, key="sk-very-secret")
    assert "sk-very-secret" not in config.api_key_encrypted
    page = root.get(f"{CHANGELIST}{config.pk}/change/").content.decode()
    assert "sk-very-secret" not in page and config.api_key_encrypted not in page

    settings.AERO_ENCRYPTION_KEYS = ["key-two"]  # the environment's key changed

    assert press_test_connection(root, config) == [
        "fake: failed: the stored API key: secret cannot be decrypted with the configured key"
    ]
    assert endpoint.requests == []


def test_only_admins_who_may_change_providers_test_them(
    db: None, endpoint: Endpoint, make_user: Callable[..., User]
) -> None:
    config = provider(endpoint.url)
    olga = admin_client(make_user("olga", "operator"))
    refused = olga.post(CHANGELIST, {"action": "test_connection", "_selected_action": [config.pk]})
    assert refused.status_code == 302 and refused["Location"].startswith("/admin/login/")

    viewer = admin_client(staff_with("vic", "view_providerconfig"))
    assert 'value="test_connection"' not in viewer.get(CHANGELIST).content.decode()
    press_test_connection(viewer, config)
    assert endpoint.requests == []
    assert not AuditLog.objects.filter(action="provider.tested").exists()
