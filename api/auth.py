"""API authentication: per-user bearer tokens, stored hashed, scoped to roles."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from aero.roles import RUN_SESSIONS
from api.errors import ApiError
from api.models import ApiToken, hash_token


def token_from_raw(raw: str) -> ApiToken | None:
    """The active token with this value and an active user, or None. One query."""
    raw = (raw or "").strip()
    if not raw or len(raw) > 200:
        return None
    token = ApiToken.objects.select_related("user").filter(token_hash=hash_token(raw)).first()
    if token is None or not token.is_active or not token.user.is_active:
        return None
    return token


def touch(token: ApiToken) -> None:
    """Record use, at most once per AERO_TOKEN_TOUCH_SECONDS (not one UPDATE per call)."""
    now = timezone.now()
    every = timedelta(seconds=settings.AERO_TOKEN_TOUCH_SECONDS)
    if token.last_used_at is None or now - token.last_used_at >= every:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now


class TokenAuth(HttpBearer):
    """`Authorization: Bearer aero_…`, for an operation open to `roles`. The request then
    acts as the token's user, with the token's roles (request.api_roles); the audit
    middleware records the token id. The role check runs here, before the body is
    validated: a caller without the role learns nothing about what the body should be."""

    def __init__(self, roles: Iterable[str] = (), what: str = "do this") -> None:
        super().__init__()
        self.roles = tuple(roles)
        self.what = what

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken | None:
        api_token = token_from_raw(token)
        if api_token is None:
            return None
        touch(api_token)
        request.user = api_token.user
        request.api_token = api_token  # type: ignore[attr-defined]
        request.api_roles = api_token.effective_roles()  # type: ignore[attr-defined]
        if self.roles:
            require_role(request, self.roles, self.what)
        return api_token


def require_role(request: HttpRequest, roles: Iterable[str], what: str) -> None:
    held: frozenset[str] = getattr(request, "api_roles", frozenset())
    if not held & set(roles):
        raise ApiError(
            403,
            "forbidden",
            f"This token may not {what} (needs one of the roles: {', '.join(sorted(roles))}).",
        )


def api_user(request: HttpRequest) -> Any:
    return request.user


# The scope both session-opening routers (api.views, api.bundles) require.
RUN = TokenAuth(RUN_SESSIONS, "run sessions (open, answer, cancel, resume)")
