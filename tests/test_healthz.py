"""/healthz: for load balancers and the run scripts, so it needs no login."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import OperationalError
from django.test import Client

from aero import views


def test_healthz_is_ok_without_login(db: None) -> None:
    response = Client().get("/healthz")

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["ok"] is True
    assert body["checks"]["database"] == "ok"


def test_healthz_reports_a_database_outage(db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    class Down:
        def cursor(self) -> None:
            raise OperationalError("connection refused")

    monkeypatch.setattr(views, "connection", Down())

    response = Client().get("/healthz")

    assert response.status_code == 503
    body = response.json()
    assert body["ok"] is False
    assert body["checks"]["database"] == "failed: connection refused"


@pytest.mark.services
def test_healthz_checks_redis_in_production_mode(db: None, settings: Any) -> None:
    assert Client().get("/healthz").json()["checks"]["redis"] == "ok"
    settings.REDIS_URL = "redis://127.0.0.1:1/0"

    response = Client().get("/healthz")

    assert response.status_code == 503
    assert response.json()["checks"]["redis"].startswith("failed:")


@pytest.mark.services
def test_healthz_fails_when_registered_workers_stopped_beating(
    db: None, settings: Any, clean_queue: None
) -> None:
    import django_rq
    from rq.utils import utcformat
    from rq.worker import Worker

    settings.AERO_JOB_BACKEND = "rq"
    queue = django_rq.get_queue(settings.AERO_QUEUE)
    worker = Worker([queue], connection=queue.connection, name=f"healthz-{uuid.uuid4().hex}")
    worker.register_birth()
    try:
        assert Client().get("/healthz").json()["checks"]["workers"].endswith("alive")
        queue.connection.hset(
            worker.key, "last_heartbeat", utcformat(datetime.now(UTC) - timedelta(hours=1))
        )

        response = Client().get("/healthz")

        assert response.status_code == 503
        assert "none with a recent heartbeat" in response.json()["checks"]["workers"]
    finally:
        worker.register_death()
