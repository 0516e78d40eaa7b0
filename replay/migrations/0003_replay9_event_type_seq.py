"""(session, type, seq) on diagnosis_event for the replay player's group filter
(replay.presenters.ordered): each selected type walks its own run of this index, so a
sparse group (approvals) finds its neighbours of any step in a few index reads. Built
CONCURRENTLY on PostgreSQL so a live database keeps writing events."""

from __future__ import annotations

from typing import Any

from django.db import migrations

INDEX = "replay_event_session_type_seq ON diagnosis_event (session_id, type, seq)"


def forwards(apps: Any, schema_editor: Any) -> None:
    concurrently = "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f"CREATE INDEX {concurrently}IF NOT EXISTS {INDEX}")


def backwards(apps: Any, schema_editor: Any) -> None:
    concurrently = "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS replay_event_session_type_seq")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [("replay", "0002_replay9_search_document")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
