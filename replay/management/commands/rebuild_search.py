from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from replay.history import rebuild_documents


class Command(BaseCommand):
    help = (
        "Rebuild every session's history-search document from the event log (PostgreSQL). "
        "The documents are derived: a trigger keeps them as events arrive, and this "
        "recomputes them after a restore or if one is in doubt."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        if connection.vendor != "postgresql":
            raise CommandError(
                "Embedded mode (SQLite) searches its FTS5 table, kept by triggers: "
                "there is nothing to rebuild."
            )
        with transaction.atomic():
            written = rebuild_documents()
        self.stdout.write(f"rebuilt {written} search documents from the event log")
