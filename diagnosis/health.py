"""The workers' and the LLM runners' heartbeats, as /healthz reports them (registered
with aero.health by this app)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from diagnosis.llm_runner.claims import BEAT_PREFIX
from diagnosis.models import WorkerBeat


def workers_checked() -> bool:
    """In production mode (REDIS_URL set) with rq workers."""
    return bool(settings.REDIS_URL) and settings.AERO_JOB_BACKEND == "rq"


def runners_checked() -> bool:
    return workers_checked() and settings.AERO_LLM_WAITS


def workers() -> str:
    """Workers write their own heartbeat to the database (diagnosis.worker):
    one that registered must have beaten within three heartbeat intervals. None
    registered is reported, not failed: sessions then wait in the queue, visibly. Read
    from PostgreSQL, so a Redis outage does not hide live workers."""
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


def llm_runners() -> str:
    """The LLM runners' heartbeats: like the workers', rows in PostgreSQL written
    every AERO_LLM_CLAIM_SECONDS/4. None registered is reported, not failed (sessions
    that wait for the model then wait, visibly); registered but silent fails."""
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
