"""Secrets stay secret (issue 7, item 3): a provider's key never follows a changed URL,
"Test connection" never reads a body out, keys are encrypted with rotatable MultiFernet
keys that production mode must be given, and a key a provider echoes back appears in no
record, log, page or export."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.test import Client
from pytest_django.fixtures import Settings

from aero.models import AuditLog
from aero.redact import redact, redact_error
from diagnosis.models import Event, LLMCall, Report
from scenarios_admin.models import ProviderConfig
from tests.admin_helpers import admin_client
from tests.settings import TEST_DATABASE_URL, TEST_DB_NAME
from tests.web_helpers import approve_everything, login, waiting_session

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parent.parent
CHANGELIST = "/admin/scenarios_admin/providerconfig/"
SECRET = "sk-live-AbCdEf0123456789-topsecret"


class Echo:
    """An endpoint that refuses every key and quotes it back, headers and all (`quote`
    words the message from the key it was sent)."""

    requests: list[dict[str, Any]]

    def __init__(self, quote: Callable[[str], str] | None = None) -> None:
        self.requests = []
        self.quote = quote or (lambda key: f"Incorrect API key provided: {key}")
        echo = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                auth = self.headers.get("Authorization") or ""
                echo.requests.append({"path": self.path, "auth": auth})
                data = json.dumps(
                    {
                        "error": {
                            "message": echo.quote(auth[7:]),
                            "headers": {"Authorization": auth},
                            "internal": "db-password=hunter2 from the internal service",
                        }
                    }
                ).encode()
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


@pytest.fixture
def echo() -> Iterator[Echo]:
    server = Echo()
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.server.shutdown()


@pytest.fixture
def root(builtin: None) -> Client:
    return admin_client(User.objects.create_superuser("root", password="pw-for-tests"))


def provider(url: str, key: str = SECRET, **extra: Any) -> ProviderConfig:
    config = ProviderConfig(name="echo", kind="openai", base_url=url, model="m", **extra)
    config.set_api_key(key)
    config.save()
    return config


def change(client: Client, config: ProviderConfig, **values: Any) -> Any:
    data = {
        "name": config.name,
        "kind": config.kind,
        "base_url": config.base_url,
        "model": config.model,
        "price_input_per_1k": "0",
        "price_output_per_1k": "0",
        "timeout_seconds": "5",
        "retries": "1",
        "priority": "100",
        "enabled": "on",
        **values,
    }
    return client.post(f"{CHANGELIST}{config.pk}/change/", data, follow=True)


def press_test_connection(client: Client, config: ProviderConfig) -> list[str]:
    response = client.post(
        CHANGELIST, {"action": "test_connection", "_selected_action": [config.pk]}, follow=True
    )
    return [str(m) for m in get_messages(response.wsgi_request)]


# --- the key follows no URL change ---------------------------------------------------


def test_changing_the_url_clears_the_stored_key_and_says_so(root: Client, echo: Echo) -> None:
    config = provider(echo.url)
    form_page = root.get(f"{CHANGELIST}{config.pk}/change/").content.decode()
    assert "Changing it clears the stored API key" in form_page

    moved = change(root, config, base_url="http://127.0.0.1:9/elsewhere")
    assert "the base URL changed, so the stored API key was cleared" in moved.content.decode()
    config.refresh_from_db()
    assert config.api_key_encrypted == ""
    # "Test connection" now sends no key at all (to the saved URL only).
    press_test_connection(root, config)

    back = change(root, config, base_url=echo.url)
    assert back.status_code == 200
    press_test_connection(root, config)
    assert [r["auth"] for r in echo.requests] == [""]


def test_a_key_given_with_the_new_url_is_kept(root: Client, echo: Echo) -> None:
    config = provider("http://127.0.0.1:9/old")
    change(root, config, base_url=echo.url, api_key="sk-new-key-for-the-new-url")
    config.refresh_from_db()
    assert config.api_key() == "sk-new-key-for-the-new-url"
    # Other edits keep the key.
    change(root, config, model="m2")
    config.refresh_from_db()
    assert config.api_key() == "sk-new-key-for-the-new-url"


def test_test_connection_shows_status_and_class_never_the_body(root: Client, echo: Echo) -> None:
    config = provider(echo.url)
    assert press_test_connection(root, config) == [
        "echo: failed: HTTP 401: the API key was refused"
    ]
    assert echo.requests == [{"path": "/v1/chat/completions", "auth": f"Bearer {SECRET}"}]
    entry = AuditLog.objects.get(action="provider.tested")
    assert SECRET not in json.dumps(entry.detail) and "hunter2" not in json.dumps(entry.detail)


# --- encryption keys ------------------------------------------------------------------


def test_first_key_encrypts_all_keys_decrypt_and_rotate_keys_moves_to_the_first(
    db: None, settings: Settings
) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.AERO_ENCRYPTION_KEYS = [old]
    config = provider("http://127.0.0.1:9/v1")
    token = config.api_key_encrypted
    assert SECRET not in token
    assert Fernet(old.encode()).decrypt(token.encode()).decode() == SECRET

    settings.AERO_ENCRYPTION_KEYS = [new, old]  # a new key put first
    config.refresh_from_db()
    assert config.api_key() == SECRET  # the old key still decrypts
    out = io.StringIO()
    call_command("rotate_keys", stdout=out)
    assert out.getvalue() == "Re-encrypted 1 provider key(s) with the first key.\n"
    config.refresh_from_db()
    assert config.api_key_encrypted != token
    settings.AERO_ENCRYPTION_KEYS = [new]  # the old key removed
    assert config.api_key() == SECRET
    assert AuditLog.objects.filter(action="secrets.rotated").count() == 1


def test_rotate_keys_refuses_when_a_key_was_removed_too_early(db: None, settings: Settings) -> None:
    settings.AERO_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    config = provider("http://127.0.0.1:9/v1")
    token = config.api_key_encrypted
    settings.AERO_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    with pytest.raises(CommandError, match="provider echo: its API key cannot be decrypted"):
        call_command("rotate_keys")
    config.refresh_from_db()
    assert config.api_key_encrypted == token


def settings_in_subprocess(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AERO_", "DJANGO_"))}
    clean.pop("DATABASE_URL", None)
    clean.update({"AERO_DATA_DIR": str(tmp_path), **env})
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'aero.settings'; "
            "django.setup(); from django.conf import settings; "
            "print(len(settings.AERO_ENCRYPTION_KEYS))",
        ],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_database_url() -> str:
    """This run's test database (tests/settings.py), not a fixed name: the settings
    subprocess connects to nothing, but a second run's servers may hold any other name."""
    url = urllib.parse.urlsplit(TEST_DATABASE_URL)
    return url._replace(path=f"/{TEST_DB_NAME}").geturl()


def test_production_mode_refuses_to_start_without_its_secrets(tmp_path: Path) -> None:
    db = run_database_url()
    no_secret = settings_in_subprocess(tmp_path, DATABASE_URL=db, AERO_ENCRYPTION_KEYS="k")
    assert no_secret.returncode != 0
    assert "AERO_SECRET_KEY must be set in production mode" in no_secret.stderr
    no_keys = settings_in_subprocess(tmp_path, DATABASE_URL=db, AERO_SECRET_KEY=STRONG)
    assert no_keys.returncode != 0
    assert "AERO_ENCRYPTION_KEYS must be set in production mode" in no_keys.stderr
    assert not (tmp_path / "secret_key").exists() and not (tmp_path / "encryption_keys").exists()
    fernet = Fernet.generate_key().decode()
    both = settings_in_subprocess(
        tmp_path, DATABASE_URL=db, AERO_SECRET_KEY=STRONG, AERO_ENCRYPTION_KEYS=f"{fernet},{STRONG}"
    )
    assert both.returncode == 0, both.stderr
    assert both.stdout.strip() == "2"


STRONG = "Zq3-vT8kP1xW9mR4nB6yH2cJ7fL5dG0sA-eU1iO8rK3wQ6tY9pM2"


@pytest.mark.parametrize(
    "weak",
    [
        {"AERO_SECRET_KEY": "s" * 50},  # long, one character
        {"AERO_SECRET_KEY": "changeme"},
        {"AERO_SECRET_KEY": "django-insecure-" + STRONG},
        {"AERO_ENCRYPTION_KEYS": "secret"},
        {"AERO_ENCRYPTION_KEYS": f"{Fernet.generate_key().decode()},{'a' * 36}"},
        {"AERO_AUDIT_KEY": "audit"},
    ],
)
def test_production_mode_refuses_weak_keys(tmp_path: Path, weak: dict[str, str]) -> None:
    env = {
        "DATABASE_URL": run_database_url(),
        "AERO_SECRET_KEY": STRONG,
        "AERO_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
        **weak,
    }
    started = settings_in_subprocess(tmp_path, **env)
    assert started.returncode != 0
    assert f"{next(iter(weak))}" in started.stderr and "is too weak" in started.stderr


def test_embedded_mode_generates_its_keys_into_the_data_dir(tmp_path: Path) -> None:
    first = settings_in_subprocess(tmp_path)
    assert first.returncode == 0, first.stderr
    keys = tmp_path / "encryption_keys"
    assert (keys.stat().st_mode & 0o777) == 0o600
    assert (tmp_path / "secret_key").exists()
    generated = keys.read_text()
    Fernet(generated.strip().encode())  # a real Fernet key
    assert settings_in_subprocess(tmp_path).returncode == 0
    assert keys.read_text() == generated  # kept across restarts


# --- an echoed key appears nowhere ----------------------------------------------------


def test_an_echoed_key_is_in_no_record_log_page_or_export(
    root: Client,
    echo: Echo,
    make_user: Callable[..., User],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    provider(echo.url, retries=1)
    olga = make_user("olga", "operator")
    abel = make_user("abel", "approver")
    with caplog.at_level(logging.INFO):
        session = waiting_session(olga)
        approve_everything(session, abel)
        press_test_connection(root, ProviderConfig.objects.get())
    assert echo.requests and all(r["auth"] == f"Bearer {SECRET}" for r in echo.requests)
    fallback = Event.objects.filter(session=session, type="llm.fallback").first()
    assert fallback is not None and "[redacted]" in fallback.payload["error"]

    haystacks: dict[str, str] = {
        "events": json.dumps([e.payload for e in Event.objects.all()], ensure_ascii=False),
        "llm calls": json.dumps([c.error for c in LLMCall.objects.all()], ensure_ascii=False),
        "audit": json.dumps([a.detail for a in AuditLog.objects.all()], ensure_ascii=False),
        "report": "".join(r.markdown for r in Report.objects.all()),
        "log records": caplog.text,
        "stderr": capfd.readouterr().err,
    }
    auditor = login(make_user("cora", "auditor"))
    for url in (
        f"/sessions/{session.pk}/",
        f"/sessions/{session.pk}/events/",
        f"/sessions/{session.pk}/report.md",
    ):
        haystacks[url] = auditor.get(url).content.decode()
    for url in (
        f"{CHANGELIST}{ProviderConfig.objects.get().pk}/change/",
        "/admin/diagnosis/llmcall/",
        f"/admin/diagnosis/llmcall/{LLMCall.objects.filter(status='error').first().pk}/change/",  # type: ignore[union-attr]
        "/admin/diagnosis/event/",
        "/admin/aero/auditlog/",
    ):
        haystacks[url] = root.get(url).content.decode()
    haystacks["404 page"] = root.get("/sessions/not-a-session/").content.decode()
    leaks = [where for where, text in haystacks.items() if SECRET in text]
    assert leaks == []
    assert ProviderConfig.objects.get().api_key() == SECRET  # still usable


# Nothing about it looks like a key: only knowing the provider's key finds it.
PLAIN_KEY = "Zq8vR2-plain-words-0123456789"


def key_forms(key: str) -> dict[str, str]:
    """The key as an error body may quote it."""
    b64 = base64.b64encode(key.encode()).decode()
    return {
        "as is": key,
        "reversed": key[::-1],
        "base64": b64,
        "base64 unpadded": b64.rstrip("="),
        "base64url": base64.urlsafe_b64encode(key.encode()).decode().rstrip("="),
        "base64 reversed": base64.b64encode(key[::-1].encode()).decode(),
        "hex": key.encode().hex(),
        "percent": urllib.parse.quote(key, safe=""),
        "basic": base64.b64encode(f"user:{key}".encode()).decode(),
        "inside base64": base64.b64encode(json.dumps({"key": key}).encode()).decode(),
    }


@pytest.fixture
def encoding_echo() -> Iterator[Echo]:
    def quote(key: str) -> str:
        return "Key refused. " + " ".join(
            f"{name}: {form}" for name, form in key_forms(key).items()
        )

    server = Echo(quote)
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.server.shutdown()


def test_a_key_echoed_in_any_encoding_reaches_no_viewer(
    root: Client,
    encoding_echo: Echo,
    make_user: Callable[..., User],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A provider quoting its key back as is, reversed, in base64 (standard, URL-safe,
    unpadded, inside a longer encoded text, as Basic credentials), hex or percent-encoded:
    viewers of the session see the error's class and a short redacted text, never one of
    those forms; nor do the records and logs."""
    provider(encoding_echo.url, key=PLAIN_KEY, retries=1)
    olga = make_user("olga", "operator")
    with caplog.at_level(logging.INFO):
        session = waiting_session(olga)
    assert encoding_echo.requests  # the key was sent, and echoed
    fallback = Event.objects.filter(session=session, type="llm.fallback").first()
    assert fallback is not None
    error = fallback.payload["error"]
    assert error.startswith("HTTP 401: Key refused.") and "[redacted]" in error
    assert len(error) <= 200 + len("… (9999 characters in all)")

    haystacks: dict[str, str] = {
        "events": json.dumps([e.payload for e in Event.objects.all()], ensure_ascii=False),
        "llm calls": json.dumps([c.error for c in LLMCall.objects.all()], ensure_ascii=False),
        "log records": caplog.text,
    }
    for user in (olga, make_user("cora", "auditor")):
        for url in (f"/sessions/{session.pk}/", f"/sessions/{session.pk}/events/"):
            haystacks[f"{url} as {user.username}"] = login(user).get(url).content.decode()
    leaks = [
        (where, name)
        for where, text in haystacks.items()
        for name, form in key_forms(PLAIN_KEY).items()
        if form in text
    ]
    assert leaks == []


def test_redact_finds_the_key_in_every_encoding() -> None:
    for name, form in key_forms(PLAIN_KEY).items():
        assert redact(f"error: {form}.", [PLAIN_KEY]) == "error: [redacted].", name
    # An opaque token in an error text is nobody's business either; words stay.
    assert redact_error("id 8203a97c-c156-4aed-b948-5538bbe57593: basic auth") == (
        "id [redacted]: basic auth"
    )


def test_redact_removes_key_shaped_text() -> None:
    assert redact("Bearer abc.def-123 and sk-abcdefgh1234") == "Bearer [redacted] and [redacted]"
    assert (
        redact('{"api_key": "zzz"} x-api-key: yyy')
        == '{"api_key": "[redacted]"} x-api-key: [redacted]'
    )
    assert redact("my key is hunter2-xyz", ["hunter2-xyz"]) == "my key is [redacted]"
