from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from aero.roles import ALL_ROLES, user_roles

TOKEN_PREFIX = "aero_"


def hash_token(raw: str) -> str:
    """Tokens carry 256 random bits, so a plain SHA-256 is enough to store them: there is
    nothing to brute-force, and a lookup by hash stays one indexed query."""
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def active(self) -> ApiTokenQuerySet:
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )


class ApiToken(models.Model):
    """A personal API token. Only its hash is stored; the token is shown once, at creation.
    It acts as its user with at most the roles chosen at creation (and never more than the
    user holds at the time of the call)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=80, help_text="What this token is for.")
    prefix = models.CharField(max_length=16, help_text="First characters, to recognise it.")
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    roles = models.JSONField(
        default=list, blank=True, help_text="Roles this token may use; empty: all of the user's."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(
        cls, user: Any, name: str, roles: list[str] | None = None, expires_at: Any = None
    ) -> tuple[ApiToken, str]:
        """Create a token; returns it with the raw value, which is never stored."""
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user,
            name=name.strip()[:80] or "API token",
            prefix=raw[: len(TOKEN_PREFIX) + 6],
            token_hash=hash_token(raw),
            roles=sorted(set(roles or []) & set(ALL_ROLES)),
            expires_at=expires_at,
        )
        return token, raw

    @property
    def is_active(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()

    def effective_roles(self) -> frozenset[str]:
        held = user_roles(self.user)
        return held & frozenset(self.roles) if self.roles else held

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])


class IdempotencyKey(models.Model):
    """The first response to a POST carrying an `Idempotency-Key`, per user, for a while
    (settings.AERO_IDEMPOTENCY_HOURS). The same key with the same request returns it again;
    with another request it is refused."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    response = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="idempotency_user_key_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user_id}:{self.key}"
