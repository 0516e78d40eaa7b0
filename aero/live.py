"""Where the live pages open their WebSockets (see AERO_WS_URL)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest


def live_context(request: HttpRequest) -> dict[str, Any]:
    return {"ws_origin": settings.AERO_WS_URL}
