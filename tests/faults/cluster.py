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
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from tests.servers import PYTHON, ROOT, free_port

SERVE_MARK = "DRIVER-ANSWER "  # tests/faults/driver.py serve: the line holding an answer

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
    "AERO_SECRET_KEY": "aero-faults-not-secret-0123456789-abcdefghijklmnopqrstuvwxyz",
    "AERO_ENCRYPTION_KEYS": "aero-faults-encryption-key-not-secret",
    "AERO_HTTPS": "0",
    # INFO: the kill test reads the re-enqueues from the workers' logs (its timeline).
    "AERO_LOG_LEVEL": "INFO",
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


def answering(url: str) -> bool:
    """A server that answers HTTP at all is up (/healthz says 503 while no worker beats,
    e.g. after the kill -9 test left its killed workers' rows stale)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


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
        self.wanted_workers = 0
        self.workers_lock = threading.Lock()
        self.closing = threading.Event()
        self.supervisor: threading.Thread | None = None
        self.driver_lock = threading.Lock()
        self.driver_process: subprocess.Popen[str] | None = None
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

    @contextlib.contextmanager
    def daphne(self, name: str, **extra: str) -> Iterator[str]:
        """daphne (HTTP + WebSocket) on this cluster, its log in logs/<name>.log; yields
        its base URL. Started from the checkout's root with the cluster's environment."""
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = self.logs / f"{name}.log"
        command = [str(Path(PYTHON).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port)]
        with log.open("wb") as out:
            server = subprocess.Popen(
                [*command, "aero.asgi:application"],
                cwd=ROOT,
                env=self.env(**extra),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            try:
                wait_until(
                    lambda: server.poll() is not None or answering(base + "/healthz"),
                    180,  # generous: on a machine shared by several suites it took 60 s
                    "no daphne",
                )
            except AssertionError:
                raise AssertionError(f"no daphne: {log.read_text()[-3000:]}") from None
            assert server.poll() is None, log.read_text()[-3000:]
            yield base
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()

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

    def driver(self, *args: str, env: dict[str, str] | None = None) -> Any:
        """A command of tests/faults/driver.py, answered by the driver process kept
        running (started on first use, again if it died); with `env`, in a process of
        its own with that environment added."""
        if env is None:
            return self._served(list(args))
        result = subprocess.run(
            [PYTHON, "-m", "tests.faults.driver", *args],
            cwd=ROOT,
            env=self.env(**{"AERO_DB_POOL": "0", **(env or {})}),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    def _served(self, command: list[str]) -> Any:
        with self.driver_lock:
            if self.driver_process is None or self.driver_process.poll() is not None:
                self.driver_process = subprocess.Popen(
                    [PYTHON, "-m", "tests.faults.driver", "serve"],
                    cwd=ROOT,
                    # The driver plays many clients at once (50 approvers racing, each on
                    # its own connection), not one server process: no shared pool.
                    env=self.env(AERO_DB_POOL="0"),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=(self.logs / "driver.log").open("ab"),
                    text=True,
                )
            process = self.driver_process
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(json.dumps(command) + "\n")
            process.stdin.flush()
            while True:
                line = process.stdout.readline()
                if not line:
                    log = (self.logs / "driver.log").read_text()[-3000:]
                    raise AssertionError(f"the driver died on {command}: {log}")
                if line.startswith(SERVE_MARK):
                    break
        answer = json.loads(line[len(SERVE_MARK) :])
        if "error" in answer:
            raise AssertionError(f"driver {command}: {answer['error'][-3000:]}")
        return answer["ok"]

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
        """Keep `count` workers running (a process manager's job): replace the dead now,
        and from now on within 0.2 s of their death (a thread of the suite's own), as
        systemd's Restart=always would."""
        with self.workers_lock:
            self.wanted_workers = count
            replaced = self._replace_dead()
        if self.supervisor is None:
            self.supervisor = threading.Thread(
                target=self._supervise_forever, daemon=True, name="fault-supervisor"
            )
            self.supervisor.start()
        return replaced

    def _replace_dead(self) -> int:
        self.workers = [w for w in self.workers if w.poll() is None]  # reaps the dead
        replaced = 0
        while len(self.workers) < self.wanted_workers:
            self.start_worker()
            replaced += 1
        return replaced

    def _supervise_forever(self) -> None:
        while not self.closing.wait(0.2):
            with self.workers_lock:
                self._replace_dead()

    def stop_workers(self) -> None:
        with self.workers_lock:
            self.wanted_workers = 0  # the supervisor starts none from here
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
        self.closing.set()
        self.stop_workers()
        if self.driver_process is not None:
            self.driver_process.kill()
            self.driver_process.wait()
        self.fake_llm.kill()
        self.redis.kill()
        with contextlib.suppress(subprocess.CalledProcessError):
            self.postgres.stop()
        shutil.rmtree(self.root, ignore_errors=True)
