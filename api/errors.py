"""Every API error is an RFC 9457 problem (`application/problem+json`): `type`, `title`,
`status`, `detail`, `instance`, plus a stable machine-readable `code`, the `request_id`
(also in the `X-Request-ID` header and the log line of the error) and, for invalid
input, `errors`. `message` repeats `detail` for clients of the first error format."""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError

logger = logging.getLogger("api.errors")
PROBLEM = "application/problem+json"
TYPE_PREFIX = "urn:aero:problem:"


class ErrorOut(Schema):
    type: str
    title: str
    status: int
    detail: str
    instance: str
    code: str
    message: str
    request_id: str
    errors: list[dict[str, Any]] | None = None


class ApiError(HttpError):
    def __init__(self, status_code: int, code: str, message: str) -> None:
        super().__init__(status_code, message)
        self.code = code


# Codes clients can rely on, by HTTP status when nothing more specific applies.
DEFAULT_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    422: "invalid_input",
    429: "throttled",
    500: "server_error",
}

# The error responses each operation documents (schemathesis checks the schema's promise):
# a GET refuses bad query or path values with 422; a POST also a body it cannot parse
# (400) and a refused action (409).
READ_ERRORS: dict[int, type[ErrorOut]] = {
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    422: ErrorOut,
}
WRITE_ERRORS: dict[int, type[ErrorOut]] = {**READ_ERRORS, 400: ErrorOut, 409: ErrorOut}


def request_id(request: HttpRequest) -> str:
    return str(getattr(request, "request_id", "") or "")


def problem(
    request: HttpRequest,
    status: int,
    code: str,
    detail: str,
    errors: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": f"{TYPE_PREFIX}{code}",
        "title": HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error",
        "status": status,
        "detail": detail,
        "instance": request.path,
        "code": code,
        "message": detail,
        "request_id": request_id(request),
        **extra,
    }
    if errors is not None:
        body["errors"] = errors
    return body


def problem_response(
    request: HttpRequest,
    status: int,
    code: str,
    detail: str,
    errors: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> HttpResponse:
    """The problem as a response, logged with its request id."""
    body = problem(request, status, code, detail, errors, **extra)
    logger.info(
        "%s %s -> %s %s: %s request_id=%s",
        request.method,
        request.path,
        status,
        code,
        detail,
        body["request_id"],
    )
    response = HttpResponse(json.dumps(body), status=status, content_type=PROBLEM)
    if status == 401:
        realm = "aero-ingest" if request.path.startswith("/ingest/") else "aero"
        response["WWW-Authenticate"] = f'Bearer realm="{realm}"'
    return response


def install_handlers(api: NinjaAPI) -> None:
    def api_error(request: HttpRequest, exc: Any) -> HttpResponse:
        return problem_response(request, exc.status_code, exc.code, exc.message)

    def http_error(request: HttpRequest, exc: Any) -> HttpResponse:
        code = DEFAULT_CODES.get(exc.status_code, "error")
        return problem_response(request, exc.status_code, code, exc.message)

    def auth_error(request: HttpRequest, exc: Any) -> HttpResponse:
        return problem_response(
            request,
            401,
            "unauthenticated",
            "Send a valid API token: 'Authorization: Bearer <token>' "
            "(create one under /api/tokens/).",
        )

    def validation_error(request: HttpRequest, exc: Any) -> HttpResponse:
        errors = [
            {"loc": [str(part) for part in e.get("loc", ())], "msg": str(e.get("msg", ""))}
            for e in exc.errors
        ]
        first = errors[0] if errors else {"loc": [], "msg": "invalid"}
        where = ".".join(first["loc"]) or "request"
        return problem_response(request, 422, "invalid_input", f"{where}: {first['msg']}", errors)

    def not_found(request: HttpRequest, exc: Any) -> HttpResponse:
        return problem_response(request, 404, "not_found", str(exc) or "Not found.")

    api.add_exception_handler(ApiError, api_error)
    api.add_exception_handler(AuthenticationError, auth_error)
    api.add_exception_handler(HttpError, http_error)
    api.add_exception_handler(ValidationError, validation_error)
    api.add_exception_handler(Http404, not_found)
