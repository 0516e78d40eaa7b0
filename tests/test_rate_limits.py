"""Rate limits (issue 29, items 3 and 6): sign-ins, the posts of visitors not signed in,
the API and the ingest answer 429 with Retry-After past their limit per client and
minute, and a flood of signed-out posts cannot grow the session table without bound."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse

from aero import ratelimit
from aero.drafts import ANONYMOUS_MAX_FIELDS
from aero.text import MAX_MESSAGE
from tests.api_helpers import call, token_for

LIMITS = {"login": 3, "anonymous": 10, "api": 5, "ingest": 3}


@pytest.fixture(autouse=True)
def low_limits() -> Iterator[None]:
    with override_settings(AERO_RATE_LIMITS=LIMITS):
        yield


def an_address() -> str:
    """Counters live in Redis for a minute: each test counts from an address of its own."""
    return f"10.{random.randrange(256)}.{random.randrange(256)}.{random.randrange(1, 255)}"


def refused(response: object, seconds: int = 60) -> bool:
    status = getattr(response, "status_code", 0)
    if status != 429:
        return False
    retry_after = int(response["Retry-After"])  # type: ignore[index]
    return 1 <= retry_after <= seconds


def assert_problem(response: Any, path: str) -> None:
    """An RFC 9457 problem, as every other API error is, with the wait in it."""
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == "urn:aero:problem:throttled"
    assert (body["status"], body["title"], body["code"]) == (429, "Too Many Requests", "throttled")
    assert body["instance"] == path and body["request_id"] == response["X-Request-ID"]
    assert body["retry_after"] == int(response["Retry-After"])
    assert response["Retry-After"] in body["detail"]


def test_sign_ins_per_address(db: None, make_user: Callable[..., User]) -> None:
    make_user("olga", "operator")
    here, there = an_address(), an_address()
    for _ in range(LIMITS["login"]):
        assert (
            Client(REMOTE_ADDR=here).post("/accounts/login/", {"username": "x"}).status_code == 200
        )

    over = Client(REMOTE_ADDR=here).post(
        "/accounts/login/", {"username": "olga", "password": "pw-for-tests"}
    )

    assert refused(over)
    assert over["Content-Type"].startswith("text/html")  # a page a person reads
    page = over.content.decode()
    assert 'data-testid="error-page"' in page and "429" in page
    assert f"Try again in {over['Retry-After']} second" in page
    assert "default-src 'self'" in over["Content-Security-Policy"]  # as every page
    assert (
        Client(REMOTE_ADDR=there)
        .post("/accounts/login/", {"username": "olga", "password": "pw-for-tests"})
        .status_code
        == 302
    )


def _sessions() -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), coalesce(sum(length(session_data)), 0) FROM django_session"
        )
        count, size = cursor.fetchone()
    return int(count), int(size)


def test_a_flood_of_signed_out_posts_keeps_the_session_table_bounded(db: None) -> None:
    address = an_address()
    # Random characters: the session store compresses what repeats.
    big = {
        f"field{n}": "".join(chr(random.randrange(0x4E00, 0x9FFF)) for _ in range(16_000))
        for n in range(8)
    }
    before_rows, before_size = _sessions()

    began = time.time()
    answers = [
        Client(REMOTE_ADDR=address).post(reverse("diagnosis:session-create"), big).status_code
        for _ in range(100)
    ]
    # The flood may straddle the end of a minute: each minute has its own count.
    allowed = LIMITS["anonymous"] * (int(time.time()) // 60 - int(began) // 60 + 1)

    rows, size = _sessions()
    assert answers.count(302) <= allowed  # to sign in, the draft kept
    assert answers.count(429) >= 100 - allowed
    assert rows - before_rows <= allowed
    # Each kept draft is one form's text at most (signed, base64: about 3 x 4/3 bytes a
    # Chinese character), not 8 fields of 16,000.
    per_row = (size - before_size) / max(1, rows - before_rows)
    assert per_row < ANONYMOUS_MAX_FIELDS * MAX_MESSAGE * 3 * 4 / 3 * 1.1


def test_a_signed_in_persons_posts_are_not_anonymous(
    db: None, make_user: Callable[..., User]
) -> None:
    client = Client(REMOTE_ADDR=an_address())
    client.force_login(make_user("olga", "operator"))
    for _ in range(LIMITS["anonymous"] + 2):
        response = client.post(reverse("diagnosis:session-create"), {"message": ""})
        assert response.status_code != 429


def test_api_calls_per_token(db: None, make_user: Callable[..., User]) -> None:
    user = make_user("olga", "operator")
    mine, theirs = token_for(user, name="mine"), token_for(user, name="theirs")
    for _ in range(LIMITS["api"]):
        assert call("GET", "/api/v1/diagnosis-sessions", mine).status_code == 200

    over = call("GET", "/api/v1/diagnosis-sessions", mine)

    assert refused(over)
    assert_problem(over, "/api/v1/diagnosis-sessions")
    assert call("GET", "/api/v1/diagnosis-sessions", theirs).status_code == 200


def test_ingest_deliveries_per_source(db: None) -> None:
    secret = {"X-Aero-Ingest-Secret": f"source-{random.random()}"}
    for _ in range(LIMITS["ingest"]):
        assert call("POST", "/ingest/alerts", body={}, headers=secret).status_code != 429

    over = call("POST", "/ingest/alerts", body={}, headers=secret)

    assert refused(over)
    assert_problem(over, "/ingest/alerts")


def test_the_window_and_its_retry_after() -> None:
    client = an_address()
    start = float((int(time.time()) // 60 + 1) * 60)  # the next window's start
    for n in range(LIMITS["ingest"]):
        assert ratelimit.hit("ingest", client, now=start + n) is None
    assert ratelimit.hit("ingest", client, now=start + 45.5) == 15
    assert ratelimit.hit("ingest", client, now=start + 60) is None  # the next window
    assert ratelimit.hit("unknown-scope", client) is None
