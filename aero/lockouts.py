"""Sign-in lockouts (django-axes) and their lifting, in the audit log.

A lockout is recorded once, when a username and address pair reaches the limit (not
for every refused try after it: those would let anyone grow the append-only log); a
lift when that pair's attempts row goes, whoever removes it (`axes_reset_username`,
the admin, the cool-off's own clean-up).
"""

from __future__ import annotations

from typing import Any

from axes.helpers import get_failure_limit
from axes.models import AccessAttempt
from axes.signals import user_locked_out
from django.conf import settings
from django.db.models.signals import post_delete
from django.dispatch import receiver

from aero.models import audit


@receiver(user_locked_out, dispatch_uid="aero-audit-lockout")
def _locked_out(
    sender: Any, request: Any, username: str | None, ip_address: str | None, **kwargs: Any
) -> None:
    failures = getattr(request, "axes_failures_since_start", None)
    credentials = getattr(request, "axes_credentials", None)
    if failures is None or failures != get_failure_limit(request, credentials):
        return  # a try refused while locked, or past the limit: already recorded
    audit(
        "auth.locked_out",
        actor_label="anonymous",
        object_type="auth.user",
        object_id=(username or "")[:150],
        detail={"address": ip_address or "", "failures": failures},
    )


@receiver(post_delete, sender=AccessAttempt, dispatch_uid="aero-audit-unlock")
def _attempts_removed(sender: Any, instance: AccessAttempt, **kwargs: Any) -> None:
    if instance.failures_since_start < settings.AXES_FAILURE_LIMIT:
        return  # a count reset (a success), not a lockout lifted
    audit(
        "auth.lockout_lifted",
        actor_label="system",
        object_type="auth.user",
        object_id=(instance.username or "")[:150],
        detail={"address": instance.ip_address or "", "failures": instance.failures_since_start},
    )
