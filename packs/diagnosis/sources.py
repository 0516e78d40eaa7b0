"""A diagnosis' evidence sources as data (issue 36 item 1): the metrics sources an admin
configures (`MetricsSource`: Prometheus), their test connection, the audit entries of
their switch and credentials, and which source a session reads its metrics from (the
`diagnosis.requested` event says; "" is the bundle's metrics.csv)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models.signals import post_save, pre_save
from django.utils import timezone

from aero.audit_trail import current_actor
from aero.models import audit
from diagnosis.models import Event
from packs.diagnosis.models import MetricsSource
from packs.diagnosis.names import REQUESTED
from packs.diagnosis.prometheus import MetricsSourceError, PrometheusSource, check


@dataclass(frozen=True)
class Tested:
    ok: bool
    message: str


def probe_source(row: MetricsSource, actor: Any) -> Tested:
    """Ask the source (build info and a query) within its timeout; the answer in words,
    kept on the row and audited (`metrics_source.tested`)."""
    try:
        result = Tested(True, check(row.source()))
    except MetricsSourceError as exc:
        result = Tested(False, str(exc))
    except ValueError as exc:  # a secret the configured keys cannot decrypt
        result = Tested(False, f"the stored credential: {exc}")
    now = timezone.now()
    MetricsSource.objects.filter(pk=row.pk).update(
        last_tested_at=now, last_test_ok=result.ok, last_test_message=result.message[:500]
    )
    row.last_tested_at, row.last_test_ok = now, result.ok
    row.last_test_message = result.message[:500]
    audit(
        "metrics_source.tested",
        obj=row,
        actor=actor,
        detail={
            "name": row.name,
            "base_url": row.base_url,
            "ok": result.ok,
            "message": result.message,
        },
    )
    return result


def session_metrics(session_id: Any) -> tuple[str, PrometheusSource | None]:
    """The metrics source a session was started with: its name and what to read it with,
    or ("", None) for the bundle's file. A source removed or disabled since, or whose
    secret no longer decrypts, raises MetricsSourceError (the metrics read fails)."""
    payload = (
        Event.objects.filter(session_id=session_id, type=REQUESTED)
        .values_list("payload", flat=True)
        .first()
    ) or {}
    name = (payload.get("metrics") or {}).get("name", "")
    if not name:
        return "", None
    row = MetricsSource.objects.filter(name=name, enabled=True).first()
    if row is None:
        raise MetricsSourceError(f"the metrics source {name} is no longer configured or enabled")
    try:
        return name, row.source()
    except ValueError as exc:
        raise MetricsSourceError(f"the metrics source {name}'s credential: {exc}") from None


def session_code(session_id: Any) -> dict[str, str]:
    """The code source a session was started with: {"server", "repo"} of its system's
    attached git server, or {} for its bundle's repo/ (`diagnosis.requested` says)."""
    payload = (
        Event.objects.filter(session_id=session_id, type=REQUESTED)
        .values_list("payload", flat=True)
        .first()
    ) or {}
    code: dict[str, str] = (payload.get("evidence_from") or {}).get("code") or {}
    return code


# The admin's changes are audited by its log (aero.audit_trail.ADMIN_ACTIONS); the switch
# and the credential by entries of their own, never the secret nor its ciphertext.
def _before(sender: Any, instance: MetricsSource, **kwargs: Any) -> None:
    previous = sender.objects.filter(pk=instance.pk).first() if instance.pk else None
    instance._aero_before = (  # type: ignore[attr-defined]
        (previous.enabled, previous.secret_encrypted) if previous is not None else (False, "")
    )


def _after(sender: Any, instance: MetricsSource, created: bool, **kwargs: Any) -> None:
    was_enabled, old_secret = getattr(instance, "_aero_before", (False, ""))
    detail = {"name": instance.name, "base_url": instance.base_url}
    actor = current_actor()
    if instance.enabled != was_enabled and (instance.enabled or not created):
        action = "metrics_source.enabled" if instance.enabled else "metrics_source.disabled"
        audit(action, obj=instance, actor=actor, detail=detail)
    if instance.secret_encrypted != old_secret:
        action = (
            "metrics_source.secret_set"
            if instance.secret_encrypted
            else "metrics_source.secret_cleared"
        )
        audit(action, obj=instance, actor=actor, detail=detail)


def connect_audit() -> None:
    pre_save.connect(_before, sender=MetricsSource, dispatch_uid="aero.audit.metrics0")
    post_save.connect(_after, sender=MetricsSource, dispatch_uid="aero.audit.metrics1")
