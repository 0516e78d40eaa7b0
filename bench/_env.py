"""What every benchmark sets before Django starts: secrets production mode insists on
(DATABASE_URL makes it production), plain HTTP, and nothing the caller's shell set for
its own AERO."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Not secret: a bench's scratch database holds nothing worth protecting. The encryption
# key is a valid Fernet key (any would do).
SECRETS = {
    "AERO_SECRET_KEY": "aero-bench-not-secret-0123456789-abcdefghijklmnopqrstuvwxyz",
    "AERO_ENCRYPTION_KEYS": "YWVyby1iZW5jaC1rZXktMzItYnl0ZXMtbG9uZy0hISE=",
    "AERO_HTTPS": "0",
}


def clean_environment() -> dict[str, str]:
    """The caller's environment without its AERO and Django settings, plus the bench's
    secrets: for a server or worker process a benchmark starts."""
    # Not the caller's PROMETHEUS_MULTIPROC_DIR: run.sh empties that folder at start.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AERO_", "DJANGO_", "PROMETHEUS_"))
    }
    env.update(SECRETS)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def in_process() -> None:
    """Settings for a benchmark that runs Django in its own process: jobs inline, no Redis
    (caches per process), a scratch data folder, the bench's secrets unless set."""
    for name, value in SECRETS.items():
        os.environ.setdefault(name, value)
    os.environ.pop("REDIS_URL", None)
    os.environ["AERO_JOB_BACKEND"] = "inline"
    os.environ.setdefault("AERO_DATA_DIR", tempfile.mkdtemp(prefix="aero-bench-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "aero.settings")


def forget_keys(redis_url: str, name: str) -> None:
    """Remove a bench's keys (its queues, registries, channel groups and cache carry
    `name`), not the whole database: a test run or a dev server may share it. rq's job
    hashes have no queue in their key and expire on their own."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        for key in client.scan_iter(match=f"*{name}*", count=1000):
            client.delete(key)
    finally:
        client.close()


def wait_listening(port: int, seconds: float = 120) -> None:
    """Until something accepts connections on 127.0.0.1:`port` (a server the bench
    started, its Django start running meanwhile beside the bench's own set-up)."""
    import socket
    import time

    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listening on port {port} after {seconds} s") from None
            time.sleep(0.05)


def migrate_and_load(python: str, root: Path, env: dict[str, str]) -> None:
    """Migrate env's database and load the built-in scenarios in one Django process, as
    `scripts/run.sh` sets up (its stamps go to env's scratch data dir; every step runs)."""
    import subprocess

    subprocess.run(
        [python, "scripts/setup_stamps.py", "run", "migrate", "load_builtin"],
        cwd=root,
        env={**env, "AERO_SETUP_ALWAYS": "1"},
        check=True,
    )
