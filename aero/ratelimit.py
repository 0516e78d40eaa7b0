"""Request rate limits: sign-in, anonymous posts, the API and the ingest, each per
client and per minute (AERO_RATE_LIMITS), answered with 429 and Retry-After.

A fixed one-minute window counted in Redis (shared by every web process; in-process in
embedded mode, which has one). Redis unreachable: requests go through, as the rest of
the site works without it; the sign-in stays guarded by the lockout (django-axes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from axes.helpers import get_client_ip_address
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.utils import translation
from django.utils.csp import CSP, LazyNonce, build_policy

from aero.i18n import request_language

logger = logging.getLogger(__name__)

WINDOW_SECONDS = 60
LOGIN_PATHS = ("/accounts/login/", "/admin/login/")
API_PREFIX = "/api/v1/"
INGEST_PREFIX = "/ingest/"

_client: redis.Redis | None = None
_local: dict[str, int] = {}
_local_lock = threading.Lock()
_last_warning = 0.0


_client_lock = threading.Lock()


def _redis() -> redis.Redis:
    """One client per process, made once: two threads' first requests each making one
    left the loser to the garbage collector, whose close disconnected the connections
    the other thread was using (a 500 from a burst of requests at start)."""
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                _client = redis.Redis.from_url(
                    settings.REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5
                )
    return _client


def _count(key: str, window_end: int) -> int:
    if not settings.REDIS_URL:
        with _local_lock:
            now = time.time()
            for stale in [k for k in _local if int(k.rsplit(":", 1)[1]) <= now]:
                del _local[stale]
            _local[key] = _local.get(key, 0) + 1
            return _local[key]
    pipe = _redis().pipeline()
    pipe.incr(key)
    pipe.expireat(key, window_end + 1)
    count, _ = pipe.execute()
    return int(count)


def hit(scope: str, client: str, now: float | None = None) -> int | None:
    """Count one request of `client` in `scope`: None if it is within the limit, else
    the seconds until the window ends (its Retry-After)."""
    limit = settings.AERO_RATE_LIMITS.get(scope, 0)
    if limit <= 0:
        return None
    now = time.time() if now is None else now
    window_end = (int(now) // WINDOW_SECONDS + 1) * WINDOW_SECONDS
    key = f"{settings.AERO_CHANNEL_PREFIX}:rate:{scope}:{client}:{window_end}"
    try:
        count = _count(key, window_end)
    except redis.RedisError:
        global _last_warning
        if time.monotonic() - _last_warning > 60:
            _last_warning = time.monotonic()
            logger.warning("rate limits off: Redis unreachable", exc_info=True)
        return None
    if count <= limit:
        return None
    return max(1, math.ceil(window_end - now))


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:24]


def scope_of(request: HttpRequest) -> tuple[str, str] | None:
    """Which limit a request counts against, and as which client: the API and the ingest
    by the credential they send (else the address), sign-ins and the posts of visitors
    not signed in by address."""
    path = request.path
    address = get_client_ip_address(request) or "unknown"
    if path.startswith((API_PREFIX, INGEST_PREFIX)):
        credential = request.headers.get("Authorization") or request.headers.get(
            "X-Aero-Ingest-Secret", ""
        )
        who = f"key-{_digest(credential)}" if credential else f"addr-{address}"
        return ("api" if path.startswith(API_PREFIX) else "ingest"), who
    if request.method != "POST":
        return None
    if path in LOGIN_PATHS:
        return "login", address
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return None
    return "anonymous", address


# RFC 9457, the shape the API's own problems have (api.errors: the kernel imports no app).
PROBLEM = "application/problem+json"
THROTTLED_TYPE = "urn:aero:problem:throttled"


def too_many(request: HttpRequest, retry_after: int) -> HttpResponse:
    """429 with Retry-After: an RFC 9457 problem for the API and the ingest, a page in
    the visitor's language for everything else."""
    response: HttpResponse
    if request.path.startswith((API_PREFIX, INGEST_PREFIX)):
        detail = f"Too many requests: try again in {retry_after} seconds."
        body = {
            "type": THROTTLED_TYPE,
            "title": "Too Many Requests",
            "status": 429,
            "detail": detail,
            "instance": request.path,
            "code": "throttled",
            "message": detail,
            "request_id": str(getattr(request, "request_id", "") or ""),
            "retry_after": retry_after,
        }
        response = HttpResponse(json.dumps(body), status=429, content_type=PROBLEM)
    else:
        # Before the language and CSP middleware (a refusal costs no more than its
        # count): the visitor's language and the site's policy, applied here.
        nonce = LazyNonce()
        request._csp_nonce = nonce  # type: ignore[attr-defined]  # what the CSP context reads
        with translation.override(request_language(request)):
            html = render_to_string("429.html", {"retry_after": retry_after}, request=request)
        response = HttpResponse(html, status=429)
        response[CSP.HEADER_ENFORCE] = build_policy(settings.SECURE_CSP, nonce)
    response["Retry-After"] = str(retry_after)
    return response


class RateLimitMiddleware:
    """After the authentication middleware (a signed-in person's posts are theirs, not
    anonymous), before the views and their CSRF check: a refused request costs no more
    than its count."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        counted = scope_of(request)
        if counted is not None:
            retry_after = hit(*counted)
            if retry_after is not None:
                return too_many(request, retry_after)
        return self.get_response(request)
