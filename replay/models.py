from __future__ import annotations

from django.db import models

from diagnosis.models import Session


class SessionSearch(models.Model):
    """A session's searchable text for history search on PostgreSQL: its operator
    messages (opening and answers) and report Markdown, in seq order, one row per session.

    Derived from the event log and never written by Python: a trigger on
    `diagnosis_event` (migration 0002) appends each `user.message` / `report.ready` text
    in the transaction that inserts the event, so the document cannot lag the log, and
    `replay.history.rebuild_documents()` rebuilds it from the events. The migration adds a
    stored `words` tsvector (English) beside `document`; both have GIN indexes. One row
    per session lets a broad term walk sessions newest-first and stop after a page,
    instead of collecting every matching message first.

    Embedded mode (SQLite) searches its FTS5 table `replay_search` instead; this table
    exists there but stays empty."""

    session = models.OneToOneField(
        Session, primary_key=True, on_delete=models.CASCADE, related_name="+"
    )
    document = models.TextField(default="")

    class Meta:
        db_table = "replay_session_search"

    def __str__(self) -> str:
        return f"search document of {self.session_id}"
