"""Server errors a person can trace: every request carries an id (the client's
X-Request-ID when it sent a sane one, else a new one), returned in the response's
X-Request-ID header and written on every log line about the request; a refused
dependency (the database or Redis down, full or restarting) answers 503 with a body
that says which, never a bare 500. Django logs each 5xx on `django.request` with its
traceback (settings.LOGGING gives that logger a handler)."""

from __future__ import annotations

import logging
import re
import sys
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import redis
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import server_error

REQUEST_ID_HEADER = "X-Request-ID"
_SANE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_request_id: ContextVar[str] = ContextVar("aero_request_id", default="-")

# What the API and the ingest answer in JSON (api.middleware.JSON_PREFIXES).
_JSON_PREFIXES = ("/api/", "/ingest/")


def current_request_id() -> str:
    return _request_id.get()


class RequestIdMiddleware:
    """First in MIDDLEWARE: the id is known to everything the request runs."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        sent = request.headers.get(REQUEST_ID_HEADER, "")
        request_id = sent if _SANE_ID.fullmatch(sent) else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        token = _request_id.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            _request_id.reset(token)
        response[REQUEST_ID_HEADER] = request_id
        return response


class RequestIdFilter(logging.Filter):
    """Puts `request_id` on every record: the request's (Django's request logger passes
    the request), else the one the current request set, else "-"."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        record.request_id = getattr(request, "request_id", None) or current_request_id()
        return True


def refused_dependency(exc: BaseException | None) -> str | None:
    """Which dependency refused the request ("database", "Redis"), or None when `exc` is
    another error. A database error counts only when the server is unreachable, full or
    shutting down (SQLSTATE classes 08, 53, 57P): a deadlock or a constraint is a bug
    to see as a 500."""
    while exc is not None:
        if isinstance(exc, (OperationalError, InterfaceError)):
            state = getattr(exc.__cause__, "sqlstate", None)
            if state is None or state.startswith(("08", "53", "57P")):
                return "database"
            return None
        if isinstance(
            exc,
            (
                redis.exceptions.ConnectionError,
                redis.exceptions.TimeoutError,
                redis.exceptions.OutOfMemoryError,
                redis.exceptions.ReadOnlyError,
            ),
        ):
            return "Redis"
        exc = exc.__cause__ or exc.__context__
    return None


def handler500(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """Django calls this while it handles the uncaught exception (sys.exc_info is the
    error): a refused dependency is a 503 saying which, anything else the 500 page."""
    dependency = refused_dependency(sys.exc_info()[1])
    if dependency is None:
        return server_error(request)
    message = f"The {dependency} is not answering; try again in a moment."
    request_id = getattr(request, "request_id", "-")
    if request.path.startswith(_JSON_PREFIXES):
        body = {"code": "unavailable", "message": message, "request_id": request_id}
        response: HttpResponse = JsonResponse(body, status=503)
    else:
        response = HttpResponse(
            f"503 Service Unavailable\n\n{message}\nRequest id: {request_id}\n",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
    response["Retry-After"] = "5"
    return response
