"""Benchmark: how long `make run` (scripts/run.sh, embedded mode) takes until the app
answers, on a first start and on restarts with nothing changed, with the set-up steps'
stamps (the default) and with every step run (AERO_SETUP_ALWAYS=1, as before the stamps).
Two figures each: the sign-in page served (ready for a person) and /healthz 200 (all
the processes up; the web server answering counts as up before its startsecs end).
Prints numbers, asserts nothing. Uses a throw-away data directory and a free port.

  .venv/bin/python bench/restart.py [--restarts 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (urllib.error.URLError, OSError):
        return 0


def start_until_ready(data: Path, *, always: bool) -> tuple[float, float]:
    """Seconds from starting run.sh until the sign-in page is served, and until /healthz
    answers 200; then stopped."""
    port = _free_port()
    # Not the caller's PROMETHEUS_MULTIPROC_DIR: run.sh empties that folder at start.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AERO_", "DJANGO_", "PROMETHEUS_"))
    }
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env.update(
        AERO_DATA_DIR=str(data), AERO_PORT=str(port), AERO_SETUP_ALWAYS="1" if always else "0"
    )
    began = time.monotonic()
    process = subprocess.Popen(
        ["bash", "scripts/run.sh"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    page = 0.0
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"run.sh exited with {process.returncode}")
            if not page and _status(f"{base}/accounts/login/") == 200:
                page = time.monotonic() - began
            if page and _status(f"{base}/healthz") == 200:
                return page, time.monotonic() - began
            if time.monotonic() - began > 300:
                raise RuntimeError("not ready after 300 s")
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--restarts", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aero-restart-") as tmp:
        data = Path(tmp)
        page, health = start_until_ready(data, always=False)
        print(f"first start (empty data dir): page {page:.1f} s, /healthz {health:.1f} s")
        for i in range(args.restarts):
            # Alternating, so both see the same machine load.
            every = start_until_ready(data, always=True)
            stamped = start_until_ready(data, always=False)
            print(
                f"restart {i + 1}: every step: page {every[0]:.1f} s, /healthz {every[1]:.1f} s;"
                f" unchanged steps skipped: page {stamped[0]:.1f} s, /healthz {stamped[1]:.1f} s"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
