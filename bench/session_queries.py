"""Where one offline oil-spill session's queries and CPU go, from creation to its first
approval wait (issue 8, worker side). Prints; asserts nothing.

  .venv/bin/python bench/session_queries.py [--db aero_bench_head] [--profile] [--top 40]

Runs this checkout against a scratch PostgreSQL database (dropped and re-created; the
default `aero_bench_head` is the one bench/perf.py uses for this tree) with the inline job
backend, and counts every statement of Django's connection and of the LangGraph
checkpointer's own connection, grouped by SQL shape and by the first project frame that
issued it. `--profile` adds a cProfile of the CPU of a later session (warm process).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import re
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._env import in_process  # noqa: E402

STAND_FUEL_LEAK = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"


def shape(sql: str) -> str:
    """The statement without its values: numbers, strings and IN lists collapse."""
    sql = re.sub(r"'(?:[^']|'')*'", "?", sql)
    sql = re.sub(r"\b\d+(\.\d+)?\b", "?", sql)
    sql = re.sub(r"\((?:\s*(?:%s|\?)\s*,?)+\)", "(?...)", sql)
    sql = re.sub(r'SAVEPOINT "[^"]+"', "SAVEPOINT ?", sql)
    sql = re.sub(r"\s+", " ", sql).strip()
    lock = next((f" ... {m}" for m in ("FOR UPDATE", "FOR SHARE") if m in sql), "")
    return sql[: 150 - len(lock)] + lock


def caller() -> str:
    """The innermost frame of this project's code (not Django, LangGraph or this file)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename
        if str(ROOT) in path and "/.venv/" not in path and not path.endswith(__file__):
            return f"{Path(path).relative_to(ROOT)}:{frame.lineno} {frame.name}"
    return "?"


class Capture:
    def __init__(self) -> None:
        self.statements: list[tuple[str, str, str]] = []  # (connection, shape, caller)
        self.commits = 0
        # (connection, transactions before it, shape, caller), in the order they ran.
        self.order: list[tuple[str, int, str, str]] = []

    def django(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        from django.db import connection

        self.statements.append(("django", shape(sql), caller()))
        self.order.append(("django", self.commits, shape(sql)[:110], caller()))
        if not connection.in_atomic_block:
            self.commits += 1  # autocommit: its own transaction
        return execute(sql, params, many, context)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default="aero_bench_head")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument(
        "--trace", action="store_true", help="every statement in order, with its transaction"
    )
    args = parser.parse_args()

    subprocess.run(
        ["psql", args.database_url, "-qc", f"DROP DATABASE IF EXISTS {args.db} WITH (FORCE)",
         "-c", f"CREATE DATABASE {args.db}"],
        check=True, capture_output=True,
    )  # fmt: skip
    os.environ["DATABASE_URL"] = urlsplit(args.database_url)._replace(path=f"/{args.db}").geturl()
    in_process()
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    import django

    django.setup()
    import psycopg
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection

    from diagnosis.actions import do_create_session
    from scenarios_admin.models import Scenario

    call_command("migrate", verbosity=0)
    call_command("load_builtin", verbosity=0)
    call_command("seed_demo", verbosity=0)
    operator = User.objects.get(username="operator")
    scenario = Scenario.objects.get(slug="oil_spill")

    def run() -> Any:
        session = do_create_session(operator, scenario, STAND_FUEL_LEAK)
        session.refresh_from_db()
        assert session.status == "waiting_user", session.status
        return session

    run()  # warm: compiled graph, checkpointer connection, caches
    capture = Capture()
    django_conn = connection.connection
    saver_statements: list[tuple[str, str, str]] = []
    saver_transactions = [0]
    original_execute = psycopg.Cursor.execute
    original_many = psycopg.Cursor.executemany
    original_transaction = psycopg.Connection.transaction

    def saver_statement(cursor: Any, query: Any) -> None:
        text = shape(query if isinstance(query, str) else str(query))
        saver_statements.append(("checkpointer", text, caller()))
        capture.order.append(("checkpointer", capture.commits, text[:110], caller()))
        if cursor.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            saver_transactions[0] += 1  # autocommit: its own transaction

    def saver_execute(cursor: Any, query: Any, *a: Any, **k: Any) -> Any:
        if cursor.connection is not django_conn:
            saver_statement(cursor, query)
        return original_execute(cursor, query, *a, **k)

    def saver_many(cursor: Any, query: Any, *a: Any, **k: Any) -> Any:
        if cursor.connection is not django_conn:
            saver_statement(cursor, query)
        return original_many(cursor, query, *a, **k)

    def saver_transaction(conn: Any, *a: Any, **k: Any) -> Any:
        if conn is not django_conn:
            saver_transactions[0] += 1  # a transaction block: BEGIN ... COMMIT
        return original_transaction(conn, *a, **k)

    psycopg.Connection.transaction = saver_transaction  # type: ignore[method-assign,assignment]

    psycopg.Cursor.execute = saver_execute  # type: ignore[method-assign,assignment]
    psycopg.Cursor.executemany = saver_many  # type: ignore[method-assign,assignment]
    original_commit = connection.commit

    def commit() -> None:
        capture.commits += 1
        original_commit()

    connection.commit = commit  # type: ignore[method-assign]
    started = time.process_time()
    with connection.execute_wrapper(capture.django):
        run()
    cpu = (time.process_time() - started) * 1000
    connection.commit = original_commit  # type: ignore[method-assign]
    psycopg.Cursor.execute = original_execute  # type: ignore[method-assign]
    psycopg.Cursor.executemany = original_many  # type: ignore[method-assign]
    psycopg.Connection.transaction = original_transaction  # type: ignore[method-assign]

    statements = capture.statements
    verbs = Counter(s.split()[0].upper() for _, s, _ in statements)
    print(f"Django connection: {len(statements)} statements, {capture.commits} transactions")
    print("  by verb:", dict(verbs.most_common()))
    print(f"  SELECT ... FOR UPDATE: {sum('FOR UPDATE' in s for _, s, _ in statements)}")
    savepoints = Counter(w for _, s, w in statements if s.startswith("SAVEPOINT"))
    print("  savepoints by caller:", dict(savepoints.most_common()))
    print(
        f"Checkpointer connection: {len(saver_statements)} statements,"
        f" {saver_transactions[0]} transactions"
    )
    print(
        f"Both: {len(statements) + len(saver_statements)} statements,"
        f" {capture.commits + saver_transactions[0]} transactions (issue 8: <= 60 / <= 15)"
    )
    print(f"CPU of the session (warm process): {cpu:.0f} ms")
    print(f"\nBy shape (top {args.top}):")
    everything = statements + saver_statements
    for (conn, text), count in Counter((c, s) for c, s, _ in everything).most_common(args.top):
        print(f"{count:4d} {conn[:5]} {text}")
    print(f"\nBy caller (top {args.top}):")
    for (conn, where), count in Counter((c, w) for c, _, w in everything).most_common(args.top):
        print(f"{count:4d} {conn[:5]} {where}")

    if args.trace:
        print("\nIn order (django: transactions committed before it):")
        for conn, commits, text, where in capture.order:
            print(f"  {conn[:5]} {commits:3d} {where:45.45s} {text}")

    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        run()
        profiler.disable()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
        stats.print_stats(45)
        print(out.getvalue())
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())


if __name__ == "__main__":
    main()
