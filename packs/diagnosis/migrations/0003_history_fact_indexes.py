"""Indexes for history's diagnosis filters (packs/diagnosis/web.py HISTORY_FILTERS, read
by replay.history.pack_fact): the root cause's service and problem type out of the
session's snapshot, the same expressions the search writes, then the history list's
order, without deleted sessions (as the list's own indexes). PostgreSQL builds them
CONCURRENTLY, so a live database keeps writing."""

from __future__ import annotations

from typing import Any

from django.db import migrations

PG = [
    (
        "diagnosis_pack_session_service",
        "diagnosis_session ((snapshot -> 'root_cause' ->> 'service'), created_at DESC, id DESC) "
        "WHERE deleted_at IS NULL",
    ),
    (
        "diagnosis_pack_session_problem_type",
        "diagnosis_session ((snapshot -> 'root_cause' ->> 'problem_type'), created_at DESC, id DESC) "
        "WHERE deleted_at IS NULL",
    ),
]
SQLITE = [
    (
        "diagnosis_pack_session_service",
        "diagnosis_session (json_extract(snapshot, '$.root_cause.service'), created_at DESC, id DESC) "
        "WHERE deleted_at IS NULL",
    ),
    (
        "diagnosis_pack_session_problem_type",
        "diagnosis_session (json_extract(snapshot, '$.root_cause.problem_type'), created_at DESC, id DESC) "
        "WHERE deleted_at IS NULL",
    ),
]


def forwards(apps: Any, schema_editor: Any) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    for name, body in PG if postgres else SQLITE:
        concurrently = "CONCURRENTLY " if postgres else ""
        schema_editor.execute(f"CREATE INDEX {concurrently}IF NOT EXISTS {name} ON {body}")


def backwards(apps: Any, schema_editor: Any) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    for name, _ in PG if postgres else SQLITE:
        schema_editor.execute(f"DROP INDEX {'CONCURRENTLY ' if postgres else ''}IF EXISTS {name}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [("diagnosis_pack", "0002_knowledge_search"), ("diagnosis", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
