"""/healthz: for load balancers and the run scripts, so it needs no login."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError
from django.test import Client
from django.utils import timezone

from aero import views
from diagnosis.models import WorkerBeat
from diagnosis.worker import WorkerHeartbeat


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
def test_healthz_reads_the_workers_own_heartbeats(db: None, settings: Any) -> None:
    settings.AERO_JOB_BACKEND = "rq"
    assert Client().get("/healthz").json()["checks"]["workers"] == "none registered"
    beats = WorkerHeartbeat(f"healthz-{uuid.uuid4().hex}")
    beats.beat()
    assert Client().get("/healthz").json()["checks"]["workers"] == "1 alive, 0 running a job"

    # The worker stopped beating (killed): its row goes stale.
    WorkerBeat.objects.update(beat_at=timezone.now() - timedelta(minutes=5))
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert "none with a recent heartbeat" in response.json()["checks"]["workers"]

    # Redis down does not hide a live worker: the heartbeat is in the database.
    beats.session_id = str(uuid.uuid4())
    beats.beat()
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    body = Client().get("/healthz").json()
    assert body["checks"]["workers"] == "1 alive, 1 running a job"
    assert body["checks"]["redis"].startswith("failed:")

    beats.stop()  # a worker that exits removes its row
    assert not WorkerBeat.objects.exists()


def test_healthz_reads_the_llm_runners_heartbeat(db: None, settings: Any) -> None:
    """The runner beats like a worker and is reported on its own line: a live
    runner is no live worker, and a silent one fails the check."""
    from diagnosis import llm_runner

    settings.AERO_JOB_BACKEND = "rq"
    settings.AERO_LLM_WAITS = True
    body = Client().get("/healthz").json()
    assert body["checks"]["llm_runner"] == "none registered"
    name = f"{llm_runner.BEAT_PREFIX}healthz-{uuid.uuid4().hex}"
    llm_runner.beat(name, timezone.now())
    body = Client().get("/healthz").json()
    assert body["checks"]["llm_runner"] == "1 alive"
    assert body["checks"]["workers"] == "none registered"

    WorkerBeat.objects.filter(name=name).update(beat_at=timezone.now() - timedelta(minutes=5))
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert "none with a recent heartbeat" in response.json()["checks"]["llm_runner"]

    settings.AERO_LLM_WAITS = False  # calls inside the jobs: no runner to check
    assert "llm_runner" not in Client().get("/healthz").json()["checks"]


def test_the_shared_test_server_leaves_no_llm_runner_beating(
    transactional_db: None, asgi_server: str
) -> None:
    """The daphne the live tests share lives for the whole run: an LLM runner in it beat
    into this database for every later test (the heartbeat tests counted it). It runs
    none; the streaming test's own server has one, stopped with that test."""
    from diagnosis import llm_runner

    WorkerBeat.objects.filter(name__startswith=llm_runner.BEAT_PREFIX).delete()
    # A runner beats every AERO_LLM_CLAIM_SECONDS / 4 (5 s by default).
    time.sleep(6)
    assert not WorkerBeat.objects.filter(name__startswith=llm_runner.BEAT_PREFIX).exists()
