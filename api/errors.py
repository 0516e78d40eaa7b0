"""Every API error is JSON with a stable machine-readable `code` and a human `message`."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError


class ErrorOut(Schema):
    code: str
    message: str
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

# The error responses each operation documents (schemathesis checks the schema's promise).
READ_ERRORS: dict[int, type[ErrorOut]] = {401: ErrorOut, 403: ErrorOut, 404: ErrorOut}
WRITE_ERRORS: dict[int, type[ErrorOut]] = {**READ_ERRORS, 409: ErrorOut, 422: ErrorOut}


def error_body(
    code: str, message: str, errors: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if errors is not None:
        body["errors"] = errors
    return body


def install_handlers(api: NinjaAPI) -> None:
    def api_error(request: HttpRequest, exc: Any) -> HttpResponse:
        return api.create_response(
            request, error_body(exc.code, exc.message), status=exc.status_code
        )

    def http_error(request: HttpRequest, exc: Any) -> HttpResponse:
        code = DEFAULT_CODES.get(exc.status_code, "error")
        return api.create_response(request, error_body(code, exc.message), status=exc.status_code)

    def auth_error(request: HttpRequest, exc: Any) -> HttpResponse:
        response = api.create_response(
            request,
            error_body(
                "unauthenticated",
                "Send a valid API token: 'Authorization: Bearer <token>' "
                "(create one under /api/tokens/).",
            ),
            status=401,
        )
        response["WWW-Authenticate"] = 'Bearer realm="aero"'
        return response

    def validation_error(request: HttpRequest, exc: Any) -> HttpResponse:
        errors = [
            {"loc": [str(part) for part in e.get("loc", ())], "msg": str(e.get("msg", ""))}
            for e in exc.errors
        ]
        first = errors[0] if errors else {"loc": [], "msg": "invalid"}
        where = ".".join(first["loc"]) or "request"
        return api.create_response(
            request,
            error_body("invalid_input", f"{where}: {first['msg']}", errors),
            status=422,
        )

    def not_found(request: HttpRequest, exc: Any) -> HttpResponse:
        return api.create_response(
            request, error_body("not_found", str(exc) or "Not found."), status=404
        )

    api.add_exception_handler(ApiError, api_error)
    api.add_exception_handler(AuthenticationError, auth_error)
    api.add_exception_handler(HttpError, http_error)
    api.add_exception_handler(ValidationError, validation_error)
    api.add_exception_handler(Http404, not_found)
