from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render

from aero import health, supervision


def home(request: HttpRequest) -> HttpResponse:
    return redirect("diagnosis:session-list")


def _database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return "ok"


def _redis() -> str:
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    finally:
        client.close()
    return "ok"


def _processes() -> str:
    """Under `make run`: every process supervisord is configured to run must be running
    now (not starting, backing off or exited), each missing one named. The server
    answering (daphne, or gunicorn's master of this worker) is up while it still counts
    as starting: it serves."""
    path = supervision.socket_path()
    assert path is not None
    found = supervision.processes(path)
    missing = supervision.down(found, serving={os.getpid(), os.getppid()})
    if missing:
        raise RuntimeError("; ".join(missing))
    return f"{len(found)} running: " + ", ".join(p.name for p in found)


def healthz(request: HttpRequest) -> JsonResponse:
    """For load balancers and the run scripts, so it needs no login. The database always;
    Redis and the workers' heartbeats in production mode (REDIS_URL set); every
    supervised process under `make run`."""
    checks: dict[str, str] = {}
    ok = True
    probes = [("database", _database)]
    if settings.REDIS_URL:
        probes.append(("redis", _redis))
    if supervision.socket_path():
        probes.append(("processes", _processes))
    probes.extend(health.probes())
    for name, probe in probes:
        try:
            checks[name] = probe()
        except Exception as exc:
            checks[name] = f"failed: {exc}"
            ok = False
    return JsonResponse({"ok": ok, "checks": checks}, status=200 if ok else 503)


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None, credentials: Any = None
) -> HttpResponse:
    """django-axes' lockout answer (AXES_LOCKOUT_CALLABLE): a page that says what
    happened, for how long, and who can lift it, with 429 Too Many Requests."""
    username = ""
    if isinstance(credentials, dict):
        username = str(credentials.get("username") or "")
    username = username or str(request.POST.get("username", ""))
    return render(
        request,
        "registration/locked_out.html",
        {
            "username": username[:150],
            "failure_limit": settings.AXES_FAILURE_LIMIT,
            "minutes": int(settings.AXES_COOLOFF_TIME.total_seconds() // 60),
        },
        status=429,
    )
