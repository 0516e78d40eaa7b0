"""Indexes for history search (replay/history.py), on diagnosis' tables: replay owns no
table but needs its queries fast. PostgreSQL: full text + trigram (Chinese matches
inside words), expression indexes on the snapshot facts, keyset indexes without deleted
sessions; built CONCURRENTLY so a live database keeps writing. SQLite (embedded): an FTS5
table with the trigram tokenizer, kept by triggers."""

from __future__ import annotations

from typing import Any

from django.db import migrations

PG_INDEXES = [
    # free text over operator messages (answers included) and reports (trigram only)
    (
        "replay_event_text_trgm",
        "diagnosis_event USING gin ((payload ->> 'text') gin_trgm_ops) WHERE type = 'user.message'",
    ),
    (
        "replay_event_text_fts",
        "diagnosis_event USING gin (to_tsvector('english', payload ->> 'text')) "
        "WHERE type = 'user.message'",
    ),
    ("replay_report_trgm", "diagnosis_report USING gin (markdown gin_trgm_ops)"),
    # the history list, newest first / recently changed, without deleted sessions
    (
        "replay_session_created",
        "diagnosis_session (created_at DESC, id DESC) WHERE deleted_at IS NULL",
    ),
    (
        "replay_session_updated",
        "diagnosis_session (updated_at DESC, id DESC) WHERE deleted_at IS NULL",
    ),
    # facts from the snapshot: the expressions in replay.history.PG_FACTS
    ("replay_session_flight", "diagnosis_session ((snapshot -> 'fields' ->> 'flight_no'))"),
    ("replay_session_position", "diagnosis_session ((snapshot -> 'fields' ->> 'position'))"),
    ("replay_session_risk", "diagnosis_session ((snapshot -> 'risk' ->> 'level'), created_at)"),
]

SQLITE_INDEXES = [
    ("replay_session_created", "diagnosis_session (created_at DESC, id DESC) WHERE deleted_at IS NULL"),
    ("replay_session_updated", "diagnosis_session (updated_at DESC, id DESC) WHERE deleted_at IS NULL"),
    ("replay_session_flight", "diagnosis_session (json_extract(snapshot, '$.fields.flight_no'))"),
    ("replay_session_position", "diagnosis_session (json_extract(snapshot, '$.fields.position'))"),
    ("replay_session_risk", "diagnosis_session (json_extract(snapshot, '$.risk.level'), created_at)"),
]

SQLITE_FTS = [
    "CREATE VIRTUAL TABLE replay_search USING fts5("
    "session_id UNINDEXED, kind UNINDEXED, body, tokenize = 'trigram')",
    "INSERT INTO replay_search (session_id, kind, body) "
    "SELECT session_id, 'message', json_extract(payload, '$.text') FROM diagnosis_event "
    "WHERE type = 'user.message'",
    "INSERT INTO replay_search (session_id, kind, body) "
    "SELECT session_id, 'report', markdown FROM diagnosis_report",
    "CREATE TRIGGER replay_search_message AFTER INSERT ON diagnosis_event "
    "WHEN new.type = 'user.message' BEGIN "
    "INSERT INTO replay_search (session_id, kind, body) "
    "VALUES (new.session_id, 'message', json_extract(new.payload, '$.text')); END",
    "CREATE TRIGGER replay_search_report_new AFTER INSERT ON diagnosis_report BEGIN "
    "INSERT INTO replay_search (session_id, kind, body) "
    "VALUES (new.session_id, 'report', new.markdown); END",
    "CREATE TRIGGER replay_search_report_changed AFTER UPDATE OF markdown ON diagnosis_report "
    "BEGIN DELETE FROM replay_search WHERE session_id = old.session_id AND kind = 'report'; "
    "INSERT INTO replay_search (session_id, kind, body) "
    "VALUES (new.session_id, 'report', new.markdown); END",
    "CREATE TRIGGER replay_search_session_gone AFTER DELETE ON diagnosis_session "
    "BEGIN DELETE FROM replay_search WHERE session_id = old.id; END",
]
SQLITE_FTS_REVERSE = [
    "DROP TRIGGER IF EXISTS replay_search_session_gone",
    "DROP TRIGGER IF EXISTS replay_search_report_changed",
    "DROP TRIGGER IF EXISTS replay_search_report_new",
    "DROP TRIGGER IF EXISTS replay_search_message",
    "DROP TABLE IF EXISTS replay_search",
]


def forwards(apps: Any, schema_editor: Any) -> None:
    run = schema_editor.execute
    if schema_editor.connection.vendor == "postgresql":
        run("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        for name, body in PG_INDEXES:
            run(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {body}")
    else:
        for name, body in SQLITE_INDEXES:
            run(f"CREATE INDEX IF NOT EXISTS {name} ON {body}")
        for statement in SQLITE_FTS:
            run(statement)


def backwards(apps: Any, schema_editor: Any) -> None:
    run = schema_editor.execute
    postgres = schema_editor.connection.vendor == "postgresql"
    names = [n for n, _ in (PG_INDEXES if postgres else SQLITE_INDEXES)]
    for name in names:
        run(f"DROP INDEX {'CONCURRENTLY ' if postgres else ''}IF EXISTS {name}")
    if not postgres:
        for statement in SQLITE_FTS_REVERSE:
            run(statement)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [("diagnosis", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
