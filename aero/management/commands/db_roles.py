"""Set up the PostgreSQL role the app connects as, run as the tables' owner.

    DATABASE_URL=$DATABASE_OWNER_URL manage.py migrate
    DATABASE_URL=$DATABASE_OWNER_URL manage.py db_roles --app-url "$DATABASE_URL"

The app's role (the user in --app-url) is created if missing (LOGIN, the URL's password,
no superuser, no CREATEROLE/CREATEDB), owns nothing of AERO's, and gets SELECT, INSERT,
UPDATE and DELETE on every table except the append-only ones (the audit log and the
event log), where it gets SELECT and INSERT only. Run it again after every migrate:
new tables get their grants. Refuses an app URL that names the owner or a superuser:
such a role could rewrite or wipe the logs.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from psycopg import sql

# Append-only tables: the app may read and add, never change or remove.
APPEND_ONLY = ("aero_auditlog", "diagnosis_event")
FULL_RIGHTS = "SELECT, INSERT, UPDATE, DELETE"


class Command(BaseCommand):
    help = "Create/grant the app's PostgreSQL role (run as the owner, after migrate)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--app-url", required=True, help="The URL the app connects with.")

    def handle(self, *args: Any, app_url: str, **options: Any) -> None:
        if connection.vendor != "postgresql":
            raise CommandError("db_roles is for PostgreSQL (embedded mode has no roles).")
        parts = urlsplit(app_url)
        role = unquote(parts.username or "")
        password = unquote(parts.password or "")
        if not role:
            raise CommandError("--app-url names no user: postgres://ROLE:PASSWORD@host/db")
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            owner = cursor.fetchone()[0]
            if role == owner:
                raise CommandError(
                    f"The app must not connect as {owner}, the owner of the tables: "
                    "give it a role of its own in DATABASE_URL."
                )
            cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [role])
            found = cursor.fetchone()
            name = sql.Identifier(role)
            if found is None:
                statement = sql.SQL(
                    "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE"
                ).format(name)
                if password:
                    statement = sql.SQL("{} PASSWORD {}").format(statement, sql.Literal(password))
                cursor.execute(statement)
                self.stdout.write(f"created role {role}")
            elif found[0]:
                raise CommandError(
                    f"{role} is a superuser: it could rewrite the audit log. "
                    "Give the app a role without SUPERUSER."
                )
            database = sql.Identifier(connection.settings_dict["NAME"])
            tables = self._tables(cursor)
            for statement in (
                sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, name),
                # CREATE: LangGraph's checkpointer creates its own tables at first use.
                sql.SQL("GRANT USAGE, CREATE ON SCHEMA public TO {}").format(name),
                sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {}").format(name),
            ):
                cursor.execute(statement)
            for table in tables:
                rights = "SELECT, INSERT" if table in APPEND_ONLY else FULL_RIGHTS
                cursor.execute(
                    sql.SQL("REVOKE ALL ON {} FROM {}").format(sql.Identifier(table), name)
                )
                cursor.execute(
                    sql.SQL("GRANT {} ON {} TO {}").format(
                        sql.SQL(rights),
                        sql.Identifier(table),
                        name,
                    )
                )
        self.stdout.write(
            f"{role}: SELECT, INSERT on {', '.join(APPEND_ONLY)}; "
            f"SELECT, INSERT, UPDATE, DELETE on the {len(tables) - len(APPEND_ONLY)} other tables"
        )

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
