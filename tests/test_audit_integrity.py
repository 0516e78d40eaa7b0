"""Audit integrity by privilege, not convention: the app's PostgreSQL role does not own
the audit and event tables and may only read and append to them; entries form an HMAC
chain the database keeps linked and `manage.py verify_audit` checks with the key."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.test import override_settings

from aero import audit_chain
from aero.models import AuditLog, audit
from tests.servers import PYTHON, ROOT, service_env

pytestmark = pytest.mark.services


def entry(n: int = 1) -> AuditLog:
    return audit("test.recorded", actor_label="pytest", object_type="thing", object_id=str(n))


def verify() -> str:
    out: list[str] = []

    class Stdout:
        def write(self, text: str) -> None:
            out.append(text)

    call_command("verify_audit", stdout=Stdout())
    return "".join(out)


# --- the chain ------------------------------------------------------------------------


def test_entries_are_chained_with_a_keyed_hash(db: None) -> None:
    first, second = entry(1), entry(2)

    assert first.prev_digest == audit_chain.GENESIS
    assert second.prev_digest == first.digest
    stored = AuditLog.objects.get(pk=second.pk)
    assert stored.digest == stored.compute_digest()
    assert "audit chain OK: 2 entries" in verify()
    with override_settings(AERO_AUDIT_KEY="another-key"), pytest.raises(CommandError) as bad:
        verify()
    assert f"broken at entry {first.pk}: its digest does not match its content" in str(bad.value)


def test_bulk_create_is_refused(db: None) -> None:
    with pytest.raises(PermissionError, match="one by one"):
        AuditLog.objects.bulk_create([AuditLog(action="x")])


def needs_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("roles and triggers are PostgreSQL's")


def test_verify_names_an_entry_the_owner_changed(transactional_db: None) -> None:
    needs_postgresql()
    entries = [entry(n) for n in range(3)]
    with connection.cursor() as cursor:
        # Only the owner can do this, and only by switching the trigger off first.
        cursor.execute("ALTER TABLE aero_auditlog DISABLE TRIGGER aero_audit_no_update_delete")
        cursor.execute(
            "UPDATE aero_auditlog SET detail = '{\"rewritten\": true}' WHERE id = %s",
            [entries[1].pk],
        )
        cursor.execute(
            "ALTER TABLE aero_auditlog ENABLE ALWAYS TRIGGER aero_audit_no_update_delete"
        )

    with pytest.raises(CommandError, match=f"broken at entry {entries[1].pk}: its digest"):
        verify()


def test_truncate_is_refused_even_for_the_owner_and_no_setting_allows_it(
    transactional_db: None,
) -> None:
    needs_postgresql()
    entry()
    # The suite's own database has this trigger off for its flush (conftest): switch it
    # on as in production, inside a transaction that undoes it.
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("ALTER TABLE aero_auditlog ENABLE ALWAYS TRIGGER aero_audit_no_truncate")
        cursor.execute("SET LOCAL aero.allow_audit_truncate = 'on'")  # the old escape hatch
        cursor.execute("TRUNCATE aero_auditlog")
    assert AuditLog.objects.count() == 1


# --- the app's role ---------------------------------------------------------------------


@pytest.fixture
def app_role(transactional_db: None) -> Iterator[dict[str, Any]]:
    """A role of this test database's own (roles are cluster-wide), set up by db_roles."""
    needs_postgresql()
    params = connection.settings_dict
    name = f"{params['NAME']}_app"[:63]
    host, port = params["HOST"] or "127.0.0.1", params["PORT"] or 5432
    url = f"postgres://{name}:app-pass@{host}:{port}/{params['NAME']}"
    with connection.cursor() as cursor:
        cursor.execute(f'DROP OWNED BY "{name}"' if _role_exists(cursor, name) else "SELECT 1")
        cursor.execute(f'DROP ROLE IF EXISTS "{name}"')
    stderr = io.StringIO()
    call_command("db_roles", app_url=url, stdout=io.StringIO(), stderr=stderr)
    # The suite's database belongs to a superuser: allowed, with a warning.
    assert "warning:" in stderr.getvalue() and "is a superuser" in stderr.getvalue()
    conn = psycopg.connect(host=host, port=port, dbname=params["NAME"], user=name, autocommit=True)
    try:
        yield {"conn": conn, "url": url, "name": name}
    finally:
        conn.close()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [name],
            )
            cursor.execute(f'DROP OWNED BY "{name}"')
            cursor.execute(f'DROP ROLE "{name}"')


def _role_exists(cursor: Any, name: str) -> bool:
    cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name])
    return cursor.fetchone() is not None


def refused(conn: psycopg.Connection[Any], statement: str) -> str:
    with pytest.raises(psycopg.Error) as error:
        conn.execute(statement)
    return str(error.value)


@pytest.mark.parametrize("table", ["aero_auditlog", "diagnosis_event"])
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE {table} SET id = id",
        "DELETE FROM {table}",
        "TRUNCATE {table}",
        "ALTER TABLE {table} DISABLE TRIGGER ALL",
        "ALTER TABLE {table} OWNER TO CURRENT_USER",
        "DROP TABLE {table}",
    ],
)
def test_the_app_role_cannot_change_remove_or_unprotect(
    app_role: dict[str, Any], table: str, statement: str
) -> None:
    entry()

    message = refused(app_role["conn"], statement.format(table=table))

    assert "permission denied" in message or "must be owner" in message
    assert AuditLog.objects.count() == 1


def test_the_app_role_reads_and_appends_but_the_database_checks_the_digests(
    app_role: dict[str, Any],
) -> None:
    head = entry()
    conn = app_role["conn"]
    assert conn.execute("SELECT count(*) FROM aero_auditlog").fetchone() == (1,)
    insert = (
        "INSERT INTO aero_auditlog (created_at, actor_label, action, object_type, object_id,"
        " detail, prev_digest, digest) VALUES (now(), 'intruder', 'x', 't', '1', '{{}}',"
        " '{prev}', '{digest}')"
    )

    empty = refused(conn, insert.format(prev=head.digest, digest=""))
    assert "audit_digests_are_sha256_hex" in empty
    unlinked = refused(conn, insert.format(prev=audit_chain.GENESIS, digest="a" * 64))
    assert "does not continue the chain" in unlinked

    # A well-formed, linked entry with a made-up digest gets in: only the key can tell,
    # and verify_audit holds it.
    conn.execute(insert.format(prev=head.digest, digest="b" * 64))
    forged = AuditLog.objects.get(actor_label="intruder")
    with pytest.raises(CommandError, match=f"broken at entry {forged.pk}: its digest"):
        verify()


def test_the_app_runs_as_that_role(app_role: dict[str, Any]) -> None:
    """The ORM's append (advisory lock, head, insert) and verify work with its rights."""
    entry()
    env = service_env(app_role["url"], str(settings.REDIS_URL))
    script = "from aero.models import audit; audit('test.as_app', actor_label='app')"

    subprocess.run(
        [PYTHON, "manage.py", "shell", "-c", script], cwd=ROOT, env=env, check=True, timeout=60
    )
    done = subprocess.run(
        [PYTHON, "manage.py", "verify_audit"],
        cwd=ROOT,
        env=env,
        check=False,
        timeout=60,
        capture_output=True,
        text=True,
    )

    assert "audit chain OK: 2 entries" in done.stdout, done.stdout + done.stderr
    assert AuditLog.objects.latest("id").actor_label == "app"


def test_db_roles_refuses_the_owner(transactional_db: None) -> None:
    needs_postgresql()
    params = connection.settings_dict
    owner = params["USER"] or "postgres"

    with pytest.raises(CommandError, match="must not connect as"):
        call_command("db_roles", app_url=f"postgres://{owner}@127.0.0.1/{params['NAME']}")
