"""Prometheus metrics every process updates (web, daphne, rq workers and their forked jobs).

prometheus-client runs in multi-process mode (settings set PROMETHEUS_MULTIPROC_DIR before
anything imports it): each process writes its own files and /metrics sums them. Only what
happens inside a process is counted here; what the database already knows (sessions by
status, LLM usage, approval waits, gate outcomes) is computed at scrape time by the
collectors in api/metrics.py, so it is exact across processes and restarts.

The helpers below are one-line calls for other modules and never raise: a metric must not
break the thing it measures.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from datetime import datetime

from django.utils import timezone
from prometheus_client import Counter, Histogram

logger = logging.getLogger("aero.metrics")

# Seconds, from a few ms (same host) to a minute (a client far behind).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
JOB_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

EVENT_PUSH = Counter(
    "aero_event_push",
    "Live-push notices handed to the channel layer after commit, by outcome.",
    ["outcome"],
)
EVENTS_DELIVERED = Counter(
    "aero_ws_events_sent",
    "Events sent to WebSocket clients, by stream (page or api).",
    ["stream"],
)
WS_CONNECTS = Counter(
    "aero_ws_connects",
    "WebSocket connections accepted, by stream; kind=reconnect when the client resumed "
    "from a last_seq above 0.",
    ["stream", "kind"],
)
WS_REFUSED = Counter(
    "aero_ws_refused", "WebSocket connections refused (no access), by stream.", ["stream"]
)
COMMIT_TO_SEND = Histogram(
    "aero_event_commit_to_send_seconds",
    "Time from an event's commit to its send on a WebSocket (live sends, not catch-up).",
    ["stream"],
    buckets=LATENCY_BUCKETS,
)
LIVE_RENDERS = Counter(
    "aero_live_renders",
    "Live session fragments: rendered in this process, or fetched as another process "
    "rendered them (source=shared).",
    ["source"],
)
LIVE_WRITES = Counter(
    "aero_live_frames",
    "Live session frames sent to page sockets: framed once per fan-out and, under daphne, "
    "written to the socket at once (path=direct) or to its transport's buffer "
    "(path=buffered, data already waiting), else through the ASGI send (path=asgi).",
    ["path"],
)
JOB_DURATION = Histogram(
    "aero_job_duration_seconds",
    "Duration of one job advancing a session, by the status it left the session in.",
    ["outcome"],
    buckets=JOB_BUCKETS,
)
ENQUEUE_FAILED = Counter(
    "aero_enqueue_failed",
    "Jobs not enqueued after a committed change because the queue was unreachable (the "
    "reconciler enqueues them later).",
)
OUTBOX_ATTEMPTS = Counter(
    "aero_outbox_attempts",
    "Calls to external systems made from the outbox, by outcome (ok, retry, failed).",
    ["outcome"],
)
API_CALLS = Counter(
    "aero_api_requests", "REST API calls, by method and HTTP status.", ["method", "status"]
)


def _safe(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception:  # pragma: no cover - metrics never break the caller
        logger.warning("metric update failed", exc_info=True)


def push_outcome(ok: bool) -> None:
    _safe(lambda: EVENT_PUSH.labels("ok" if ok else "failed").inc())


def ws_connected(stream: str, last_seq: int) -> None:
    kind = "reconnect" if last_seq > 0 else "new"
    _safe(lambda: WS_CONNECTS.labels(stream, kind).inc())


def ws_refused(stream: str) -> None:
    _safe(lambda: WS_REFUSED.labels(stream).inc())


def events_sent(stream: str, count: int, live_since: list[datetime] | None = None) -> None:
    """`live_since`: commit times of events sent because of a notice (not catch-up)."""

    def record() -> None:
        EVENTS_DELIVERED.labels(stream).inc(count)
        now = timezone.now()
        for ts in live_since or ():
            COMMIT_TO_SEND.labels(stream).observe(max(0.0, (now - ts).total_seconds()))

    _safe(record)


def live_renders(rendered: int, shared: int) -> None:
    if rendered:
        _safe(lambda: LIVE_RENDERS.labels("rendered").inc(rendered))
    if shared:
        _safe(lambda: LIVE_RENDERS.labels("shared").inc(shared))


def live_frames(direct: int, buffered: int, asgi: int) -> None:
    if direct:
        _safe(lambda: LIVE_WRITES.labels("direct").inc(direct))
    if buffered:
        _safe(lambda: LIVE_WRITES.labels("buffered").inc(buffered))
    if asgi:
        _safe(lambda: LIVE_WRITES.labels("asgi").inc(asgi))


def enqueue_failed() -> None:
    _safe(ENQUEUE_FAILED.inc)


def outbox_attempt(outcome: str) -> None:
    _safe(lambda: OUTBOX_ATTEMPTS.labels(outcome).inc())


def job_finished(outcome: str, seconds: float) -> None:
    _safe(lambda: JOB_DURATION.labels(outcome).observe(seconds))


def timed_job(job: Callable[[str], str]) -> Callable[[str], str]:
    """Decorator for the job function: its duration by the status it returned (or
    "error"). functools.wraps keeps the dotted name RQ enqueues it by."""

    @functools.wraps(job)
    def timed(session_id: str) -> str:
        started = time.monotonic()
        outcome = "error"
        try:
            outcome = job(session_id)
            return outcome
        finally:
            job_finished(str(outcome), time.monotonic() - started)

    return timed


# Any client may send any method name: only these become label values, the rest "other",
# so no caller can grow the series without bound.
API_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"})


def api_call(method: str, status: int) -> None:
    label = method if method in API_METHODS else "other"
    _safe(lambda: API_CALLS.labels(label, str(status)).inc())


# Model providers: label values are the names of the configured providers (set by
# administrators, a handful), a fixed set of reasons, error classes and transitions.
LLM_FALLBACKS = Counter(
    "aero_llm_fallbacks",
    "Model calls moved on from a provider to the next one (the offline provider last), by "
    "the provider left and why: failed (its attempts failed) or open (skipped at once: "
    "its circuit breaker is open).",
    ["provider", "reason"],
)
LLM_ATTEMPT_ERRORS = Counter(
    "aero_llm_attempt_errors",
    "Failed model call attempts, by provider and error class (refused, timeout, "
    "connection, 4xx, 5xx, bad_reply, other).",
    ["provider", "error_class"],
)
LLM_BREAKER = Counter(
    "aero_llm_breaker_transitions",
    "Provider circuit breakers opened or closed, by provider.",
    ["provider", "to"],
)
FALLBACK_REASONS = frozenset({"failed", "open"})
ERROR_CLASSES = frozenset({"refused", "timeout", "connection", "4xx", "5xx", "bad_reply"})


def llm_fallback(provider: str, reason: str) -> None:
    label = reason if reason in FALLBACK_REASONS else "failed"
    _safe(lambda: LLM_FALLBACKS.labels(provider[:80], label).inc())


def llm_attempt_failed(provider: str, error_class: str) -> None:
    label = error_class if error_class in ERROR_CLASSES else "other"
    _safe(lambda: LLM_ATTEMPT_ERRORS.labels(provider[:80], label).inc())


def llm_breaker(provider: str, change: str) -> None:
    """`change`: what a call did to the breaker ("opened", "closed"; "" or "open": nothing)."""
    if change in ("opened", "closed"):
        _safe(lambda: LLM_BREAKER.labels(provider[:80], change).inc())
