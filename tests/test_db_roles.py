"""The app's PostgreSQL role owns nothing and creates nothing, against an owner without
SUPERUSER (as docs/security.md asks): whatever it tries to plant where the owner looks (an
operator, a function, a view, a trigger) is refused, so the owner's `migrate` runs none
of it; LangGraph's tables are the owner's; `db_roles` changes the grants in one
transaction."""

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
from django.db import connection

from diagnosis.jobs import close_agent_runtime
from tests.servers import PYTHON, ROOT, service_env

# The copy is made from the test database, which these tests (transactional) create.
pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

# What an app role with CREATE on `public` planted in the reported attack, and more.
PLANTS = {
    "log": "CREATE TABLE public.planted_calls (who text); "
    "GRANT INSERT ON public.planted_calls TO PUBLIC",
    "operator's function": """
        CREATE FUNCTION public.planted_eq(varchar, varchar) RETURNS boolean
        LANGUAGE plpgsql AS $$ BEGIN
            INSERT INTO public.planted_calls VALUES (current_user);
            RETURN $1::text = $2::text;
        END $$""",
    "operator": "CREATE OPERATOR public.= "
    "(LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = public.planted_eq)",
    "function": """
        CREATE FUNCTION public.lower(varchar) RETURNS text
        LANGUAGE plpgsql AS $$ BEGIN
            INSERT INTO public.planted_calls VALUES (current_user);
            RETURN pg_catalog.lower($1::text);
        END $$""",
    "view": "CREATE VIEW public.planted_view AS SELECT 1 AS one",
    "trigger": "CREATE TRIGGER planted AFTER INSERT ON django_migrations "
    "FOR EACH ROW EXECUTE FUNCTION replay_session_search_add()",
    "schema": "CREATE SCHEMA planted",
}


def _admin(dbname: str = "postgres") -> psycopg.Connection[Any]:
    params = connection.settings_dict
    return psycopg.connect(
        host=params["HOST"] or "127.0.0.1",
        port=params["PORT"] or 5432,
        user=params["USER"] or "postgres",
        dbname=dbname,
        autocommit=True,
    )


def _url(role: str, dbname: str, password: str = "") -> str:
    params = connection.settings_dict
    auth = f"{role}:{password}" if password else role
    return f"postgres://{auth}@{params['HOST'] or '127.0.0.1'}:{params['PORT'] or 5432}/{dbname}"


def _manage(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=ROOT,
        env=service_env(url, str(settings.REDIS_URL)),  # this run's Redis database
        timeout=300,
        capture_output=True,
        text=True,
        check=False,
    )


def _drop(admin: psycopg.Connection[Any], dbname: str, roles: list[str]) -> None:
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [dbname]
    )
    admin.execute(f'DROP DATABASE IF EXISTS "{dbname}"')
    for role in roles:
        admin.execute(f'DROP ROLE IF EXISTS "{role}"')


@pytest.fixture(scope="module")
def owned(django_db_setup: None, django_db_blocker: Any) -> Iterator[dict[str, str]]:
    """A copy of the migrated test database owned by a role without SUPERUSER (its own
    tables, functions and sequences; CREATEROLE, to create the app's role), set up by
    `db_roles` run as that owner."""
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            pytest.skip("roles are PostgreSQL's")
        template = connection.settings_dict["NAME"]
        connection.close()
    close_agent_runtime()
    dbname = f"{template}_owned"[:63]
    owner, app = f"{dbname}_owner"[:63], f"{dbname}_app"[:63]
    with _admin() as admin:
        _drop(admin, dbname, [app, owner])
        admin.execute(f'CREATE ROLE "{owner}" LOGIN NOSUPERUSER CREATEROLE')
        admin.execute(f'CREATE DATABASE "{dbname}" OWNER "{owner}"')
    # Copied by a dump, not CREATE DATABASE ... TEMPLATE: that needs the template to
    # itself, and ending its other connections broke the test servers still using it.
    dump = subprocess.run(
        ["pg_dump", "--no-owner", "--no-privileges", _url("postgres", template)],
        capture_output=True,
        check=True,
        timeout=300,
    )
    subprocess.run(
        ["psql", "-q", "-v", "ON_ERROR_STOP=1", _url("postgres", dbname)],
        input=dump.stdout,
        capture_output=True,
        check=True,
        timeout=300,
    )
    with _admin(dbname) as admin:
        admin.execute(
            f"""DO $$ DECLARE o record; BEGIN
            FOR o IN SELECT c.relname, c.relkind FROM pg_class c
                JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
                AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid
                                AND d.deptype IN ('a', 'i') AND c.relkind = 'S')
            LOOP
                EXECUTE format('ALTER %s %I OWNER TO "{owner}"',
                    CASE o.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                    WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END, o.relname);
            END LOOP;
            FOR o IN SELECT p.oid::regprocedure AS sig FROM pg_proc p
                JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'
            LOOP
                EXECUTE format('ALTER FUNCTION %s OWNER TO "{owner}"', o.sig);
            END LOOP;
            END $$"""
        )
        # The copy's audit log refuses TRUNCATE again, as in production.
        admin.execute("ALTER TABLE aero_auditlog ENABLE ALWAYS TRIGGER aero_audit_no_truncate")
    owner_url, app_url = _url(owner, dbname), _url(app, dbname, "app-pass")
    done = _manage(owner_url, "db_roles", "--app-url", app_url, "--require-unprivileged-owner")
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    try:
        yield {"db": dbname, "owner": owner, "app": app, "owner_url": owner_url, "app_url": app_url}
    finally:
        with _admin() as admin:
            _drop(admin, dbname, [app, owner])


def _owned_by(dbname: str, role: str) -> list[str]:
    with _admin(dbname) as admin:
        rows = admin.execute(
            "SELECT 'relation ' || c.relname FROM pg_class c WHERE c.relowner = %(r)s::regrole"
            " UNION ALL SELECT 'function ' || p.proname FROM pg_proc p"
            "  WHERE p.proowner = %(r)s::regrole"
            " UNION ALL SELECT 'operator ' || o.oprname FROM pg_operator o"
            "  WHERE o.oprowner = %(r)s::regrole"
            " UNION ALL SELECT 'schema ' || n.nspname FROM pg_namespace n"
            "  WHERE n.nspowner = %(r)s::regrole"
            " UNION ALL SELECT 'trigger ' || t.tgname FROM pg_trigger t"
            "  WHERE t.tgname = 'planted'",
            {"r": role},
        ).fetchall()
    return [row[0] for row in rows]


def test_the_app_role_plants_nothing_and_the_owners_migrate_runs_nothing_of_it(
    owned: dict[str, str],
) -> None:
    accepted = []
    with psycopg.connect(owned["app_url"], autocommit=True) as app:
        for name, statement in PLANTS.items():
            try:
                app.execute(statement)
            except psycopg.errors.InsufficientPrivilege:
                continue
            accepted.append(name)

    migrate = _manage(owned["owner_url"], "migrate", "--noinput", "-v0")

    assert migrate.returncode == 0, migrate.stderr
    with _admin(owned["db"]) as admin:
        log = admin.execute("SELECT to_regclass('public.planted_calls') IS NOT NULL").fetchone()
        calls = admin.execute("SELECT who FROM planted_calls").fetchall() if log and log[0] else []
    assert calls == [], f"the owner ran the app's code: {calls[:3]}"
    assert accepted == [], f"the app's role could plant: {accepted}"
    assert _owned_by(owned["db"], owned["app"]) == []


def test_langgraphs_tables_are_the_owners_and_the_app_uses_them(owned: dict[str, str]) -> None:
    with _admin(owned["db"]) as admin:
        owners = admin.execute(
            "SELECT DISTINCT tableowner FROM pg_tables WHERE tablename LIKE 'checkpoint%%'"
        ).fetchall()
    assert owners == [(owned["owner"],)]

    # The app's checkpointer starts without creating anything, and writes.
    script = (
        "from diagnosis.jobs import agent_graph; "
        "saver = agent_graph().checkpointer; "
        "saver.delete_thread('probe'); print('checkpointer ready')"
    )
    done = _manage(owned["app_url"], "shell", "-c", script)
    assert done.returncode == 0, done.stderr
    assert "checkpointer ready" in done.stdout


def test_db_roles_refuses_a_superuser_owner_when_asked(owned: dict[str, str]) -> None:
    # The suite's own database belongs to a superuser (without the flag db_roles warns:
    # tests/test_audit_integrity.py).
    with pytest.raises(CommandError, match="is a superuser"):
        call_command(
            "db_roles",
            app_url=owned["app_url"],
            require_unprivileged_owner=True,
            stderr=io.StringIO(),
        )


def test_db_roles_changes_the_grants_in_one_transaction(
    owned: dict[str, str], django_db_blocker: Any
) -> None:
    """While db_roles runs, the app's role keeps its rights on every table: a REVOKE
    committed before its GRANT failed the requests running in between with 500s."""
    seen: list[str] = []

    with psycopg.connect(owned["app_url"], autocommit=True) as app:

        def probe(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            result = execute(sql, params, many, context)
            text = str(sql)  # a psycopg sql.Composed: its repr names the parts
            if "REVOKE ALL ON" in text and "'aero_auditlog'" in text:
                try:
                    app.execute("SELECT count(*) FROM aero_auditlog")
                    seen.append("read")
                except psycopg.errors.InsufficientPrivilege as exc:
                    seen.append(str(exc))
            return result

        with django_db_blocker.unblock():
            # db_roles runs on the default connection: pointed at the copy for the call.
            saved = connection.settings_dict
            connection.close()
            connection.settings_dict = {**saved, "NAME": owned["db"], "USER": owned["owner"]}
            try:
                with connection.execute_wrapper(probe):
                    call_command(
                        "db_roles",
                        app_url=owned["app_url"],
                        stdout=io.StringIO(),
                        stderr=io.StringIO(),
                    )
            finally:
                connection.close()
                connection.settings_dict = saved

    assert seen == ["read"]
