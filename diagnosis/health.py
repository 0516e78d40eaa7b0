"""The workers' and the LLM runners' heartbeats, as /healthz reports them (registered
with aero.health by this app)."""

from __future__ import annotations

import socket
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from aero import supervision
from aero.supervision import process_gone
from diagnosis.llm_runner.claims import BEAT_PREFIX
from diagnosis.models import WorkerBeat


def workers_checked() -> bool:
    """In production mode (REDIS_URL set) with rq workers."""
    return bool(settings.REDIS_URL) and settings.AERO_JOB_BACKEND == "rq"


def runners_checked() -> bool:
    return workers_checked() and settings.AERO_LLM_WAITS


def beat_window(interval: float) -> timedelta:
    """How old a heartbeat may be and still count: two intervals, so one beat delayed
    by a busy database does not flap /healthz. On this host a row whose process is
    gone stops counting at once, whatever its age."""
    return timedelta(seconds=2 * interval)


def _alive(rows: list[tuple[str, int, datetime, Any]], interval: float) -> list[Any]:
    """The rows of processes alive now: beaten within the window and, on this host, with
    the process still there (a worker killed a moment ago has a fresh row). Stale rows,
    from workers killed long ago or on another run, are ignored."""
    fresh = timezone.now() - beat_window(interval)
    here = socket.gethostname()
    return [
        (host, pid, extra)
        for host, pid, beat_at, extra in rows
        if beat_at >= fresh and not (host == here and process_gone(pid))
    ]


def _supervised_missing(group: str, alive: list[Any]) -> list[str]:
    """Under `make run` (supervisord): each configured process of the program `group`
    that is not running, or runs without a live heartbeat yet (just restarted: it beats
    once it is ready for work), named."""
    path = supervision.socket_path()
    if path is None:
        return []
    here = socket.gethostname()
    beating = {pid for host, pid, _ in alive if host == here}
    missing = []
    for process in supervision.processes(path):
        if process.group != group:
            continue
        if process.state != "RUNNING":
            missing.append(f"{process.name}: {process.state.lower()}")
        elif process.pid not in beating:
            missing.append(f"{process.name}: no heartbeat (pid {process.pid})")
    return missing


def _report(
    kind: str, rows: list[tuple[str, int, datetime, Any]], interval: float, group: str
) -> list[Any]:
    alive = _alive(rows, interval)
    missing = _supervised_missing(group, alive)
    if missing:
        raise RuntimeError("; ".join(missing))
    if not alive and rows:
        last = max(beat_at for _, _, beat_at, _ in rows)
        age = int((timezone.now() - last).total_seconds())
        raise RuntimeError(f"no {kind} alive (the last heartbeat was {age} s ago)")
    return alive


def workers() -> str:
    """Workers write their own heartbeat to the database (diagnosis.worker): only the
    live ones count (`_alive`), and under `make run` every configured worker must be
    one of them. None registered is reported, not failed: sessions then wait in the
    queue, visibly. Read from PostgreSQL, so a Redis outage does not hide live workers."""
    rows = list(
        WorkerBeat.objects.exclude(name__startswith=BEAT_PREFIX).values_list(
            "host", "pid", "beat_at", "session_id"
        )
    )
    alive = _report("worker", rows, settings.AERO_HEARTBEAT_SECONDS, "worker")
    if not alive:
        return "none registered"
    busy = sum(1 for _, _, session in alive if session is not None)
    return f"{len(alive)} alive, {busy} running a job"


def llm_runners() -> str:
    """The LLM runners' heartbeats: like the workers', rows in PostgreSQL written
    every AERO_LLM_CLAIM_SECONDS/4. None registered is reported, not failed (sessions
    that wait for the model then wait, visibly); registered but silent fails."""
    rows = list(
        WorkerBeat.objects.filter(name__startswith=BEAT_PREFIX).values_list(
            "host", "pid", "beat_at", "session_id"
        )
    )
    alive = _report("LLM runner", rows, settings.AERO_LLM_CLAIM_SECONDS / 4, "llmrunner")
    if not alive:
        return "none registered"
    return f"{len(alive)} alive"
