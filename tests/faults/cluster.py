"""The fault suite's own services, started by the tests so they may kill them: a
PostgreSQL cluster (initdb into a temporary directory, pg_ctl on a spare port), a Redis
server on a spare port, a simulated model server, and AERO workers supervised the way a
process manager would (a dead one is replaced)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from tests.servers import PYTHON, ROOT, free_port

# Short enough that the suite runs in minutes; the fault figures are printed with it.
LEASE_SECONDS = 8
FAULT_ENV = {
    "AERO_LEASE_SECONDS": str(LEASE_SECONDS),
    "AERO_HEARTBEAT_SECONDS": "2",
    "AERO_RECONCILE_SECONDS": "2",
    "AERO_LLM_BACKOFF": "0.05",
    # The model calls run inside the jobs (the blocking design): the suite kills workers
    # in slow steps. The LLM runner's faults (a claim taken over, a node re-run) are
    # tests/test_llm_runner.py's; the runner is not in this cluster yet.
    "AERO_LLM_WAITS": "0",
    "AERO_JOB_BACKOFF": "0.2",
    "AERO_QUEUE": "aero-faults",
    "AERO_CHANNEL_PREFIX": "aero-faults",
    "AERO_SECRET_KEY": "aero-faults-not-secret",
    "AERO_ENCRYPTION_KEYS": "aero-faults-encryption-key-not-secret",
    "AERO_HTTPS": "0",
    "AERO_LOG_LEVEL": "WARNING",
    "PYTHONUNBUFFERED": "1",
    "DJANGO_SETTINGS_MODULE": "aero.settings",
}


def _pg_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if found:
        return str(found[-1])
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} not found (PostgreSQL server binaries)")
    return path


def _as_postgres(command: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as the postgres user then."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


class Postgres:
    def __init__(self, root: Path) -> None:
        self.data = root / "pgdata"
        self.log = root / "postgres.log"
        self.port = free_port()
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(root, user.pw_uid, user.pw_gid)
        subprocess.run(
            _as_postgres(
                [
                    _pg_bin("initdb"),
                    "-D",
                    str(self.data),
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
        )
        self.start()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/aero"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE aero")

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c fsync=off -k {self.data}"
        subprocess.run(
            _as_postgres(
                [
                    _pg_bin("pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-o",
                    options,
                    "-w",
                    *args,
                ]
            ),
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        self._ctl("start")

    def stop(self) -> None:
        self._ctl("stop", "-m", "fast")

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url.replace("postgres://", "postgresql://")) as conn:
            return list(conn.execute(sql, params).fetchall())


class Redis:
    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.root = root
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.root),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: self.ping(), 10, "redis-server did not start")

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.url, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()  # SIGKILL: everything in it (the queue) is lost
        self.process.wait()


def wait_until(predicate: Callable[[], Any], seconds: float, message: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(message)


class Cluster:
    """PostgreSQL + Redis + a simulated model server + AERO workers, all killable."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="aero-faults-"))
        self.postgres = Postgres(self.root)
        self.redis = Redis(self.root)
        self.logs = self.root / "logs"
        self.logs.mkdir()
        self.workers: list[subprocess.Popen[bytes]] = []
        self.started_workers = 0
        self.manage("migrate", "--no-input")
        # Every model call takes 0.2 s and fails (the provider has one attempt), so the
        # agent runs on the offline provider, deterministic, with slow steps to kill.
        script = self.root / "fake_llm.json"
        script.write_text(json.dumps({"latency": 0.2, "rules": [{"fault": "500"}]}))
        self.fake_llm_port = free_port()
        self.fake_llm = subprocess.Popen(
            [
                PYTHON,
                "manage.py",
                "fake_llm",
                "--port",
                str(self.fake_llm_port),
                "--script",
                str(script),
            ],
            cwd=ROOT,
            env=self.env(),
            stdout=(self.logs / "fake_llm.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.driver("setup", f"http://127.0.0.1:{self.fake_llm_port}/v1")

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AERO_", "DJANGO_"))}
        env.update(FAULT_ENV)
        env.update(
            DATABASE_URL=self.postgres.url,
            REDIS_URL=self.redis.url,
            AERO_DATA_DIR=str(self.root / "var"),
        )
        env.update(extra)
        return env

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [PYTHON, "manage.py", *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    def driver(self, *args: str) -> Any:
        result = subprocess.run(
            [PYTHON, "-m", "tests.faults.driver", *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    # --- workers, supervised ----------------------------------------------------------

    def start_worker(self) -> subprocess.Popen[bytes]:
        self.started_workers += 1
        log = (self.logs / f"worker-{self.started_workers}.log").open("wb")
        worker = subprocess.Popen(
            [PYTHON, "manage.py", "aero_worker"],
            cwd=ROOT,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.workers.append(worker)
        return worker

    def supervise(self, count: int) -> int:
        """Keep `count` workers running (a process manager's job): replace the dead."""
        self.workers = [w for w in self.workers if w.poll() is None]
        replaced = 0
        while len(self.workers) < count:
            self.start_worker()
            replaced += 1
        return replaced

    def stop_workers(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
        self.workers = []

    def close(self) -> None:
        self.stop_workers()
        self.fake_llm.kill()
        self.redis.kill()
        with contextlib.suppress(subprocess.CalledProcessError):
            self.postgres.stop()
        shutil.rmtree(self.root, ignore_errors=True)
