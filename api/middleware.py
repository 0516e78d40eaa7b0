"""Every /api/v1 call made with a token is audited with the token's id, whatever its
outcome (a refused approval is as interesting as a granted one). Every error under
/api/v1/ and /ingest/ is JSON, those Django answers around the views included."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from http import HTTPStatus

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse

from aero import metrics
from aero.models import audit
from api.errors import DEFAULT_CODES, PROBLEM, problem_response

API_PREFIX = "/api/v1/"
JSON_PREFIXES = (API_PREFIX, "/ingest/")


class ApiAuditMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not request.path.startswith(API_PREFIX):
            return response
        metrics.api_call(request.method or "", response.status_code)
        token = getattr(request, "api_token", None)
        if token is not None:
            match = request.resolver_match
            session_id = _uuid_or_none(match.kwargs.get("session_id") if match else None)
            audit(
                "api.call",
                object_type="api.token",
                object_id=str(token.pk),
                actor=token.user,
                session_id=session_id,
                detail={
                    "token": token.pk,
                    "method": request.method,
                    "path": request.path,
                    "status": response.status_code,
                    "replayed": bool(getattr(request, "idempotent_replay", False)),
                },
            )
        return response


def _uuid_or_none(value: object) -> uuid.UUID | None:
    """The path's session id, if it is one: a malformed one (the view answered 422) is
    audited without it rather than failing the call (and its audit entry) with a 500."""
    if value is None or isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


class JsonErrorsMiddleware:
    """The API's error format (RFC 9457 problem details) for what Django answers before or
    around the views: a method the route does not take (405, its Allow header kept), a
    body over DATA_UPLOAD_MAX_MEMORY_SIZE (413, naming the limit), a server error (500).
    A client of the API or of the ingest never has to parse an HTML page."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            response.status_code < 400
            or not request.path.startswith(JSON_PREFIXES)
            or response.get("Content-Type", "").startswith(("application/json", PROBLEM))
        ):
            return response
        status = response.status_code
        if status == 405:
            message = f"{request.method} is not allowed here; allowed: {response.get('Allow', '')}."
        else:
            message = HTTPStatus(status).phrase + "." if status in HTTPStatus else "Error."
        code = DEFAULT_CODES.get(status, "server_error" if status >= 500 else "error")
        converted = problem_response(request, status, code, message)
        for header in ("Allow", "WWW-Authenticate", "Retry-After"):
            if header in response:
                converted[header] = response[header]
        return converted

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, RequestDataTooBig) and request.path.startswith(JSON_PREFIXES):
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            return problem_response(
                request,
                413,
                "payload_too_large",
                f"The body is over the {limit:,} bytes accepted.",
            )
        return None
