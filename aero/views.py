from __future__ import annotations

from datetime import UTC, timedelta

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
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
    """RQ workers that registered must have sent a heartbeat within their TTL. None
    registered is reported, not failed: sessions then wait in the queue, visibly."""
    import django_rq
    from rq.worker import Worker

    queue = django_rq.get_queue(settings.AERO_QUEUE)
    workers = Worker.all(queue=queue)
    if not workers:
        return "none registered"
    now = timezone.now()
    alive = [
        w
        for w in workers
        if w.last_heartbeat is not None
        and now - w.last_heartbeat.replace(tzinfo=w.last_heartbeat.tzinfo or UTC)
        <= timedelta(seconds=w.worker_ttl + 60)
    ]
    if not alive:
        raise RuntimeError(f"{len(workers)} worker(s) registered, none with a recent heartbeat")
    return f"{len(alive)} alive"


def healthz(request: HttpRequest) -> JsonResponse:
    """For load balancers and the run scripts, so it needs no login. The database always;
    Redis and the RQ workers' heartbeats in production mode (REDIS_URL set)."""
    checks: dict[str, str] = {}
    ok = True
    probes = [("database", _database)]
    if settings.REDIS_URL:
        probes.append(("redis", _redis))
        if settings.AERO_JOB_BACKEND == "rq":
            probes.append(("workers", _workers))
    for name, probe in probes:
        try:
            checks[name] = probe()
        except Exception as exc:
            checks[name] = f"failed: {exc}"
            ok = False
            if name == "redis":
                break  # the worker check needs Redis too
    return JsonResponse({"ok": ok, "checks": checks}, status=200 if ok else 503)
