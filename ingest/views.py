"""POST /ingest/alertmanager (Alertmanager webhook v4) and POST /ingest/alerts (generic).

Authenticated by an API token whose roles may open sessions, or by the shared secret
AERO_INGEST_SECRET, both as `Authorization: Bearer …` (Alertmanager's http_config
`authorization.credentials`). Answers in the API's JSON error format. A delivery is
refused as a whole (4xx) only when its envelope is invalid or none of its alerts is."""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from pydantic import BaseModel, ValidationError

from aero.roles import RUN_SESSIONS
from api.auth import token_from_raw, touch
from api.errors import problem_response
from ingest.actions import do_ingest, do_refuse, ingest_user
from ingest.config import ConfigError
from ingest.gate import Alert, from_alertmanager, from_generic
from ingest.schemas import AlertmanagerAlert, AlertmanagerPayload, GenericAlert, GenericPayload


def _error(
    request: HttpRequest, status: int, code: str, message: str, **extra: Any
) -> HttpResponse:
    return problem_response(request, status, code, message, **extra)


def _caller(request: HttpRequest) -> tuple[Any, HttpResponse | None]:
    header = request.headers.get("Authorization", "")
    if not header.lower().startswith("bearer "):
        return None, _error(
            request,
            401,
            "unauthenticated",
            "Send an API token or the ingest secret as a Bearer credential.",
        )
    credential = header[7:].strip()
    secret = settings.AERO_INGEST_SECRET
    if secret and hmac.compare_digest(credential.encode(), secret.encode()):
        return ingest_user(), None
    token = token_from_raw(credential)
    if token is None:
        return None, _error(
            request, 401, "unauthenticated", "Unknown, revoked or expired credential."
        )
    if not token.effective_roles() & set(RUN_SESSIONS):
        return None, _error(
            request, 403, "forbidden", "This token may not open sessions (needs operator or admin)."
        )
    touch(token)
    request.api_token = token  # type: ignore[attr-defined]
    return token.user, None


def _has_nul(value: Any) -> bool:
    """Whether any key or string in the parsed body holds U+0000. A walk with a stack of
    its own: a body nested as deep as the parser allows must not exhaust Python's."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _body(request: HttpRequest) -> bytes | None:
    """The body, read up to AERO_INGEST_MAX_BYTES (None: larger). Read from the stream:
    `request.body` would refuse anything over the site's DATA_UPLOAD_MAX_MEMORY_SIZE,
    which a full Alertmanager group can be."""
    limit = settings.AERO_INGEST_MAX_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return None
    body = request.read(limit + 1)  # a chunked body declares no length
    return None if len(body) > limit else body


def _refusal(schema: type[BaseModel], raw: Any, index: int) -> tuple[Any, str]:
    """(the validated alert, "") or (None, why it is refused)."""
    if _has_nul(raw):
        return None, f"alerts.{index}: holds a NUL character (U+0000), which cannot be stored"
    try:
        return schema.model_validate(raw), ""
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(["alerts", str(index), *(str(p) for p in first["loc"])])
        return None, f"{where}: {first['msg']}"


def _ingest(
    request: HttpRequest,
    schema: type[BaseModel],
    item_schema: type[BaseModel],
    convert: Callable[[Any, Any], Alert],
    source: Callable[[Any, Any], tuple[str, str]],
) -> HttpResponse:
    """The envelope must be valid (422 otherwise); each alert is then validated on its
    own: an invalid one is recorded as refused with its reason, and the delivery is
    accepted (200) whenever any alert in it is valid."""
    user, refusal = _caller(request)
    if refusal is not None:
        return refusal
    raw = _body(request)
    if raw is None:
        return _error(
            request,
            413,
            "payload_too_large",
            f"The delivery is over the {settings.AERO_INGEST_MAX_BYTES:,} bytes accepted"
            " (AERO_INGEST_MAX_BYTES); send fewer alerts per delivery (Alertmanager:"
            " max_alerts).",
        )
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: nested deeper than the parser goes.
        return _error(request, 400, "bad_json", "The body is not JSON.")
    envelope = {k: v for k, v in body.items() if k != "alerts"} if isinstance(body, dict) else body
    if _has_nul(envelope):
        return _error(
            request,
            422,
            "invalid_input",
            "The delivery holds a NUL character (U+0000), which cannot be stored.",
        )
    try:
        payload = schema.model_validate(body)
    except ValidationError as exc:
        errors = [
            {"loc": [str(p) for p in e["loc"]], "msg": e["msg"]}
            for e in exc.errors(include_url=False)
        ]
        where = ".".join(errors[0]["loc"]) or "body"
        return _error(request, 422, "invalid_input", f"{where}: {errors[0]['msg']}", errors=errors)
    results = []
    refused: list[str] = []
    try:
        for index, item in enumerate(payload.alerts):  # type: ignore[attr-defined]
            alert, reason = _refusal(item_schema, item, index)
            if alert is None:
                refused.append(reason)
                name, group_key = source(payload, item)
                observation = do_refuse(item, reason, name, group_key, user)
            else:
                observation = do_ingest(convert(payload, alert), user)
            results.append(
                {
                    "name": observation.name,
                    "fingerprint": observation.fingerprint,
                    "status": observation.status,
                    "decision": observation.decision,
                    "stage": observation.stage,
                    "reason": observation.reason,
                    "session_id": str(observation.session_id) if observation.session_id else None,
                }
            )
    except ConfigError as exc:
        # No valid gate configuration at all (never the case after one good load).
        return _error(request, 503, "gate_unavailable", str(exc))
    if refused and len(refused) == len(results):
        return _error(
            request,
            422,
            "invalid_input",
            refused[0],
            errors=[{"msg": reason} for reason in refused],
            received=len(results),
            decisions=results,
        )
    return JsonResponse({"received": len(results), "decisions": results})


def _alertmanager_source(payload: AlertmanagerPayload, item: Any) -> tuple[str, str]:
    return "alertmanager", payload.groupKey[:255]


def _generic_source(payload: GenericPayload, item: Any) -> tuple[str, str]:
    source = item.get("source") if isinstance(item, dict) else None
    group_key = item.get("group_key") if isinstance(item, dict) else None
    return (
        source if isinstance(source, str) and source else "generic",
        group_key if isinstance(group_key, str) else "",
    )


@csrf_exempt
@require_POST
def alertmanager(request: HttpRequest) -> HttpResponse:
    return _ingest(
        request, AlertmanagerPayload, AlertmanagerAlert, from_alertmanager, _alertmanager_source
    )


@csrf_exempt
@require_POST
def generic(request: HttpRequest) -> HttpResponse:
    return _ingest(request, GenericPayload, GenericAlert, from_generic, _generic_source)
