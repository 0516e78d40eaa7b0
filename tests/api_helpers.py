"""Calling /api/v1 with a token through Django's test client."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.models import User
from django.test import Client

from api.models import ApiToken


def token_for(user: User, *roles: str, name: str = "tests") -> str:
    _, raw = ApiToken.issue(user, name, list(roles))
    return raw


def call(
    method: str,
    path: str,
    token: str | None = None,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Any:
    extra: dict[str, Any] = {
        f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()
    }
    if token is not None:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    client = Client()
    if method == "GET":
        return client.get(path, **extra)
    return client.generic(
        method,
        path,
        json.dumps(body if body is not None else {}),
        content_type="application/json",
        **extra,
    )
