"""An admin save (or delete) of the gate's settings or rules bumps the revision and, after
commit, reloads this process's snapshot; other processes notice the new revision within a
second on their next read."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from ingest.config import provider
from ingest.models import GateRule, GateSettings


@receiver(post_save, sender=GateRule, dispatch_uid="ingest.rule_saved")
@receiver(post_delete, sender=GateRule, dispatch_uid="ingest.rule_deleted")
@receiver(post_save, sender=GateSettings, dispatch_uid="ingest.settings_saved")
def gate_changed(sender: Any, **kwargs: Any) -> None:
    GateSettings.load()
    GateSettings.objects.filter(pk=1).update(revision=F("revision") + 1)
    transaction.on_commit(provider.reload)
