"""The audit log is append-only: in the ORM, and in PostgreSQL itself (triggers)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from aero.models import AuditLog, audit


@pytest.fixture
def entry(db: None) -> AuditLog:
    return audit(
        "test.recorded",
        actor_label="pytest",
        object_type="thing",
        object_id="1",
        detail={"why": "a fact worth keeping"},
    )


def test_audit_records_who_did_what_with_a_digest(entry: AuditLog) -> None:
    stored = AuditLog.objects.get()

    assert str(stored) == "pytest test.recorded thing:1"
    assert stored.actor is None
    assert stored.digest == stored.compute_digest()
    assert len(stored.digest) == 64


def test_saving_an_existing_row_is_refused(entry: AuditLog) -> None:
    entry.action = "test.rewritten"

    with pytest.raises(PermissionError, match="append-only"):
        entry.save()

    assert AuditLog.objects.get().action == "test.recorded"


def test_deleting_a_row_is_refused(entry: AuditLog) -> None:
    with pytest.raises(PermissionError, match="append-only"):
        entry.delete()

    assert AuditLog.objects.count() == 1


def test_queryset_update_is_refused(entry: AuditLog) -> None:
    with pytest.raises(PermissionError, match="append-only"):
        AuditLog.objects.filter(pk=entry.pk).update(action="test.rewritten")

    assert AuditLog.objects.get().action == "test.recorded"


def test_queryset_delete_is_refused(entry: AuditLog) -> None:
    with pytest.raises(PermissionError, match="append-only"):
        AuditLog.objects.all().delete()

    assert AuditLog.objects.count() == 1


def needs_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the append-only triggers exist on PostgreSQL only")


@pytest.mark.services
@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE aero_auditlog SET action = 'test.rewritten' WHERE id = %s",
        "DELETE FROM aero_auditlog WHERE id = %s",
    ],
)
def test_raw_sql_cannot_change_the_log(entry: AuditLog, sql: str) -> None:
    needs_postgresql()

    # the savepoint keeps the test's transaction usable after the refusal
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, [entry.pk])

    stored = AuditLog.objects.get()
    assert stored.action == "test.recorded"
    assert stored.digest == stored.compute_digest()
