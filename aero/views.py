from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone


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


def _workers() -> str:
    """Workers write their own heartbeat to the database (diagnosis.worker, ADR 102):
    one that registered must have beaten within three heartbeat intervals. None
    registered is reported, not failed: sessions then wait in the queue, visibly. Read
    from PostgreSQL, so a Redis outage does not hide live workers."""
    from diagnosis.llm_runner import BEAT_PREFIX
    from diagnosis.models import WorkerBeat

    rows = list(
        WorkerBeat.objects.exclude(name__startswith=BEAT_PREFIX).values_list(
            "beat_at", "session_id"
        )
    )
    if not rows:
        return "none registered"
    fresh = timezone.now() - timedelta(seconds=max(15.0, 3 * settings.AERO_HEARTBEAT_SECONDS))
    alive = [session for beat_at, session in rows if beat_at >= fresh]
    if not alive:
        raise RuntimeError(f"{len(rows)} worker(s) registered, none with a recent heartbeat")
    busy = sum(1 for session in alive if session is not None)
    return f"{len(alive)} alive, {busy} running a job"


def _llm_runner() -> str:
    """The LLM runners' heartbeats (ADR 95): like the workers', rows in PostgreSQL written
    every AERO_LLM_CLAIM_SECONDS/4. None registered is reported, not failed (sessions
    that wait for the model then wait, visibly); registered but silent fails."""
    from diagnosis.llm_runner import BEAT_PREFIX
    from diagnosis.models import WorkerBeat

    beats = list(
        WorkerBeat.objects.filter(name__startswith=BEAT_PREFIX).values_list("beat_at", flat=True)
    )
    if not beats:
        return "none registered"
    fresh = timezone.now() - timedelta(seconds=max(15.0, 3 * settings.AERO_LLM_CLAIM_SECONDS / 4))
    alive = [beat for beat in beats if beat >= fresh]
    if not alive:
        raise RuntimeError(f"{len(beats)} LLM runner(s) registered, none with a recent heartbeat")
    return f"{len(alive)} alive"


def healthz(request: HttpRequest) -> JsonResponse:
    """For load balancers and the run scripts, so it needs no login. The database always;
    Redis and the workers' heartbeats in production mode (REDIS_URL set)."""
    checks: dict[str, str] = {}
    ok = True
    probes = [("database", _database)]
    if settings.REDIS_URL:
        probes.append(("redis", _redis))
        if settings.AERO_JOB_BACKEND == "rq":
            probes.append(("workers", _workers))
            if settings.AERO_LLM_WAITS:
                probes.append(("llm_runner", _llm_runner))
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
