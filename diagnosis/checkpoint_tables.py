"""LangGraph's checkpoint tables on PostgreSQL, created by the tables' owner.

The app's role has no CREATE on any schema (an object it could plant in `public`, an
operator `=(varchar, varchar)` say, would run as whoever resolves it next: the owner's
`migrate`). So the owner creates the saver's tables (`manage.py db_roles`, at every
start), and the app only checks they are current before using them.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg.rows import tuple_row

# Held while the saver's migrations run: workers and db_roles starting together.
SETUP_LOCK = 7410001


def current(conn: psycopg.Connection[Any]) -> bool:
    """Whether the saver's tables exist with every migration of this LangGraph applied:
    then its `setup()` has nothing to do (and would need CREATE on the schema)."""
    from langgraph.checkpoint.postgres import PostgresSaver

    with conn.cursor(row_factory=tuple_row) as cursor:
        cursor.execute("SELECT to_regclass('checkpoint_migrations') IS NOT NULL")
        row = cursor.fetchone()
        if not (row and row[0]):
            return False
        cursor.execute("SELECT max(v) FROM checkpoint_migrations")
        row = cursor.fetchone()
    return row is not None and row[0] == len(PostgresSaver.MIGRATIONS) - 1


def try_lock(conn: psycopg.Connection[Any]) -> bool:
    with conn.cursor(row_factory=tuple_row) as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [SETUP_LOCK])
        row = cursor.fetchone()
    return bool(row and row[0])


def unlock(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pg_advisory_unlock(%s)", [SETUP_LOCK])


def create(params: dict[str, Any]) -> None:
    """Create or migrate the saver's tables on a connection of their own (the saver's
    migrations create indexes CONCURRENTLY: no transaction around them)."""
    from langgraph.checkpoint.postgres import PostgresSaver

    with psycopg.connect(**params, autocommit=True, prepare_threshold=0) as conn:
        # Try, never wait inside a statement: a blocked pg_advisory_lock call would be a
        # transaction the concurrent index builds of another setup wait for.
        while not try_lock(conn):
            time.sleep(0.1)
        try:
            if not current(conn):
                from psycopg.rows import dict_row

                conn.row_factory = dict_row
                PostgresSaver(conn).setup()
        finally:
            unlock(conn)
