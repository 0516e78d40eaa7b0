"""In-process measurements for bench/perf_measure.py: the tree's Django set up in this
process, CPU, statements and transactions per session, and page times through the test
client (only what the base tree has too)."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STAND_FUEL_LEAK = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def setup(tree: Path, mode: str, job_backend: str) -> None:
    sys.path.insert(0, str(tree))
    os.chdir(tree)
    if mode == "embedded":
        os.environ.pop("DATABASE_URL", None)
        os.environ.pop("REDIS_URL", None)
    os.environ["AERO_JOB_BACKEND"] = job_backend
    os.environ.setdefault("AERO_DATA_DIR", tempfile.mkdtemp(prefix="aero-bench-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "aero.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("load_builtin", verbosity=0)
    call_command("seed_demo", verbosity=0)


class Counter:
    """Queries and transactions on Django's connection: a statement outside an atomic
    block is a transaction of its own (autocommit); an atomic block is one commit."""

    def __init__(self) -> None:
        from django.db import connection

        self.connection = connection
        self.queries = 0
        self.transactions = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.queries += 1
        if not self.connection.in_atomic_block:
            self.transactions += 1
        return execute(sql, params, many, context)

    def __enter__(self) -> Counter:
        self._wrap = self.connection.execute_wrapper(self)
        self._wrap.__enter__()
        original = self.connection.commit

        def commit() -> None:
            self.transactions += 1
            original()

        self._original = original
        self.connection.commit = commit  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.connection.commit = self._original  # type: ignore[method-assign]
        self._wrap.__exit__(*exc)


def user(name: str) -> Any:
    from django.contrib.auth.models import User

    return User.objects.get(username=name)


def new_session(text: str = STAND_FUEL_LEAK) -> Any:
    from diagnosis.actions import do_create_session
    from scenarios_admin.models import Scenario

    return do_create_session(user("operator"), Scenario.objects.get(slug="oil_spill"), text)


class SaverCounter:
    """Statements on the LangGraph checkpointer's own psycopg connection (PostgreSQL
    only: the SQLite saver's connection cannot be hooked)."""

    def __init__(self) -> None:
        self.statements = 0

    def __enter__(self) -> SaverCounter:
        import psycopg
        from django.db import connection

        django_conn = connection.connection
        self._originals = (psycopg.Cursor.execute, psycopg.Cursor.executemany)
        counter = self

        def hook(original: Any) -> Any:
            def run(cursor: Any, *args: Any, **kwargs: Any) -> Any:
                if cursor.connection is not django_conn:
                    counter.statements += 1
                return original(cursor, *args, **kwargs)

            return run

        psycopg.Cursor.execute = hook(self._originals[0])  # type: ignore[method-assign]
        psycopg.Cursor.executemany = hook(self._originals[1])  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        import psycopg

        psycopg.Cursor.execute, psycopg.Cursor.executemany = self._originals  # type: ignore[method-assign]


def per_session(samples: int) -> dict[str, Any]:
    from django.db import connection

    from diagnosis.actions import do_create_session
    from scenarios_admin.models import Scenario

    new_session()  # warm: the compiled graph and the checkpointer's connection
    cpu, queries, transactions, saver = [], [], [], []
    postgres = connection.vendor == "postgresql"
    # The operator and the scenario are the creation's inputs (the request's user, the
    # form's choice), read before counting: the figure is the session's own work.
    operator, scenario = user("operator"), Scenario.objects.get(slug="oil_spill")
    for _ in range(samples):
        hooked = SaverCounter() if postgres else contextlib.nullcontext()
        with Counter() as counter, hooked as saver_counter:
            started = time.process_time()
            session = do_create_session(operator, scenario, STAND_FUEL_LEAK)
            cpu.append((time.process_time() - started) * 1000)
        session.refresh_from_db()
        assert session.status == "waiting_user", session.status
        queries.append(counter.queries)
        transactions.append(counter.transactions)
        saver.append(getattr(saver_counter, "statements", None))
    return {
        "cpu_ms": statistics.median(cpu),
        "queries": statistics.median(queries),
        "transactions": statistics.median(transactions),
        "checkpointer_queries": statistics.median(saver) if postgres else None,
    }


def login_cookie(name: str) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user(name))
    return f"sessionid={client.cookies['sessionid'].value}"


def big_session(events: int) -> Any:
    from diagnosis.events import append_event

    session = new_session()
    for n in range(events):
        append_event(session.pk, "agent.note", {"text": f"bench note {n}"}, producer="bench")
    session.refresh_from_db()
    return session


def open_approvals(count: int) -> None:
    """`count` open approvals, bulk-inserted (10 per session)."""
    from approvals.models import Approval
    from diagnosis.models import Session, ToolCall

    template = new_session()
    template.refresh_from_db()
    sessions = [
        Session(
            scenario_id=template.scenario_id,
            scenario_version_id=template.scenario_version_id,
            title=f"bench {n}",
            created_by_id=template.created_by_id,
            status="waiting_user",
            snapshot=template.snapshot,
        )
        for n in range((count + 9) // 10)
    ]
    Session.objects.bulk_create(sessions)
    calls = ToolCall.objects.bulk_create(
        ToolCall(
            session=sessions[n // 10],
            call_id=f"bench-{n}",
            tool_name="dispatch_cleanup_crew",
            risk_class=("R1", "R2", "R3")[n % 3],
            is_action=True,
            idempotency_key=f"bench-{sessions[n // 10].pk}-{n}",
            request_payload={"position": "105"},
            status="awaiting_approval",
        )
        for n in range(count)
    )
    Approval.objects.bulk_create(
        Approval(
            tool_call=call,
            session_id=call.session_id,
            risk_class=call.risk_class,
            action_name=call.tool_name,
            digest="0" * 64,
            # as the agent opens them: R1-R3 requests time out (lifts alone do not)
            deadline=Approval.deadline_for(call.risk_class),
        )
        for call in calls
    )


def page_times(url: str, who: str, repeat: int, cpu: list[float] | None = None) -> list[float]:
    """Wall-clock ms of each request; with `cpu`, this process's CPU ms of each too (the
    view and template work, which a loaded machine does not inflate as it does the wall
    clock; the database server's own time is left out)."""
    from django.test import Client

    client = Client()
    client.force_login(user(who))
    times = []
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        if cpu is not None:
            cpu.append((time.process_time() - started_cpu) * 1000)
        assert response.status_code == 200, response.status_code
    return times


def pages(events: int, approvals: int, repeat: int) -> dict[str, Any]:
    session = big_session(events)
    session_cpu: list[float] = []
    session_ms = page_times(f"/sessions/{session.pk}/", "operator", repeat, session_cpu)
    # Ten times the events: the page must not grow with the log (older events paged).
    longer = big_session(events * 10)
    longer_cpu: list[float] = []
    longer_ms = page_times(f"/sessions/{longer.pk}/", "operator", repeat, longer_cpu)
    open_approvals(approvals)
    # The unpaginated queue renders every open approval: measure it fewer times.
    queue_ms = page_times("/approvals/", "approver", max(1, repeat // 5))
    return {
        "session_page_p50_ms": pct(session_ms, 0.5),
        "session_page_cpu_p50_ms": pct(session_cpu, 0.5),
        "session_page_long_p50_ms": pct(longer_ms, 0.5),
        "session_page_long_cpu_p50_ms": pct(longer_cpu, 0.5),
        "queue_page_p50_ms": pct(queue_ms, 0.5),
    }
