"""The knowledge base's search indexes: PostgreSQL full text ('simple' configuration: the
items mix Chinese and English, and no stemmer knows both) and pg_trgm over search_text;
SQLite (the embedded mode) an FTS5 table the triggers keep in step."""

from __future__ import annotations

from typing import Any

from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations

PG = [
    "CREATE INDEX IF NOT EXISTS knowledge_fts_idx ON diagnosis_pack_knowledgeitem "
    "USING gin (to_tsvector('simple', search_text))",
    "CREATE INDEX IF NOT EXISTS knowledge_trgm_idx ON diagnosis_pack_knowledgeitem "
    "USING gin (search_text gin_trgm_ops)",
]
PG_REVERSE = ["DROP INDEX IF EXISTS knowledge_trgm_idx", "DROP INDEX IF EXISTS knowledge_fts_idx"]
# The trigram tokenizer: Chinese has no spaces, so words would be whole sentences.
SQLITE = [
    "CREATE VIRTUAL TABLE IF NOT EXISTS knowledge_fts USING fts5("
    "item_id UNINDEXED, body, tokenize='trigram')",
    "CREATE TRIGGER knowledge_fts_new AFTER INSERT ON diagnosis_pack_knowledgeitem BEGIN "
    "INSERT INTO knowledge_fts (item_id, body) VALUES (new.id, new.search_text); END",
    "CREATE TRIGGER knowledge_fts_changed AFTER UPDATE OF search_text "
    "ON diagnosis_pack_knowledgeitem BEGIN "
    "DELETE FROM knowledge_fts WHERE item_id = old.id; "
    "INSERT INTO knowledge_fts (item_id, body) VALUES (new.id, new.search_text); END",
    "CREATE TRIGGER knowledge_fts_gone AFTER DELETE ON diagnosis_pack_knowledgeitem BEGIN "
    "DELETE FROM knowledge_fts WHERE item_id = old.id; END",
]
SQLITE_REVERSE = [
    "DROP TRIGGER IF EXISTS knowledge_fts_gone",
    "DROP TRIGGER IF EXISTS knowledge_fts_changed",
    "DROP TRIGGER IF EXISTS knowledge_fts_new",
    "DROP TABLE IF EXISTS knowledge_fts",
]


def forwards(apps: Any, schema_editor: Any) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    for statement in PG if postgres else SQLITE:
        schema_editor.execute(statement)


def backwards(apps: Any, schema_editor: Any) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    for statement in PG_REVERSE if postgres else SQLITE_REVERSE:
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("diagnosis_pack", "0001_knowledge")]

    operations = [
        TrigramExtension(),  # does nothing on SQLite
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
