"""/healthz: for load balancers and the run scripts, so it needs no login."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError
from django.test import Client
from django.utils import timezone

from aero import supervision, views
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
    assert "no worker alive" in response.json()["checks"]["workers"]

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
    assert "no LLM runner alive" in response.json()["checks"]["llm_runner"]

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


def beat_row(pid: int, *, age: timedelta = timedelta(0), host: str | None = None) -> WorkerBeat:
    now = timezone.now()
    return WorkerBeat.objects.create(
        name=f"healthz-{uuid.uuid4().hex}",
        host=host or socket.gethostname(),
        pid=pid,
        started_at=now - age,
        beat_at=now - age,
    )


@pytest.mark.services
def test_stale_and_dead_workers_rows_are_ignored(db: None, settings: Any) -> None:
    """Rows left by workers killed long ago (or on another run) never count: not "40
    worker(s) registered", only the live ones. On this host a row whose process is gone
    stops counting at once, however fresh its beat."""
    settings.AERO_JOB_BACKEND = "rq"
    for _ in range(40):
        beat_row(4_000_000 + _, age=timedelta(minutes=10), host="old-host")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    beat_row(dead.pid)  # killed a moment ago: its beat is fresh

    response = Client().get("/healthz")
    assert response.status_code == 503
    workers = response.json()["checks"]["workers"]
    assert workers.startswith("failed: no worker alive (the last heartbeat was ")
    assert "40" not in workers

    beat_row(os.getpid())  # one live worker (this process)
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json()["checks"]["workers"] == "1 alive, 0 running a job"

    # A remote worker counts while it beats within two intervals, not after.
    beat_row(1, host="other-host", age=timedelta(seconds=settings.AERO_HEARTBEAT_SECONDS))
    assert Client().get("/healthz").json()["checks"]["workers"] == "2 alive, 0 running a job"
    WorkerBeat.objects.filter(host="other-host").update(
        beat_at=timezone.now() - timedelta(seconds=2 * settings.AERO_HEARTBEAT_SECONDS + 1)
    )
    assert Client().get("/healthz").json()["checks"]["workers"] == "1 alive, 0 running a job"


SUPERVISOR_CONF = """
[supervisord]
nodaemon=true
logfile={dir}/supervisord.log
pidfile={dir}/supervisord.pid

[unix_http_server]
file={dir}/supervisor.sock

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[program:worker]
command={python} -c "import time; time.sleep(600)"
numprocs=2
numprocs_start=1
process_name=%(program_name)s-%(process_num)d
startsecs=1
autorestart=true

[program:daphne]
command={python} -c "import time; time.sleep(600)"
startsecs=1
autorestart=false
"""


@pytest.fixture
def supervisord(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real supervisord running two stand-in workers and a stand-in daphne (sleeping
    processes), its socket exported as `make run` exports it."""
    # A unix socket's path has at most 107 bytes: a short directory.
    directory = tempfile.mkdtemp(prefix="aero-sv-", dir="/tmp")
    conf = Path(directory) / "supervisord.conf"
    conf.write_text(SUPERVISOR_CONF.format(dir=directory, python=sys.executable))
    daemon = subprocess.Popen(
        [str(Path(sys.executable).parent / "supervisord"), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    path = f"{directory}/supervisor.sock"
    try:
        wait_until(lambda: running(path, "worker-1", "worker-2", "daphne"), "supervisord")
        monkeypatch.setenv(supervision.SOCKET_ENV, path)
        yield path
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


def wait_until(check: Any, what: str, timeout: float = 30) -> None:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def running(path: str, *names: str) -> dict[str, int]:
    """{name: pid} when each named process runs, else {}."""
    try:
        found = {p.name: p for p in supervision.processes(path)}
    except OSError:
        return {}
    if all(name in found and found[name].state == "RUNNING" for name in names):
        return {name: found[name].pid for name in names}
    return {}


@pytest.mark.services
def test_every_supervised_process_is_present_or_named(
    db: None, settings: Any, supervisord: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under `make run` the configured processes are supervisord's: a killed worker is
    named at the next request (its pid is gone before supervisord even restarts it, and
    the restarted one has not beaten yet), as is a daphne that is gone."""
    settings.AERO_JOB_BACKEND = "rq"
    settings.AERO_LLM_WAITS = False
    pids = running(supervisord, "worker-1", "worker-2", "daphne")
    beat_row(pids["worker-1"])
    response = Client().get("/healthz")
    assert response.status_code == 503  # worker-2 runs but has never beaten
    assert (
        response.json()["checks"]["workers"]
        == f"failed: worker-2: no heartbeat (pid {pids['worker-2']})"
    )
    beat_row(pids["worker-2"])
    body = Client().get("/healthz").json()
    assert body["ok"] is True, body
    assert body["checks"]["processes"] == "3 running: daphne, worker-1, worker-2"
    assert body["checks"]["workers"] == "2 alive, 0 running a job"

    os.kill(pids["worker-1"], signal.SIGKILL)
    response = Client().get("/healthz")  # at once: no beat interval to wait for
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["workers"].startswith("failed: worker-1: "), checks
    assert "worker-2" not in checks["workers"]

    # Restarted by supervisord: named until the new process beats.
    wait_until(
        lambda: running(supervisord, "worker-1").get("worker-1") not in (None, pids["worker-1"]),
        "worker-1 restarted",
    )
    new_pid = running(supervisord, "worker-1")["worker-1"]
    assert Client().get("/healthz").json()["checks"]["workers"] == (
        f"failed: worker-1: no heartbeat (pid {new_pid})"
    )
    beat_row(new_pid)
    assert Client().get("/healthz").status_code == 200

    os.kill(pids["daphne"], signal.SIGKILL)
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["processes"].startswith("failed: daphne: ")
    wait_until(lambda: not running(supervisord, "daphne"), "daphne exited")
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["processes"] == "failed: daphne: exited"

    # supervisord itself gone: nothing can be vouched for.
    monkeypatch.setenv(supervision.SOCKET_ENV, supervisord + ".missing")
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["processes"].startswith("failed: ")


def test_the_server_answering_is_up_while_supervisord_still_counts_it_starting(
    db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """supervisord calls a web server RUNNING only after its startsecs (long, so that one
    crashing while it loads the app ends FATAL): the server answering /healthz is up
    already; any other process starting is named."""
    settings.REDIS_URL = ""
    settings.AERO_JOB_BACKEND = "embedded"
    monkeypatch.setenv(supervision.SOCKET_ENV, "/nonexistent/supervisor.sock")
    found = [supervision.Process("daphne", "daphne", "STARTING", os.getpid())]
    monkeypatch.setattr(supervision, "processes", lambda path, timeout=2.0: found)
    response = Client().get("/healthz")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"]["processes"] == "1 running: daphne"

    found.append(supervision.Process("gunicorn", "gunicorn", "STARTING", os.getpid() + 10**6))
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["processes"] == "failed: gunicorn: starting"

    # Starting is not "in backoff": a server that keeps failing is named as before.
    found[:] = [supervision.Process("daphne", "daphne", "BACKOFF", 0)]
    assert Client().get("/healthz").json()["checks"]["processes"] == "failed: daphne: backoff"
