"""A worker survives a Redis outage: Redis vanishes while the worker watches a job (the
case where rq's own loop quits), the worker process waits for Redis with a backoff, and
once Redis is back it runs the next session's job. SIGTERM still stops it. While it
waits it keeps its PostgreSQL heartbeat: /healthz says Redis is down and the worker
alive."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import django_rq
import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client

from diagnosis.actions import do_create_session
from diagnosis.llm_runner import BEAT_PREFIX
from diagnosis.models import Session, WorkerBeat
from scenarios_admin.models import Scenario
from tests.fault_jobs import stop_redis_while_running
from tests.servers import PYTHON, ROOT, free_port, service_env

pytestmark = pytest.mark.services


def start_redis(port: int, log: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    client = redis.Redis(port=port)
    give_up = time.monotonic() + 10
    while time.monotonic() < give_up:
        try:
            client.ping()
            return process
        except redis.exceptions.ConnectionError:
            time.sleep(0.1)
    raise AssertionError("redis-server did not start")


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    """A Redis server of the test's own on a spare port, which the test may kill."""
    if not Path("/usr/bin/redis-server").exists():
        pytest.skip("needs redis-server")
    port = free_port()
    servers = [start_redis(port, tmp_path / "redis.log")]
    yield port, servers
    for server in servers:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_a_worker_outlives_a_redis_outage_and_runs_the_next_job(
    builtin: None,
    db_url: str,
    own_redis: tuple[int, list[subprocess.Popen[bytes]]],
    settings: Any,
    make_user: Callable[..., User],
    tmp_path: Path,
) -> None:
    port, servers = own_redis
    url = f"redis://127.0.0.1:{port}/0"
    settings.AERO_JOB_BACKEND = "rq"
    settings.RQ_QUEUES = {
        name: {"URL": url, "DEFAULT_TIMEOUT": 600}
        for name in (settings.AERO_QUEUE, settings.AERO_PRIORITY_QUEUE)
    }
    queue = django_rq.get_queue(settings.AERO_QUEUE)
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            [PYTHON, "manage.py", "aero_worker"],
            cwd=ROOT,
            env=service_env(db_url, url, AERO_HEARTBEAT_SECONDS="1"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: queue.connection.scard("rq:workers") == 1, 60, "the worker")
        queue.enqueue(stop_redis_while_running)  # Redis goes away mid-job
        wait_for(lambda: servers[0].poll() is not None, 30, "Redis to stop")
        wait_for(lambda: "trying again in" in log_path.read_text(), 30, "the worker to wait")
        time.sleep(2)  # a few backoff rounds while Redis stays down
        assert worker.poll() is None, log_path.read_text()[-3000:]

        # Alive while it waits: its heartbeat row keeps moving (every second here).
        # The worker's own row (an LLM runner started by an earlier test may beat too).
        (beat,) = WorkerBeat.objects.exclude(name__startswith=BEAT_PREFIX)
        wait_for(
            lambda: WorkerBeat.objects.filter(name=beat.name, beat_at__gt=beat.beat_at).exists(),
            5,
            "a heartbeat while Redis is down",
        )
        settings.REDIS_URL = url  # /healthz probes the Redis that is down
        health = Client().get("/healthz")
        assert health.status_code == 503
        checks = health.json()["checks"]
        assert checks["redis"].startswith("failed")
        assert checks["workers"] == "1 alive, 0 running a job"

        servers.append(start_redis(port, tmp_path / "redis.log"))
        wait_for(lambda: "starting a new worker" in log_path.read_text(), 30, "a new worker")
        oil_spill = Scenario.objects.get(slug="oil_spill")
        session = do_create_session(make_user("olga", "operator"), oil_spill, "CA1234 fuel leak")

        def asked() -> bool:
            return Session.objects.get(pk=session.pk).status == "waiting_user"

        wait_for(asked, 60, "the session's job to run")
        assert worker.poll() is None

        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_worker_lives_through_redis_refusing_writes(
    builtin: None,
    db_url: str,
    own_redis: tuple[int, list[subprocess.Popen[bytes]]],
    settings: Any,
    make_user: Callable[..., User],
    tmp_path: Path,
) -> None:
    """Redis at `maxmemory` with `noeviction` answers a ping and refuses every write: rq's
    registration raised OutOfMemoryError and the worker exited. It waits as for Redis
    down, beating to PostgreSQL meanwhile, and works once writes go through again."""
    port, _ = own_redis
    url = f"redis://127.0.0.1:{port}/0"
    settings.AERO_JOB_BACKEND = "rq"
    settings.RQ_QUEUES = {
        name: {"URL": url, "DEFAULT_TIMEOUT": 600}
        for name in (settings.AERO_QUEUE, settings.AERO_PRIORITY_QUEUE)
    }
    admin = redis.Redis(port=port)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)  # always over it: every write is refused
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        admin.set("probe", "1")
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            [PYTHON, "manage.py", "aero_worker"],
            cwd=ROOT,
            env=service_env(db_url, url, AERO_HEARTBEAT_SECONDS="1"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "OutOfMemoryError" in log_path.read_text(), 60, "the refused write")
        wait_for(lambda: "trying again in" in log_path.read_text(), 30, "the worker to wait")
        time.sleep(2)  # a few backoff rounds while Redis stays full
        assert worker.poll() is None, log_path.read_text()[-3000:]
        assert WorkerBeat.objects.exclude(name__startswith=BEAT_PREFIX).count() == 1

        admin.config_set("maxmemory", 0)
        wait_for(lambda: "starting a new worker" in log_path.read_text(), 60, "a new worker")
        oil_spill = Scenario.objects.get(slug="oil_spill")
        session = do_create_session(make_user("olga", "operator"), oil_spill, "CA1234 fuel leak")

        def asked() -> bool:
            return Session.objects.get(pk=session.pk).status == "waiting_user"

        wait_for(asked, 60, "the session's job to run")
        assert worker.poll() is None

        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
