"""Server errors a person can trace: every 5xx is logged on `django.request` with its
traceback and the request's id (also in the response's X-Request-ID), and a refused
dependency (the database or Redis down) answers 503 naming it, never 500."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path

import aero.urls
from tests.servers import free_port

# This module is the URLconf of the tests that need a view that fails.
handler500 = aero.urls.handler500


def broken(request: HttpRequest) -> HttpResponse:
    raise ValueError("the view broke")


def redis_down(request: HttpRequest) -> HttpResponse:
    raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6399")


urlpatterns = [
    path("test-broken/", broken),
    path("api/v1/test-redis-down/", redis_down),
    *aero.urls.urlpatterns,
]


def formatted(record: logging.LogRecord) -> str:
    """The record as the production handler of `django.request` writes it."""
    (handler,) = logging.getLogger("django.request").handlers
    assert handler.filter(record)  # its filters: the request id, the redaction
    assert handler.formatter is not None
    return handler.formatter.format(record)


@pytest.mark.urls(__name__)
def test_a_500_is_logged_with_its_traceback_and_request_id(
    db: None, caplog: pytest.LogCaptureFixture
) -> None:
    client = Client(raise_request_exception=False)
    with caplog.at_level(logging.ERROR, logger="django.request"):
        response = client.get("/test-broken/", headers={"X-Request-ID": "trace-me-42"})
    assert response.status_code == 500
    assert response["X-Request-ID"] == "trace-me-42"
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    line = formatted(record)
    assert "[request trace-me-42]" in line
    assert "Traceback" in line and "ValueError: the view broke" in line


@pytest.mark.urls(__name__)
def test_a_request_without_an_id_gets_one(db: None) -> None:
    client = Client(raise_request_exception=False)
    first = client.get("/test-broken/", headers={"X-Request-ID": "no spaces allowed"})
    second = client.get("/test-broken/")
    ids = {first["X-Request-ID"], second["X-Request-ID"]}
    assert len(ids) == 2 and "no spaces allowed" not in ids


@pytest.mark.urls(__name__)
def test_redis_down_is_a_503_that_says_so(db: None, caplog: pytest.LogCaptureFixture) -> None:
    client = Client(raise_request_exception=False)
    with caplog.at_level(logging.ERROR, logger="django.request"):
        response = client.get("/api/v1/test-redis-down/")
    assert response.status_code == 503
    body = response.json()
    assert body["code"] == "unavailable" and "Redis" in body["message"]
    assert body["request_id"] == response["X-Request-ID"]
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    assert "ConnectionError" in formatted(record)  # logged with its traceback too


@pytest.fixture
def database_down(transactional_db: None) -> Iterator[Callable[[], None]]:
    """Point the connection at a port nobody listens on; restored afterwards."""
    port = connection.settings_dict["PORT"]

    def down() -> None:
        connection.close()
        connection.settings_dict["PORT"] = str(free_port())

    yield down
    connection.close()
    connection.settings_dict["PORT"] = port


@pytest.mark.services
def test_the_database_down_is_a_503_that_says_so(
    database_down: Callable[[], None], make_user: Callable[..., User], settings: Any
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    client = Client(raise_request_exception=False)
    client.force_login(make_user("olga", "operator"))
    token_client = Client(raise_request_exception=False)
    database_down()
    page = client.get("/sessions/")
    assert page.status_code == 503
    assert "database is not answering" in page.content.decode()
    api = token_client.get("/api/v1/diagnosis-sessions", headers={"Authorization": "Bearer x"})
    assert api.status_code == 503
    assert api.json()["code"] == "unavailable"
