"""Production is safe by default (issue 7, item 4): no demo users, `check --deploy` clean,
sign-in locked per user and address, sessions that expire when idle."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session as DjangoSession
from django.db import connection
from django.test import Client
from django.utils import timezone

from aero.sessions import RENEW_AFTER_SECONDS, RENEWED_KEY

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "pw-for-tests"


def production_env(db_url: str, **extra: str) -> dict[str, str]:
    # Not the caller's PROMETHEUS_MULTIPROC_DIR: run.sh empties that folder at start.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AERO_", "DJANGO_", "PROMETHEUS_"))
    }
    env.pop("REDIS_URL", None)
    env.update(
        {
            "DATABASE_URL": db_url,
            "AERO_SECRET_KEY": secrets.token_urlsafe(50),
            "AERO_ENCRYPTION_KEYS": "aero-tests-encryption-key-not-secret",
            "AERO_ALLOWED_HOSTS": "aero.example.org",
            "AERO_DATA_DIR": str(ROOT / "var" / "test"),
            **extra,
        }
    )
    return env


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.services
def test_check_deploy_is_clean_with_production_settings(db_url: str) -> None:
    clean = check_deploy(production_env(db_url))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "System check identified no issues" in clean.stdout
    # Plain http for a local run is a choice, and the check says what it costs.
    plain = check_deploy(production_env(db_url, AERO_HTTPS="0"))
    assert plain.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in plain.stderr


def run_setup(db_url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """`scripts/run.sh --setup-only` in production mode: everything before the servers.
    It runs as the app's own role (DATABASE_URL) beside the owner: run.sh migrates and
    grants as the owner, then seeds (or not) as the app. The role is dropped after."""
    role = f"{connection.settings_dict['NAME']}_runapp"
    env = production_env(db_url, **extra)  # without AERO_HTTPS: served over https
    env["DATABASE_OWNER_URL"] = db_url
    env["DATABASE_URL"] = db_url.replace("postgres://postgres@", f"postgres://{role}@", 1)
    try:
        return subprocess.run(
            ["bash", "scripts/run.sh", "--setup-only"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            if cursor.fetchone():
                cursor.execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')


@pytest.mark.services
def test_production_mode_run_script_seeds_no_demo_users(
    transactional_db: None, db_url: str
) -> None:
    run = run_setup(db_url, AERO_HTTPS="0")

    assert run.returncode == 0, run.stdout + run.stderr
    assert "Production mode: no demo users are created" in run.stdout
    assert "Demo users" not in run.stdout
    assert not User.objects.filter(username__in=["admin", "operator", "approver"]).exists()


@pytest.mark.services
def test_production_over_https_refuses_a_superuser_owner(
    transactional_db: None, db_url: str
) -> None:
    """Served over https, run.sh refuses to grant with a SUPERUSER owner (it could switch
    the audit triggers off); a plain-http try-out (the test above) is only warned."""
    run = run_setup(db_url)

    assert run.returncode != 0
    assert "is a superuser" in run.stderr, run.stdout + run.stderr
    assert "Set up" not in run.stdout


# --- sign-in rate limit ---------------------------------------------------------------


def sign_in(username: str, password: str, address: str) -> tuple[int, str]:
    response = Client(REMOTE_ADDR=address).post(
        "/accounts/login/", {"username": username, "password": password}
    )
    return response.status_code, response.content.decode()


def test_sign_in_locks_a_username_at_an_address_after_repeated_failures(
    make_user: Callable[..., User],
) -> None:
    make_user("olga", "operator", password=PASSWORD)
    limit = settings.AXES_FAILURE_LIMIT
    for _ in range(limit - 1):
        status, page = sign_in("olga", "wrong", "10.0.0.1")
        assert status == 200 and "did not match" in page
    assert sign_in("olga", "wrong", "10.0.0.1")[0] == 429  # the limit-th failure locks
    status, page = sign_in("olga", PASSWORD, "10.0.0.1")  # even the right password
    assert status == 429
    assert "Too many failed sign-ins for <strong>olga</strong> from this address" in page
    assert f"signing in is locked for {settings.AXES_COOLOFF_TIME.seconds // 60} minutes" in page
    # Not the username elsewhere (tests/test_lockout.py), nor another user there.
    assert sign_in("olga", PASSWORD, "10.0.1.1")[0] == 302
    make_user("abel", "approver", password=PASSWORD)
    assert sign_in("abel", PASSWORD, "10.0.0.1")[0] == 302


def test_a_success_resets_the_count(make_user: Callable[..., User]) -> None:
    make_user("olga", "operator", password=PASSWORD)
    for _ in range(2):
        for _ in range(settings.AXES_FAILURE_LIMIT - 1):
            assert sign_in("olga", "wrong", "10.0.0.1")[0] == 200
        assert sign_in("olga", PASSWORD, "10.0.0.1")[0] == 302


# --- idle sessions --------------------------------------------------------------------


def test_sessions_expire_after_the_idle_time_and_requests_renew_them(
    alice: User, django_assert_max_num_queries: Callable[..., Any]
) -> None:
    assert settings.SESSION_COOKIE_AGE == 120 * 60  # AERO_SESSION_IDLE_MINUTES default
    client = Client()
    client.force_login(alice)
    key = client.cookies["sessionid"].value
    soon = timezone.now() + timedelta(minutes=1)

    # Renewed at sign-in: a request in the first minute writes nothing.
    DjangoSession.objects.filter(pk=key).update(expire_date=soon)
    assert client.get("/sessions/").status_code == 200
    assert DjangoSession.objects.get(pk=key).expire_date == soon

    # A minute later a request restarts the idle clock.
    store = SessionStore(session_key=key)
    store[RENEWED_KEY] = int(time.time()) - RENEW_AFTER_SECONDS
    store.save()
    DjangoSession.objects.filter(pk=key).update(expire_date=soon)
    assert client.get("/sessions/").status_code == 200
    assert DjangoSession.objects.get(pk=key).expire_date > timezone.now() + timedelta(minutes=100)

    # Idle past the expiry: signed out.
    DjangoSession.objects.filter(pk=key).update(expire_date=timezone.now() - timedelta(seconds=1))
    response = client.get("/sessions/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
