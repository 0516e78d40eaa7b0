"""`make run` (scripts/run.sh) supervises its processes with supervisord: processes
killed with kill -9, however close together, are restarted; a web server that cannot
start stops the run; SIGTERM stops everything.

Runs the real script in production mode (PostgreSQL + Redis, gunicorn, daphne, two
workers, the LLM runner) against a scratch database of its own."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from psycopg import sql

from aero import supervision
from tests.settings import TEST_DATABASE_URL, TEST_DB_NAME
from tests.test_security_production import production_env

# One worker runs both tests, one after the other: the second finds the first's set-up
# stamps in the module's data directory (run_data) and skips what they cover.
pytestmark = [pytest.mark.services, pytest.mark.xdist_group("run_supervisor")]
ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 300  # migrations on an empty database, the built-in data, collectstatic, app load


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


def supervised(run: int) -> dict[str, list[int]]:
    """The processes supervisord (run.sh's child) runs, by program."""
    (supervisor,) = [pid for pid, cmd in children(run).items() if "supervisord" in cmd]
    found: dict[str, list[int]] = {}
    for pid, cmd in children(supervisor).items():
        for name, mark in PROGRAMS.items():
            if mark in cmd:
                found.setdefault(name, []).append(pid)
    return found


PROGRAMS = {
    "worker": "aero_worker",
    "llmrunner": "aero_llm_runner",
    "daphne": "bin/daphne",
    "gunicorn": "bin/gunicorn",
}


def descendants(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return found


def stop(run: subprocess.Popen[Any]) -> None:
    """Stop the script as a person would (SIGTERM: supervisord stops its programs); if
    that fails, kill everything under it, so no worker outlives the test."""
    if run.poll() is None:
        everything = descendants(run.pid)
        run.send_signal(signal.SIGTERM)
        try:
            run.wait(timeout=90)
        except subprocess.TimeoutExpired:
            everything += descendants(run.pid)
            run.kill()
            run.wait()
        for pid in everything:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def all_up(run: int, before: dict[str, list[int]]) -> bool:
    """Every program runs again, each killed one under a new pid."""
    now = supervised(run)
    return all(len(now.get(name, [])) == len(pids) for name, pids in before.items())


def healthz(port: int) -> int:
    return health_report(port)[0]


def health_report(port: int) -> tuple[int, dict[str, str]]:
    """/healthz's status and checks (0 and none when nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return int(response.status), json.loads(response.read())["checks"]
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["checks"]  # 503 still means it answers
    except OSError:
        return 0, {}


def wait_for(check: object, timeout: float, what: str) -> None:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if callable(check) and check():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
def run_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data directory of the module's runs, on its one scratch database: a later run
    skips the set-up steps whose stamps match (migrate, load_builtin, collectstatic), as
    a restart does; the web server that cannot start comes after them, as before."""
    return tmp_path_factory.mktemp("run-data")


def run_env(db: tuple[str, str], data: Path, port: int, ws_port: int) -> dict[str, str]:
    owner_url, app_url = db
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
            "AERO_WS_PORT": str(ws_port),
            "AERO_WORKERS": "2",
            "AERO_WEB_WORKERS": "1",
            "AERO_WEB_THREADS": "2",
            "AERO_DATA_DIR": str(data),
        }
    )
    return env


def test_killed_processes_are_restarted_however_close_together(
    scratch_db: tuple[str, str], run_data: Path, tmp_path: Path
) -> None:
    """Two processes killed 0.3 s apart, then three: all back within the backoff, each
    exit logged; SIGTERM stops everything."""
    port = free_port()
    env = run_env(scratch_db, run_data, port, free_port())
    log = (tmp_path / "run.log").open("a+")  # appends: several processes write to it
    run = subprocess.Popen(
        ["bash", "scripts/run.sh"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for(lambda: healthz(port) in (200, 503), START_TIMEOUT, "the web server")
        wait_for(
            lambda: (
                {k: len(v) for k, v in supervised(run.pid).items()}
                == {"worker": 2, "llmrunner": 1, "daphne": 2, "gunicorn": 1}
            ),
            30,
            "every program",
        )
        # Every configured process runs and beats: /healthz says so.
        wait_for(lambda: healthz(port) == 200, 60, "/healthz 200")
        status, checks = health_report(port)
        assert checks["processes"].startswith("7 running: "), checks  # the listener too
        assert checks["workers"] == "2 alive, 0 running a job", checks
        before = supervised(run.pid)
        names = {
            p.pid: p.name
            for p in supervision.processes(str(run_data / "supervisor" / "supervisor.sock"))
        }
        killed: list[int] = []
        for group in (
            [before["worker"][0], before["daphne"][0]],
            [before["worker"][1], before["llmrunner"][0], before["gunicorn"][0]],
        ):
            for pid in group:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                time.sleep(0.3)
            if len(killed) == 2:
                # Within one beat, at the next request: the killed worker and daphne are
                # named (gone, or restarted and not yet beating / starting).
                status, checks = health_report(port)
                assert status == 503, checks
                assert checks["workers"].startswith(f"failed: {names[killed[0]]}: "), checks
                assert re.search(r"daphne-\d: ", checks["processes"]), checks
            # supervisord restarts a process that had run at once; 15 s covers a slow start.
            wait_for(lambda seen=before: all_up(run.pid, seen), 15, "every program back")
            assert not set(killed) & {p for pids in supervised(run.pid).values() for p in pids}
            before = supervised(run.pid)
        wait_for(lambda: healthz(port) == 200, 60, "/healthz 200 again: all back and beating")
        assert run.poll() is None
        log.seek(0)
        text = log.read()
        for name in ("worker-1", "worker-2", r"daphne-\d", "llmrunner", "gunicorn"):
            exited = f"exited: {name} \\(terminated by SIGKILL; not expected\\)"
            assert re.search(exited, text), name
        survivors = [p for pids in supervised(run.pid).values() for p in pids]

        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=90) == 0
        assert healthz(port) == 0  # everything it started has stopped
        assert not [p for p in survivors if Path(f"/proc/{p}").exists()]
    except BaseException:
        log.seek(0)
        print(log.read()[-12000:])  # the supervisor's story, in the failure's report
        raise
    finally:
        stop(run)
        log.close()


def test_a_web_server_that_cannot_start_stops_the_run(
    scratch_db: tuple[str, str], run_data: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        env = run_env(scratch_db, run_data, port, free_port())
        # One try: each of the 3 retries ran gunicorn's 5 s of binding again and waited
        # a longer backoff (28 of the test's 44 s); what ends the run is the FATAL.
        env["AERO_WEB_START_RETRIES"] = "0"
        run = subprocess.Popen(
            ["bash", "scripts/run.sh"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = run.communicate(timeout=START_TIMEOUT)
        finally:
            stop(run)
    assert run.returncode == 1, out + err
    assert "gunicorn could not start: stopping AERO" in err
