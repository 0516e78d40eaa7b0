"""Set up the PostgreSQL role the app connects as, run as the tables' owner.

    DATABASE_URL=$DATABASE_OWNER_URL manage.py migrate
    DATABASE_URL=$DATABASE_OWNER_URL manage.py db_roles --app-url "$DATABASE_URL"

The app's role (the user in --app-url) is created if missing (LOGIN, the URL's password,
no superuser, no CREATEROLE/CREATEDB), owns nothing and may create nothing: it gets
USAGE on schema `public` (never CREATE, which is also revoked from PUBLIC: an operator or
function it planted there would run as the next role to resolve it, the owner's
`migrate`), SELECT, INSERT, UPDATE and DELETE on every table except the append-only
ones (the audit log and the event log), where it gets SELECT and INSERT only. LangGraph's
checkpoint tables are created here, as the owner. The grants change in one transaction,
so requests running meanwhile never see a table without them. Run it again after every
migrate: new tables get their grants.

Refuses an app URL that names the owner or a superuser: such a role could rewrite or wipe
the logs. Warns when the owner is a superuser (it should own the database and its
tables, nothing more): `--require-unprivileged-owner` refuses instead.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from psycopg import sql

from aero import db_owner

# Append-only tables: the app may read and add, never change or remove.
APPEND_ONLY = ("aero_auditlog", "diagnosis_event")
FULL_RIGHTS = "SELECT, INSERT, UPDATE, DELETE"


class Command(BaseCommand):
    help = "Create/grant the app's PostgreSQL role (run as the owner, after migrate)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--app-url", required=True, help="The URL the app connects with.")
        parser.add_argument(
            "--require-unprivileged-owner",
            action="store_true",
            help="Refuse to run as a superuser (the owner should not be one).",
        )

    def handle(
        self, *args: Any, app_url: str, require_unprivileged_owner: bool = False, **options: Any
    ) -> None:
        if connection.vendor != "postgresql":
            raise CommandError("db_roles is for PostgreSQL (embedded mode has no roles).")
        parts = urlsplit(app_url)
        role = unquote(parts.username or "")
        password = unquote(parts.password or "")
        if not role:
            raise CommandError("--app-url names no user: postgres://ROLE:PASSWORD@host/db")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"
            )
            owner, owner_is_superuser = cursor.fetchone()
            if role == owner:
                raise CommandError(
                    f"The app must not connect as {owner}, the owner of the tables: "
                    "give it a role of its own in DATABASE_URL."
                )
            if owner_is_superuser:
                message = (
                    f"{owner}, the owner of the tables, is a superuser: whatever runs as it "
                    "can switch the audit triggers off. Give the database and its tables an "
                    "owner without SUPERUSER (docs/security.md)."
                )
                if require_unprivileged_owner:
                    raise CommandError(message)
                self.stderr.write(f"warning: {message}")
            cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [role])
            found = cursor.fetchone()
            if found is not None and found[0]:
                raise CommandError(
                    f"{role} is a superuser: it could rewrite the audit log. "
                    "Give the app a role without SUPERUSER."
                )
            if found is not None:
                self._take_back_what_it_owns(cursor, role, owner)
        # As the owner, before the grants: the app's role can never create them.
        for setup in db_owner.setups():
            setup(self._owner_params())
        name = sql.Identifier(role)
        with transaction.atomic(), connection.cursor() as cursor:
            if found is None:
                statement = sql.SQL(
                    "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE"
                ).format(name)
                if password:
                    statement = sql.SQL("{} PASSWORD {}").format(statement, sql.Literal(password))
                cursor.execute(statement)
                self.stdout.write(f"created role {role}")
            database = sql.Identifier(connection.settings_dict["NAME"])
            tables = self._tables(cursor)
            for statement in (
                sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, name),
                sql.SQL("REVOKE CREATE ON DATABASE {} FROM PUBLIC, {}").format(database, name),
                sql.SQL("REVOKE CREATE ON SCHEMA public FROM PUBLIC, {}").format(name),
                sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(name),
                sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {}").format(name),
            ):
                cursor.execute(statement)
            for table in tables:
                rights = "SELECT, INSERT" if table in APPEND_ONLY else FULL_RIGHTS
                # Inside the transaction: no request ever sees the table between the two.
                cursor.execute(
                    sql.SQL("REVOKE ALL ON {} FROM {}").format(sql.Identifier(table), name)
                )
                cursor.execute(
                    sql.SQL("GRANT {} ON {} TO {}").format(
                        sql.SQL(rights), sql.Identifier(table), name
                    )
                )
            # A REVOKE by a role that did not grant the right only warns: check the result.
            cursor.execute(
                "SELECT has_schema_privilege(%s, 'public', 'CREATE'),"
                " has_database_privilege(%s, current_database(), 'CREATE')",
                [role, role],
            )
            if any(cursor.fetchone()):
                raise CommandError(
                    f"{role} can still create objects (CREATE on schema public or on the "
                    f"database, granted by another role): as the database's owner run "
                    f"REVOKE CREATE ON SCHEMA public FROM PUBLIC;"
                )
        self.stdout.write(
            f"{role}: SELECT, INSERT on {', '.join(APPEND_ONLY)}; "
            f"SELECT, INSERT, UPDATE, DELETE on the {len(tables) - len(APPEND_ONLY)} other "
            "tables; no CREATE anywhere"
        )

    def _take_back_what_it_owns(self, cursor: Any, role: str, owner: str) -> None:
        """Earlier versions let the app's role create LangGraph's tables: the owner takes
        them (and anything else it made) over."""
        cursor.execute(
            "SELECT (SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner"
            "        WHERE r.rolname = %s)"
            " + (SELECT count(*) FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner"
            "    WHERE r.rolname = %s)"
            " + (SELECT count(*) FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner"
            "    WHERE r.rolname = %s)",
            [role, role, role],
        )
        if not cursor.fetchone()[0]:
            return
        try:
            with transaction.atomic():
                cursor.execute(
                    sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(sql.Identifier(role))
                )
        except Exception as exc:
            raise CommandError(
                f"{role} owns objects in this database and {owner} cannot take them over "
                f"({exc}). As a superuser: REASSIGN OWNED BY {role} TO {owner};"
            ) from exc
        self.stdout.write(f"{owner} took over what {role} owned")

    def _owner_params(self) -> dict[str, Any]:
        params = connection.get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold", "autocommit"):
            params.pop(key, None)
        return params

    def _tables(self, cursor: Any) -> list[str]:
        cursor.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tableowner = current_user ORDER BY tablename"
        )
        tables = [row[0] for row in cursor.fetchall()]
        missing = [t for t in APPEND_ONLY if t not in tables]
        if missing:
            raise CommandError(f"run migrate first ({', '.join(missing)} missing)")
        return tables
