from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render


def home(request: HttpRequest) -> HttpResponse:
    return redirect("diagnosis:session-list")


def healthz(request: HttpRequest) -> JsonResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        return JsonResponse({"ok": False, "database": str(exc)}, status=503)
    return JsonResponse({"ok": True})


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None, credentials: Any = None
) -> HttpResponse:
    """django-axes' lockout answer (AXES_LOCKOUT_CALLABLE): a page that says what
    happened, for how long, and who can lift it, with 429 Too Many Requests."""
    username = ""
    if isinstance(credentials, dict):
        username = str(credentials.get("username") or "")
    username = username or str(request.POST.get("username", ""))
    return render(
        request,
        "registration/locked_out.html",
        {
            "username": username[:150],
            "failure_limit": settings.AXES_FAILURE_LIMIT,
            "minutes": int(settings.AXES_COOLOFF_TIME.total_seconds() // 60),
        },
        status=429,
    )
