"""Every /api/v1 call made with a token is audited with the token's id, whatever its
outcome (a refused approval is as interesting as a granted one)."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from aero import metrics
from aero.models import audit

API_PREFIX = "/api/v1/"


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
            session_id = match.kwargs.get("session_id") if match else None
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
