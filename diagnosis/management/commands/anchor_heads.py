"""Anchor the chains' current heads outside the database (aero.anchors): the audit log's
newest entry and the head of every session changed in the last day. scripts/run.sh runs
it when AERO stops; a cron job may run it more often."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from aero import anchors
from aero.models import AuditLog
from diagnosis.models import Session


class Command(BaseCommand):
    help = "Append the audit and event chains' current heads to AERO_ANCHOR_FILE."

    def handle(self, *args: Any, **options: Any) -> None:
        newest = AuditLog.objects.order_by("-id").values_list("id", "digest").first()
        if newest is not None:
            anchors.append({"kind": "audit", "id": newest[0], "head": newest[1]})
        since = timezone.now() - timedelta(days=1)
        changed = (
            Session.objects.filter(updated_at__gte=since, last_seq__gt=0)
            .values_list("pk", "last_seq", "chain_head")
            .iterator()
        )
        count = 0
        for session_id, seq, head in changed:
            anchors.append({"kind": "event", "session": str(session_id), "seq": seq, "head": head})
            count += 1
        self.stdout.write(f"anchored the audit head and {count} session head(s)")
