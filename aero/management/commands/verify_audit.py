"""Walk the audit log's HMAC chain and name the first entry that breaks it."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from aero import anchors, audit_chain
from aero.models import AuditLog


class Command(BaseCommand):
    help = "Verify the audit log's keyed hash chain (exit status 1 at the first bad entry)."

    def handle(self, *args: Any, **options: Any) -> None:
        entries = AuditLog.objects.order_by("id").values(*audit_chain.FIELDS).iterator(2000)
        try:
            report = audit_chain.verify(entries)
        finally:
            # Stopping at a bad entry leaves the server-side cursor open: close it now,
            # inside the transaction that opened it, not whenever it is collected.
            entries.close()
        if not report.ok:
            raise CommandError(
                f"audit chain broken at entry {report.first_bad_id}: {report.problem} "
                f"({report.checked} checked)"
            )
        last = AuditLog.objects.order_by("-id").values_list("id", flat=True).first() or 0
        problem = anchors.first_mismatch(
            anchors.records("audit"),
            "id",
            last,
            lambda ids: dict(AuditLog.objects.filter(id__in=ids).values_list("id", "digest")),
            "entry",
        )
        if problem:
            raise CommandError(
                f"audit chain does not match its anchors ({settings.AERO_ANCHOR_FILE}): {problem}"
            )
        self.stdout.write(f"audit chain OK: {report.checked} entries, head {report.head}")
