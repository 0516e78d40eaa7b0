"""One search document per session for PostgreSQL history search: the table,
its stored English tsvector, GIN trigram and full-text indexes, the trigger on
diagnosis_event that keeps it in the events' own transaction, and a backfill from the
log. The per-message and report indexes of 0001 are dropped: nothing queries them now,
and every user.message insert paid for them. SQLite keeps its FTS5 table (0001)."""

from __future__ import annotations

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

# The text an event adds to its session's document (the same CASE as the trigger).
EVENT_TEXT = (
    "coalesce(CASE WHEN {e}.type = 'report.ready' THEN {e}.payload ->> 'markdown' "
    "ELSE {e}.payload ->> 'text' END, '')"
)
SEARCHED_TYPES = "('user.message', 'report.ready')"

PG_FORWARD = [
    "ALTER TABLE replay_session_search ADD COLUMN words tsvector "
    "GENERATED ALWAYS AS (to_tsvector('english', document)) STORED",
    f"""
    CREATE FUNCTION replay_session_search_add() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO replay_session_search AS s (session_id, document)
        VALUES (NEW.session_id, {EVENT_TEXT.format(e="NEW")})
        ON CONFLICT (session_id) DO UPDATE SET document = s.document || E'\\n' || EXCLUDED.document;
        RETURN NULL;
    END
    $$
    """,
    "CREATE TRIGGER replay_session_search_add AFTER INSERT ON diagnosis_event FOR EACH ROW "
    f"WHEN (NEW.type IN {SEARCHED_TYPES}) EXECUTE FUNCTION replay_session_search_add()",
    # The backfill runs before the indexes are built: one index build, not 100k inserts.
    f"""
    INSERT INTO replay_session_search (session_id, document)
    SELECT e.session_id, string_agg({EVENT_TEXT.format(e="e")}, E'\\n' ORDER BY e.seq)
      FROM diagnosis_event e WHERE e.type IN {SEARCHED_TYPES} GROUP BY e.session_id
    """,
    "CREATE INDEX replay_session_search_trgm ON replay_session_search "
    "USING gin (document gin_trgm_ops)",
    "CREATE INDEX replay_session_search_words ON replay_session_search USING gin (words)",
    "ANALYZE replay_session_search",
    "DROP INDEX IF EXISTS replay_event_text_trgm",
    "DROP INDEX IF EXISTS replay_event_text_fts",
    "DROP INDEX IF EXISTS replay_report_trgm",
]
PG_BACKWARD = [
    "CREATE INDEX IF NOT EXISTS replay_event_text_trgm ON diagnosis_event "
    "USING gin ((payload ->> 'text') gin_trgm_ops) WHERE type = 'user.message'",
    "CREATE INDEX IF NOT EXISTS replay_event_text_fts ON diagnosis_event "
    "USING gin (to_tsvector('english', payload ->> 'text')) WHERE type = 'user.message'",
    "CREATE INDEX IF NOT EXISTS replay_report_trgm ON diagnosis_report "
    "USING gin (markdown gin_trgm_ops)",
    "DROP TRIGGER IF EXISTS replay_session_search_add ON diagnosis_event",
    "DROP FUNCTION IF EXISTS replay_session_search_add()",
]


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for statement in PG_FORWARD:
            schema_editor.execute(statement)


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for statement in PG_BACKWARD:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("diagnosis", "0006_merge_log_and_list_index"),
        ("replay", "0001_history_search_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="SessionSearch",
            fields=[
                (
                    "session",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="diagnosis.session",
                    ),
                ),
                ("document", models.TextField(default="")),
            ],
            options={"db_table": "replay_session_search"},
        ),
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
