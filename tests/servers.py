"""Real servers for the tests: daphne (ASGI: HTTP + WebSocket) and RQ workers, each in a
subprocess against the test database and the tests' own Redis database."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_embedded(
    data_dir: Path, *args: str, timeout: float = 120, **extra: str
) -> subprocess.CompletedProcess[str]:
    """`python *args` in the embedded default (no DATABASE_URL, no REDIS_URL: SQLite,
    in-process jobs), its data in `data_dir`; `extra`: more environment."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL") and not k.startswith(("AERO_", "DJANGO_"))
    }
    env.update(AERO_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="aero.settings", **extra)
    return subprocess.run(
        [PYTHON, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def service_env(db_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AERO_", "DJANGO_"))}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "aero.settings",
            "DATABASE_URL": db_url,
            "REDIS_URL": redis_url,
            "AERO_SECRET_KEY": os.environ["AERO_SECRET_KEY"],
            "AERO_ENCRYPTION_KEYS": os.environ["AERO_ENCRYPTION_KEYS"],
            "AERO_HTTPS": "0",
            "AERO_CHANNEL_PREFIX": os.environ["AERO_CHANNEL_PREFIX"],
            "AERO_QUEUE": os.environ["AERO_QUEUE"],
            "AERO_DATA_DIR": os.environ["AERO_DATA_DIR"],  # this xdist worker's
            "PYTHONUNBUFFERED": "1",
            # As in tests/settings.py: the suite flushes its tables between tests, so a
            # head one test's server anchored would read as a cut chain in the next.
            "AERO_ANCHOR_EVERY": "0",
            # As in tests/settings.py: counted, but above what the tests send.
            **{
                f"AERO_RATE_{scope}_PER_MINUTE": "1000000"
                for scope in ("LOGIN", "ANONYMOUS", "API", "INGEST")
            },
        }
    )
    env.update(extra)
    return env


@contextmanager
def daphne(db_url: str, redis_url: str, log: Path, **extra: str) -> Iterator[str]:
    port = free_port()
    env = service_env(db_url, redis_url, **extra)
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                str(Path(PYTHON).parent / "daphne"),
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "aero.asgi:application",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_until_up(base + "/healthz", process, log)
            yield base
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def _wait_until_up(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"daphne exited early:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"daphne did not come up:\n{log.read_text()[-3000:]}")


# A worker whose agent keeps its checkpoints in memory (lost when the process exits):
# what a resume test must catch (tests/test_workers.py).
_MEMORY_CHECKPOINTER_WORKER = """
import django
django.setup()
from django.core.management import call_command
from langgraph.checkpoint.memory import InMemorySaver
from diagnosis.jobs import checkpoints
real = checkpoints._postgres_saver
checkpoints._postgres_saver = lambda: (real()[0], InMemorySaver())
call_command("aero_worker", burst=True)
"""


def run_worker_burst(
    db_url: str, redis_url: str, *, checkpointer: str = "postgres", **extra: str
) -> subprocess.CompletedProcess[str]:
    """One `manage.py aero_worker --burst` process: runs what is queued, then exits.
    checkpointer="memory": the same worker with an in-memory checkpointer. `extra`: more
    environment (settings) for the worker."""
    command = [PYTHON, "manage.py", "aero_worker", "--burst"]
    if checkpointer == "memory":
        command = [PYTHON, "-c", _MEMORY_CHECKPOINTER_WORKER]
    return subprocess.run(
        command,
        cwd=ROOT,
        env=service_env(db_url, redis_url, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
