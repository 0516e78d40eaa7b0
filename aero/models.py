from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, router, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from aero import anchors, audit_chain


class AuditLogQuerySet(models.QuerySet["AuditLog"]):
    def update(self, **kwargs: Any) -> int:
        raise PermissionError("the audit log is append-only")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise PermissionError("the audit log is append-only")

    def bulk_create(self, *args: Any, **kwargs: Any) -> list[AuditLog]:  # type: ignore[override]
        raise PermissionError("audit entries are appended one by one, each chained")


class AuditLog(models.Model):
    """Append-only record of who did what, chained with a keyed hash (aero.audit_chain).
    In PostgreSQL the app's role may only SELECT and INSERT it, and triggers refuse any
    change and any entry that does not continue the chain (migrations 0002, 0003)."""

    created_at = models.DateTimeField(default=timezone.now, db_index=True, editable=False)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor_label = models.CharField(max_length=150, help_text="Username or system component.")
    action = models.CharField(max_length=80)
    object_type = models.CharField(max_length=80)
    object_id = models.CharField(max_length=80)
    session_id = models.UUIDField(null=True, blank=True)
    detail = models.JSONField(default=dict)
    prev_digest = models.CharField(max_length=64, editable=False)
    digest = models.CharField(max_length=64, editable=False)

    objects = AuditLogQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # replay/export: "audit entries of one session in order"
            models.Index(fields=["session_id", "created_at"], name="audit_session_created_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(digest__regex=r"^[0-9a-f]{64}$")
                & models.Q(prev_digest__regex=r"^[0-9a-f]{64}$"),
                name="audit_digests_are_sha256_hex",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.actor_label} {self.action} {self.object_type}:{self.object_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Append, chained to the newest entry. The chain is locked (PostgreSQL advisory
        lock, until the transaction ends) so concurrent appends never fork it."""
        if self.pk is not None:
            raise PermissionError("the audit log is append-only")
        # Stored exactly as hashed: the JSON column gives back what was digested.
        self.detail = json.loads(json.dumps(self.detail, cls=DjangoJSONEncoder))
        using = kwargs.get("using") or router.db_for_write(AuditLog)
        # No savepoint inside a caller's transaction (two statements per entry): an
        # error here fails the caller's transaction, as it must (the entry belongs to it).
        with transaction.atomic(using=using, savepoint=False):
            connection = transaction.get_connection(using)
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_xact_lock(%s)", [audit_chain.CHAIN_LOCK])
            head = (
                AuditLog.objects.using(using)
                .order_by("-id")
                .values_list("digest", flat=True)
                .first()
            )
            self.prev_digest = head or audit_chain.GENESIS
            self.created_at = timezone.now()
            self.digest = self.compute_digest()
            super().save(*args, **kwargs)
            anchors.note_audit(int(self.pk), self.digest, using)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise PermissionError("the audit log is append-only")

    def as_chain_entry(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in audit_chain.FIELDS}

    def compute_digest(self) -> str:
        return audit_chain.digest_of(self.as_chain_entry())


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


class UserPreference(models.Model):
    """What a user chose for themselves. The interface language is applied at sign-in
    (aero.i18n), so their choice follows them to any workstation."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preference"
    )
    language = models.CharField(
        _("language"), max_length=10, choices=settings.LANGUAGES, default=settings.LANGUAGE_CODE
    )
    # Approvers: a browser notification and a sound for each new R2/R3 request (opt-in).
    notify_risky = models.BooleanField(_("notify of new R2/R3 requests"), default=False)

    class Meta:
        verbose_name = _("user preference")
        verbose_name_plural = _("user preferences")

    def __str__(self) -> str:
        return f"{self.user_id}: {self.language}"
