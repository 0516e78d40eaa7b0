"""`make run` (scripts/run.sh) supervises its processes: a worker killed with kill -9 is
restarted and the web server keeps answering meanwhile; SIGTERM stops everything.

Runs the real script in production mode (PostgreSQL + Redis, gunicorn, daphne, one
worker) against a scratch database of its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from psycopg import sql

from tests.settings import TEST_DATABASE_URL, TEST_DB_NAME
from tests.test_security_production import production_env

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 180  # migrations on an empty database, the built-in data, collectstatic


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def children(pid: int) -> dict[int, str]:
    """The direct children of `pid` and their command lines (from /proc)."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        # The ppid is the second field after the parenthesised command name.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found[int(entry.name)] = cmdline
    return found


def workers_of(pid: int) -> list[int]:
    return [child for child, cmd in children(pid).items() if "aero_worker" in cmd]


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code  # 503 still means the web server answers
    except OSError:
        return 0


def wait_for(check: object, timeout: float, what: str) -> None:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if callable(check) and check():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def scratch_db() -> Iterator[tuple[str, str]]:
    """(owner URL, app URL) of an empty database, dropped afterwards with its role."""
    name = f"{TEST_DB_NAME}_run"
    role = f"{name}_app"
    admin = TEST_DATABASE_URL.rsplit("/", 1)[0] + "/postgres"
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(drop)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    owner_url = TEST_DATABASE_URL.rsplit("/", 1)[0] + f"/{name}"
    yield owner_url, owner_url.replace("postgres://postgres@", f"postgres://{role}@", 1)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(drop)
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone():
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_killed_worker_is_restarted_and_the_web_stays_up(
    scratch_db: tuple[str, str], tmp_path: Path
) -> None:
    owner_url, app_url = scratch_db
    port = free_port()
    env = production_env(owner_url, AERO_HTTPS="0")
    env.update(
        {
            "DATABASE_OWNER_URL": owner_url,
            "DATABASE_URL": app_url,
            "REDIS_URL": str(settings.REDIS_URL),
            "AERO_QUEUE": f"aero-{TEST_DB_NAME}-run",
            "AERO_CHANNEL_PREFIX": f"aero-{TEST_DB_NAME}-run",
            "AERO_ALLOWED_HOSTS": "127.0.0.1",
            "AERO_PORT": str(port),
            "AERO_WS_PORT": str(free_port()),
            "AERO_WORKERS": "1",
            "AERO_WEB_WORKERS": "1",
            "AERO_WEB_THREADS": "2",
            "AERO_DATA_DIR": str(tmp_path),
        }
    )
    log = (tmp_path / "run.log").open("w+")
    run = subprocess.Popen(
        ["bash", "scripts/run.sh"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for(lambda: healthz(port) in (200, 503), START_TIMEOUT, "the web server")
        wait_for(lambda: len(workers_of(run.pid)) == 1, 30, "the worker")
        (worker,) = workers_of(run.pid)
        # The LLM runner runs beside the workers, under the same supervisor.
        runners = [c for c, cmd in children(run.pid).items() if "aero_llm_runner" in cmd]
        assert len(runners) == 1

        os.kill(worker, signal.SIGKILL)
        answers = []
        for _ in range(6):  # the web server answers all along
            answers.append(healthz(port))
            time.sleep(0.5)
        assert 0 not in answers, answers
        wait_for(
            lambda: len(workers_of(run.pid)) == 1 and workers_of(run.pid) != [worker],
            30,
            "a new worker",
        )
        assert run.poll() is None
        (restarted,) = workers_of(run.pid)
        log.seek(0)
        assert f"worker-1 (pid {worker}) exited with status 137" in log.read()

        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == 0
        assert healthz(port) == 0  # everything it started has stopped
        assert not Path(f"/proc/{restarted}").exists()
        assert not Path(f"/proc/{runners[0]}").exists()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        log.close()
