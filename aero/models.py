from __future__ import annotations

import hashlib
import json
from typing import Any

from django.conf import settings
from django.db import models


class AuditLogQuerySet(models.QuerySet["AuditLog"]):
    def update(self, **kwargs: Any) -> int:
        raise PermissionError("the audit log is append-only")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise PermissionError("the audit log is append-only")


class AuditLog(models.Model):
    """Append-only record of who did what. PostgreSQL triggers back this up (migration 0002)."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor_label = models.CharField(max_length=150, help_text="Username or system component.")
    action = models.CharField(max_length=80)
    object_type = models.CharField(max_length=80)
    object_id = models.CharField(max_length=80)
    session_id = models.UUIDField(null=True, blank=True)
    detail = models.JSONField(default=dict)
    digest = models.CharField(max_length=64, editable=False)

    objects = AuditLogQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # replay/export: "audit entries of one session in order"
            models.Index(fields=["session_id", "created_at"], name="audit_session_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.actor_label} {self.action} {self.object_type}:{self.object_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise PermissionError("the audit log is append-only")
        self.digest = self.compute_digest()
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise PermissionError("the audit log is append-only")

    def compute_digest(self) -> str:
        body = {
            "actor": self.actor_label,
            "action": self.action,
            "object": f"{self.object_type}:{self.object_id}",
            "session": str(self.session_id) if self.session_id else None,
            "detail": self.detail,
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def audit(
    action: str,
    *,
    obj: models.Model | None = None,
    object_type: str = "",
    object_id: str = "",
    actor: Any = None,
    actor_label: str = "",
    session_id: Any = None,
    detail: dict[str, Any] | None = None,
) -> AuditLog:
    if obj is not None:
        object_type = object_type or obj._meta.label_lower
        object_id = object_id or str(obj.pk)
    user = actor if getattr(actor, "is_authenticated", False) else None
    return AuditLog.objects.create(
        actor=user,
        actor_label=actor_label or (user.get_username() if user else "system"),
        action=action,
        object_type=object_type,
        object_id=object_id,
        session_id=session_id,
        detail=detail or {},
    )
