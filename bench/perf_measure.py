"""One tree's measurements for bench/perf.py (prints one JSON object, asserts nothing).

Runs against the source tree given by --tree (this checkout, or a temporary worktree of
the base commit), so it only uses what both trees have: do_create_session, append_event,
render_updates (either signature), the page URLs, `manage.py aero_worker`, daphne.

  python bench/perf_measure.py --tree DIR --mode embedded|services [--what ...]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
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


# --- services: rq worker, daphne, gunicorn -------------------------------------------


def start(args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        env={**os.environ, **env},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


def workers(count: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    return [
        start(
            [sys.executable, "manage.py", "aero_worker"],
            logs / f"worker{n}.log",
            AERO_JOB_BACKEND="rq",
            AERO_RECONCILE_SECONDS="5",
        )
        for n in range(count)
    ]


def wait_statuses(ids: list[Any], timeout: float) -> dict[Any, float]:
    from diagnosis.models import Session

    done: dict[Any, float] = {}
    deadline = time.monotonic() + timeout
    while len(done) < len(ids) and time.monotonic() < deadline:
        rows = Session.objects.filter(pk__in=[i for i in ids if i not in done])
        for pk in rows.filter(status__in=["waiting_user", "completed", "failed"]).values_list(
            "pk", flat=True
        ):
            done[pk] = time.monotonic()
        time.sleep(0.005)
    return done


def rq_latency(samples: int, logs: Path) -> dict[str, Any]:
    procs = workers(1, logs)
    try:
        time.sleep(3)  # the worker imports langgraph and connects
        new_wait = wait_statuses([new_session().pk], 60)  # warm up
        assert new_wait, "the worker did not run the warm-up session"
        latencies = []
        for _ in range(samples):
            started = time.monotonic()
            session = new_session()
            done = wait_statuses([session.pk], 60)
            latencies.append((done.get(session.pk, float("inf")) - started) * 1000)
    finally:
        stop(procs)
    return {"rq_p50_ms": pct(latencies, 0.5), "rq_p95_ms": pct(latencies, 0.95)}


def at_once(count: int, timeout: float, logs: Path) -> dict[str, Any]:
    import django_rq
    from django.conf import settings

    from diagnosis.models import AgentRun

    connection = django_rq.get_queue(settings.AERO_QUEUE).connection
    before = len(list(connection.scan_iter("rq:job:*", count=1000)))
    procs = workers(2, logs)
    try:
        time.sleep(3)
        started = time.monotonic()
        ids = [new_session().pk for _ in range(count)]
        done = wait_statuses(ids, timeout)
        elapsed = (max(done.values()) - started) if len(done) == count else float("inf")
        jobs = len(list(connection.scan_iter("rq:job:*", count=1000))) - before
        runs = AgentRun.objects.filter(session_id__in=ids, parent__isnull=True).count()
        # Jobs the workers ran (a duplicate that found the lease taken counts too): one
        # per session when each was enqueued once. Read before the workers exit.
        from rq import Worker

        queue = django_rq.get_queue(settings.AERO_QUEUE)
        executed = sum(w.successful_job_count + w.failed_job_count for w in Worker.all(queue=queue))
    finally:
        stop(procs)
    return {
        "at_once_sessions": count,
        "at_once_done": len(done),
        "at_once_s": elapsed,
        "at_once_jobs": jobs,
        "at_once_runs": runs,
        "at_once_executed": executed,
    }


def diagnoses_at_once(count: int, timeout: float, logs: Path) -> dict[str, Any]:
    """Issue 31's load: `count` diagnoses of the three example bundles submitted at once,
    on 2 workers, until each has concluded (its fix waiting for approval, or done)."""
    from diagnosis.models import Session
    from packs.diagnosis.sessions import start_from_bundle

    examples = sorted((Path.cwd() / "packs/diagnosis/data/examples").glob("ex-*.tar.gz"))
    procs = workers(2, logs)
    try:
        time.sleep(3)
        started = time.monotonic()
        operator = user("operator")
        ids = [
            start_from_bundle(operator, examples[n % len(examples)], {}).pk for n in range(count)
        ]
        done = wait_statuses(ids, timeout)
        elapsed = (max(done.values()) - started) if len(done) == count else float("inf")
    finally:
        stop(procs)
    concluded = sum(
        1
        for snapshot in Session.objects.filter(pk__in=ids).values_list("snapshot", flat=True)
        if (snapshot or {}).get("root_cause")
    )
    return {"diag_at_once_s": elapsed, "diag_at_once_done": len(done), "diag_concluded": concluded}


def only_workers_missing(body: bytes) -> bool:
    """/healthz fails while no worker beats (correct in production). The bench stops its
    workers between phases, and one stopped may leave its row behind until it is swept,
    so a server whose only failed checks are the workers' is up for the phases that need
    none (push, pages)."""
    try:
        checks = json.loads(body)["checks"]
    except (ValueError, KeyError, TypeError):
        return False
    failed = {name for name, value in checks.items() if str(value).startswith("failed")}
    return bool(failed) and failed <= {"workers", "llm_runner"}


def wait_up(url: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            host, port = url.split("//")[1].split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=2)
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            if response.status == 200 or only_workers_missing(response.read()):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up")


def daphne(port: int, logs: Path) -> subprocess.Popen[bytes]:
    return start(
        [str(Path(sys.executable).parent / "daphne"), "-e",
         f"tcp:port={port}:interface=127.0.0.1:backlog=1024", "aero.asgi:application"],
        logs / f"daphne{port}.log",
        AERO_JOB_BACKEND="rq",
    )  # fmt: skip


def gunicorn(port: int, logs: Path) -> subprocess.Popen[bytes]:
    return start(
        [str(Path(sys.executable).parent / "gunicorn"), "aero.wsgi:application", "--bind",
         f"127.0.0.1:{port}", "--worker-class", "gthread", "--workers", "3", "--threads", "4",
         "--backlog", "1024"],
        logs / f"gunicorn{port}.log",
        AERO_JOB_BACKEND="rq",
    )  # fmt: skip


def uvicorn(port: int, logs: Path) -> subprocess.Popen[bytes]:
    return start(
        [str(Path(sys.executable).parent / "uvicorn"), "aero.asgi:application", "--host",
         "127.0.0.1", "--port", str(port), "--workers", "3", "--backlog", "1024",
         "--no-access-log"],
        logs / f"uvicorn{port}.log",
        AERO_JOB_BACKEND="rq",
    )  # fmt: skip


# The viewers run in a process of their own (as browsers do): in the appending process
# they would wait for its GIL, and the appends' own time would count as push latency.
VIEWERS = r"""
import asyncio, json, re, sys, time
from websockets.asyncio.client import connect

config = json.loads(sys.argv[1])
failed = 0

async def viewer(url):
    global failed
    try:
        ws = await connect(url, additional_headers=config["headers"], open_timeout=60)
    except Exception:
        failed += 1
        return
    session = url.split("/ws/sessions/")[1].split("/")[0]
    async with ws:
        async for message in ws:
            now = time.time()
            for seq in re.findall(r'data-seq="(\d+)"', str(message)):
                print(f"M {session} {seq} {now}", flush=True)

async def main():
    tasks = [asyncio.ensure_future(viewer(url)) for url in config["urls"]]
    await asyncio.sleep(config["settle"])
    print(f"READY {failed}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed
    for task in tasks:
        task.cancel()

asyncio.run(main())
"""


def live_push(
    viewers: int, sessions: int, events: int, port: int, logs: Path, processes: int = 1
) -> dict[str, Any]:
    """`viewers` sockets spread over `sessions` sessions and over `processes` daphne
    processes (ports port, port + 1 ...: the viewers spread over them as the kernel
    spreads them over the processes sharing one socket under `make run`); `events` rounds
    of one event per session; commit -> message latency for every (viewer, event)."""
    from urllib.parse import quote

    from diagnosis.events import append_event
    from diagnosis.presenters import composer_key

    servers = [daphne(port + n, logs) for n in range(processes)]
    base = f"http://127.0.0.1:{port}"
    try:
        for n in range(processes):
            wait_up(f"http://127.0.0.1:{port + n}")
        targets = [new_session_no_job() for _ in range(sessions)]
        # The URL the session page opens: with the answer box it shows and its language.
        # Without `composer` the first push re-sent every viewer the answer box, with its
        # panel's reads (~18 ms a session), which the page never asks for.
        config = {
            "urls": [
                f"ws://127.0.0.1:{port + n % processes}/ws/sessions/{targets[n % sessions].pk}/"
                f"?last_seq={targets[n % sessions].last_seq}"
                f"&composer={quote(composer_key(targets[n % sessions]))}&lang=en"
                for n in range(viewers)
            ],
            "headers": {"Cookie": login_cookie("auditor"), "Origin": base},
            "settle": 3 + viewers / 50,  # handshakes and catch-up
        }
        client = subprocess.Popen(
            [sys.executable, "-c", VIEWERS, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdout is not None and client.stdin is not None
        received: list[tuple[str, int, float]] = []
        failed_handshakes = 0
        for line in client.stdout:
            if line.startswith("READY"):
                failed_handshakes = int(line.split()[1])
                break
        reader = threading.Thread(
            target=lambda: received.extend(
                (p[1], int(p[2]), float(p[3]))
                for p in (line.split() for line in client.stdout or ())
                if p and p[0] == "M"
            ),
            daemon=True,
        )
        reader.start()
        committed: dict[tuple[str, int], float] = {}
        cpu_before = sum(process_cpu_ms(server.pid) for server in servers)
        for round_ in range(events):
            for session in targets:
                # From before the append (its commit and notice inside): an upper bound.
                started = time.time()
                event = append_event(session.pk, "agent.note", {"text": f"r{round_}"}, producer="b")
                committed[(str(session.pk), event.seq)] = started
            time.sleep(0.5)
        expected = (viewers - failed_handshakes) * events
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sum(1 for s, q, _ in list(received) if (s, q) in committed) >= expected:
                break
            time.sleep(0.1)
        server_cpu_ms = sum(process_cpu_ms(server.pid) for server in servers) - cpu_before
        client.stdin.close()
        client.wait(timeout=30)
        reader.join(timeout=10)
    finally:
        stop(servers)
    latencies = [(at - committed[(s, q)]) * 1000 for s, q, at in received if (s, q) in committed]
    return {
        "push_viewers": viewers,
        "push_sessions": sessions,
        "push_processes": processes,
        "push_p50_ms": pct(latencies, 0.5),
        "push_p99_ms": pct(latencies, 0.99),
        "push_received": len(latencies),
        "push_expected": viewers * events,
        "push_failed_handshakes": failed_handshakes,
        # The servers' CPU per event delivered to all its viewers: unlike the latencies,
        # it hardly depends on what else the machine runs.
        "push_cpu_ms_per_event": server_cpu_ms / max(1, events * sessions),
    }


def process_cpu_ms(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc), in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def new_session_no_job() -> Any:
    """A session with a few events, no job (the push bench appends its own)."""
    import diagnosis.actions as actions

    original = actions.enqueue_advance
    actions.enqueue_advance = lambda session_id: None  # type: ignore[assignment]
    try:
        session = new_session()
    finally:
        actions.enqueue_advance = original  # type: ignore[assignment]
    session.refresh_from_db()
    return session


def throughput(base: str, path: str, cookie: str, clients: int, seconds: float) -> float:
    host, port = base.split("//")[1].split(":")
    count = 0
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client() -> None:
        nonlocal count
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        while time.monotonic() < stop_at:
            try:
                conn.request("GET", path, headers={"Cookie": cookie})
                response = conn.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                continue
            if ok:
                with lock:
                    count += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return count / (time.monotonic() - started)


def concurrent_pages(clients: int, seconds: float, port: int, logs: Path, head: bool) -> dict:
    session = big_session(200)
    cookie = login_cookie("operator")
    path = f"/sessions/{session.pk}/"
    results = {}
    # The tree's own way of serving HTTP (base: daphne; this change: gunicorn beside
    # daphne), then the same views under plain gunicorn for reference.
    # With this change, also the alternatives for the record: daphne alone and
    # uvicorn's ASGI workers (when installed), three processes as gunicorn has.
    servers: list[tuple[str, Callable[[int, Path], subprocess.Popen[bytes]]]] = [
        ("served", gunicorn if head else daphne),
        ("gunicorn", gunicorn),
    ]
    if head:
        servers.append(("daphne", daphne))
        if (Path(sys.executable).parent / "uvicorn").exists():
            servers.append(("uvicorn", uvicorn))
    for name, server in servers:
        process = server(port, logs)
        try:
            wait_up(f"http://127.0.0.1:{port}")
            throughput(f"http://127.0.0.1:{port}", path, cookie, 2, 1.0)  # warm up
            results[f"pages_{name}_rps"] = throughput(
                f"http://127.0.0.1:{port}", path, cookie, clients, seconds
            )
        finally:
            stop([process])
        port += 1
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=Path, required=True)
    parser.add_argument("--mode", choices=("embedded", "services"), required=True)
    parser.add_argument("--head", action="store_true", help="the tree is this change")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--open", type=int, default=2000)
    parser.add_argument("--at-once", type=int, default=40)
    parser.add_argument("--at-once-timeout", type=float, default=150)
    parser.add_argument("--diagnoses", type=int, default=100)
    parser.add_argument("--viewers", type=int, default=100)
    parser.add_argument("--push-sessions", type=int, default=1)
    parser.add_argument("--viewers-per-session", type=int, default=1)
    parser.add_argument("--ws-processes", type=int, default=1, help="daphne processes")
    parser.add_argument("--events", type=int, default=5)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--port", type=int, default=18500)
    parser.add_argument("--what", default="all")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="aero-bench-logs-"))
    # Comma-separated: all, inline (per session + views), session (per session only),
    # views (the two pages at one client), rq, push, pages (concurrent clients).
    what = set(args.what.split(",")) if args.what != "all" else {"inline", "rq", "push", "pages"}
    if "inline" in what:
        what |= {"session", "views"}
    inline_first = args.mode == "embedded" or bool(what & {"session", "views"})
    setup(args.tree, args.mode, "inline" if inline_first else "rq")
    out: dict[str, Any] = {"mode": args.mode, "logs": str(logs)}
    if "session" in what:
        out.update(per_session(args.samples))
    if "views" in what:
        out.update(pages(200, args.open, args.samples * 5))
    if args.mode == "services" and "rq" in what:
        from django.conf import settings

        settings.AERO_JOB_BACKEND = "rq"
        out.update(rq_latency(args.samples * 3, logs))
        out.update(at_once(args.at_once, args.at_once_timeout, logs))
        if args.head:  # the base has no diagnosis pack
            out.update(diagnoses_at_once(args.diagnoses, args.at_once_timeout, logs))
    if args.mode == "services" and "push" in what:
        processes = args.ws_processes
        out.update(live_push(args.viewers, 1, args.events, args.port, logs, processes))
        if args.push_sessions > 1:
            watching = args.push_sessions * args.viewers_per_session
            many = live_push(watching, args.push_sessions, args.events, args.port, logs, processes)
            out.update({f"many_{k}": v for k, v in many.items()})
    if args.mode == "services" and "pages" in what:
        out.update(concurrent_pages(args.clients, args.seconds, args.port + 10, logs, args.head))
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
