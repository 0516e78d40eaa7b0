"""Benchmark: the approval queue with 10,000 open approvals over 500 incidents, under 50
concurrent clients, served as production serves it (gunicorn, and daphne for the record),
each server through its database pool. Prints numbers, asserts nothing.

Fills a scratch PostgreSQL database (dropped and made again: --db), shows PostgreSQL's
plan for the queue's incident page (EXPLAIN ANALYZE), then for each server: one client
alone (latency), then --clients at once for --seconds (p50/p99 per request, requests/s,
page bytes, the server's CPU per request) while a thread counts the database's backends
in pg_stat_activity.

  .venv/bin/python bench/approval_queue.py [--approvals 10000] [--incidents 500]
      [--clients 50] [--seconds 10] [--servers gunicorn,daphne] [--wrk]
      [--code BASE_CHECKOUT] [--web-workers 3] [--web-threads 4] [--access-log]
      [--keep | --reuse]
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._env import SECRETS, clean_environment, forget_keys  # noqa: E402

BIN = Path(sys.executable).parent
ACTIONS = ["dispatch_cleanup_crew", "close_taxiway", "suspend_stand_operations", "close_runway"]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def recreate(server_url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return urlsplit(server_url)._replace(path=f"/{name}").geturl()


def drop(server_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fill(approvals: int, incidents: int, decided: int, rng: random.Random) -> None:
    """`incidents` waiting sessions copied from one real session (its snapshot: risk,
    impact), and `approvals` open approvals spread over them, deadlines as the agent sets
    them (per risk class) from creation times over the last few minutes."""
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.utils import timezone

    from approvals.models import Approval
    from diagnosis.actions import do_create_session
    from diagnosis.models import Session, ToolCall
    from scenarios_admin.models import Scenario

    call_command("migrate", verbosity=0)
    call_command("load_builtin", verbosity=0)
    call_command("seed_demo", verbosity=0)
    operator = User.objects.get(username="operator")
    template = do_create_session(
        operator,
        Scenario.objects.get(slug="oil_spill"),
        "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏",
    )
    template.refresh_from_db()
    sessions = Session.objects.bulk_create(
        Session(
            scenario_id=template.scenario_id,
            scenario_version_id=template.scenario_version_id,
            title=f"bench incident {n}",
            created_by_id=operator.pk,
            status="waiting_user",
            snapshot=template.snapshot,
        )
        for n in range(incidents)
    )
    now = timezone.now()
    calls = ToolCall.objects.bulk_create(
        [
            ToolCall(
                session=sessions[n % incidents],
                call_id=f"bench-{n}",
                tool_name=ACTIONS[n % len(ACTIONS)],
                risk_class=("R1", "R2", "R3")[rng.randrange(3)],
                is_action=True,
                idempotency_key=f"bench-{n}",
                request_payload={"taxiway": "B"},
                status="awaiting_approval",
            )
            for n in range(approvals)
        ],
        batch_size=2000,
    )
    # The history: approvals decided long ago, which the queue must not pay for (the
    # partial index holds the open ones only).
    past = ToolCall.objects.bulk_create(
        [
            ToolCall(
                session=sessions[n % incidents],
                call_id=f"bench-past-{n}",
                tool_name=ACTIONS[n % len(ACTIONS)],
                risk_class=("R1", "R2", "R3")[n % 3],
                is_action=True,
                idempotency_key=f"bench-past-{n}",
                request_payload={"taxiway": "B"},
                status="rejected",
            )
            for n in range(decided)
        ],
        batch_size=2000,
    )
    Approval.objects.bulk_create(
        (
            Approval(
                tool_call=call,
                session_id=call.session_id,
                risk_class=call.risk_class,
                action_name=call.tool_name,
                digest="0" * 64,
                status="rejected",
                reason="bench history",
                deadline=now - timedelta(hours=1),
            )
            for call in past
        ),
        batch_size=2000,
    )
    Approval.objects.bulk_create(
        [
            Approval(
                tool_call=call,
                session_id=call.session_id,
                risk_class=call.risk_class,
                action_name=call.tool_name,
                digest="0" * 64,
                deadline=now
                + timedelta(
                    minutes=_minutes(call.risk_class), seconds=-rng.randrange(300)
                ),  # created over the last five minutes
            )
            for call in calls
        ],
        batch_size=2000,
    )


def _minutes(risk_class: str) -> int:
    from django.conf import settings

    return int(settings.AERO_APPROVAL_TIMEOUT_MINUTES[risk_class])


def explain() -> list[str]:
    """PostgreSQL's plan for the queue's first incident page."""
    from django.db import connection

    from approvals.presenters import QUEUE_PAGE, open_approvals, open_incidents

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE approvals_approval")
        cursor.execute("VACUUM ANALYZE diagnosis_session")
        # The page joins the approvals' calls: without their statistics (autovacuum has
        # not run on a table filled a moment ago) PostgreSQL scans all 50,000.
        cursor.execute("VACUUM ANALYZE diagnosis_toolcall")
        sql, params = open_incidents(open_approvals(), None)[
            : QUEUE_PAGE + 1
        ].query.sql_with_params()
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        return [row[0] for row in cursor.fetchall()]


def login_cookie(username: str) -> str:
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.get(username=username))
    return f"sessionid={client.cookies['sessionid'].value}"


def start_server(
    kind: str,
    port: int,
    env: dict[str, str],
    log: Path,
    code: Path = ROOT,
    workers: int = 3,
    threads: int = 4,
    access_log: bool = False,
) -> subprocess.Popen[bytes]:
    if kind == "gunicorn":
        # As `make run` starts it (scripts/run.sh): AERO_WEB_WORKERS processes x
        # AERO_WEB_THREADS threads, a pool of threads + 1 each.
        args = [str(BIN / "gunicorn"), "aero.wsgi:application", "--bind", f"127.0.0.1:{port}",
                "--worker-class", "gthread", "--workers", str(workers), "--threads", str(threads),
                "--backlog", "1024", "--env", f"AERO_DB_POOL_SIZE={threads + 1}"]  # fmt: skip
        if access_log:
            args += ["--access-logfile", "-"]  # as scripts/run.sh: a line a request
    else:
        args = [str(BIN / "daphne"), "-e", f"tcp:port={port}:interface=127.0.0.1:backlog=1024",
                "aero.asgi:application"]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(args, cwd=code, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_up(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    give_up = time.monotonic() + 120
    while time.monotonic() < give_up:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/accounts/login/")
            if conn.getresponse().status < 500:
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"server on {port} did not come up: {log.read_text()[-2000:]}")


def backends(db: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [db],
        )
        return int(cursor.fetchone()[0])


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system) of the server process and its children so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the name: state, ppid, ... utime (12th), stime (13th).
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def wrk_load(port: int, path: str, cookie: str, clients: int, seconds: float) -> dict[str, Any]:
    """The same load from `wrk` (C, two threads): the Python client's own CPU (50
    threads parsing 200 KB answers) competes with the server on these two cores."""
    out = subprocess.run(
        ["wrk", "-t2", f"-c{clients}", f"-d{max(1, round(seconds))}s", "--latency",
         "--timeout", "60s", "-H", f"Cookie: {cookie}", f"http://127.0.0.1:{port}{path}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip

    def ms(text: str) -> float:
        # wrk writes 812.00us, 41.32ms or 1.20s.
        for unit, scale in (("us", 0.001), ("ms", 1.0), ("s", 1000.0)):
            if text.endswith(unit):
                return float(text[: -len(unit)]) * scale
        return float(text)

    found: dict[str, Any] = {"failed": 0}
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["50%"]:
            found["p50"] = ms(words[1])
        elif words[:1] == ["99%"]:
            found["p99"] = ms(words[1])
        elif "requests in" in line:
            found["requests"] = int(words[0])
        elif words[:1] == ["Requests/sec:"]:
            found["rps"] = float(words[1])
        elif "Non-2xx" in line or words[:1] == ["Socket"]:
            found["failed"] += sum(int(w.rstrip(",")) for w in words if w.rstrip(",").isdigit())
    return found


def load(
    port: int, path: str, cookie: str, clients: int, seconds: float, db: str
) -> dict[str, Any]:
    """`clients` threads requesting `path` back to back for `seconds`: per-request times,
    page bytes, and the most backends seen on the database meanwhile."""
    times: list[float] = []
    sizes: list[int] = []
    failures = 0
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    seen: list[int] = []
    done = threading.Event()

    def client() -> None:
        nonlocal failures
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            try:
                conn.request("GET", path, headers={"Cookie": cookie})
                response = conn.getresponse()
                body = response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                ok, body = False, b""
            with lock:
                if ok:
                    times.append((time.perf_counter() - started) * 1000)
                    sizes.append(len(body))
                else:
                    failures += 1

    def count() -> None:
        from django.db import connections

        try:
            while not done.is_set():
                seen.append(backends(db))
                done.wait(0.05)
        finally:
            connections.close_all()

    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    done.set()
    counter.join(timeout=10)
    return {
        "requests": len(times),
        "failed": failures,
        "rps": len(times) / elapsed,
        "p50": pct(times, 0.5),
        "p99": pct(times, 0.99),
        "kb": statistics.median(sizes) / 1024 if sizes else 0.0,
        "backends_max": max(seen, default=0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get(
        "AERO_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL server's maintenance database (the bench makes its own)")  # fmt: skip
    parser.add_argument("--db", default="aero_bench_queue")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--approvals", type=int, default=10_000)
    parser.add_argument("--incidents", type=int, default=500)
    parser.add_argument("--decided", type=int, default=40_000, help="closed approvals (history)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--servers", default="gunicorn,daphne")
    parser.add_argument("--port", type=int, default=18700)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--reuse", action="store_true", help="measure a database --keep kept")
    parser.add_argument(
        "--code", type=Path, default=ROOT, help="serve this checkout (a base to compare)"
    )
    parser.add_argument("--web-workers", type=int, default=3, help="gunicorn processes")
    parser.add_argument("--web-threads", type=int, default=4, help="gunicorn threads each")
    parser.add_argument(
        "--wrk", action="store_true", help="many clients from wrk (apt-get install wrk)"
    )
    parser.add_argument(
        "--access-log", action="store_true", help="gunicorn logs each request, as run.sh's"
    )
    args = parser.parse_args()

    db_url = (
        urlsplit(args.database_url)._replace(path=f"/{args.db}").geturl()
        if args.reuse
        else recreate(args.database_url, args.db)
    )
    name = f"aero-bench-queue-{uuid.uuid4().hex[:8]}"
    data_dir = tempfile.mkdtemp(prefix="aero-bench-")
    env = {
        "DATABASE_URL": db_url,
        "REDIS_URL": args.redis_url,
        "AERO_JOB_BACKEND": "rq",
        "AERO_LLM_WAITS": "0",
        "AERO_QUEUE": name,
        "AERO_CHANNEL_PREFIX": name,
        "AERO_DATA_DIR": data_dir,
        "AERO_WEB_TICK_SECONDS": "0",  # no sweeper in the servers: the queue stays as filled
        **{f"AERO_RATE_{s}_PER_MINUTE": "0" for s in ("LOGIN", "ANONYMOUS", "API", "INGEST")},
    }
    for key, value in {**SECRETS, **env}.items():
        os.environ[key] = value
    os.environ["AERO_JOB_BACKEND"] = "inline"  # the template session runs here, at once
    os.environ["DJANGO_SETTINGS_MODULE"] = "aero.settings"
    import django

    django.setup()
    servers: list[subprocess.Popen[bytes]] = []
    try:
        started = time.perf_counter()
        if not args.reuse:
            fill(args.approvals, args.incidents, args.decided, random.Random(37))
        print(
            f"{'reused' if args.reuse else 'filled'} {args.approvals} open approvals over "
            f"{args.incidents} incidents "
            f"({args.decided} decided) "
            f"in {time.perf_counter() - started:.1f} s; load {os.getloadavg()[0]:.1f}"
        )
        print("plan of the queue's incident page:")
        for line in explain():
            print("  " + line)
        cookie = login_cookie("approver")
        rows = []
        for n, kind in enumerate(k for k in args.servers.split(",") if k):
            port = args.port + n
            log = Path(data_dir) / f"{kind}.log"
            server = start_server(
                kind,
                port,
                {**clean_environment(), **env},
                log,
                args.code,
                args.web_workers,
                args.web_threads,
                args.access_log,
            )
            servers.append(server)
            wait_up(port, server, log)
            load(port, "/approvals/", cookie, 2, 1.0, args.db)  # warm up
            cpu = server_cpu(server.pid)
            alone = load(port, "/approvals/", cookie, 1, min(args.seconds, 5), args.db)
            alone["cpu_ms"] = (server_cpu(server.pid) - cpu) * 1000 / max(1, alone["requests"])
            cpu = server_cpu(server.pid)
            if args.wrk:
                many = wrk_load(port, "/approvals/", cookie, args.clients, args.seconds)
                many.update(kb=alone["kb"], backends_max=backends(args.db))
            else:
                many = load(port, "/approvals/", cookie, args.clients, args.seconds, args.db)
            many["cpu_ms"] = (server_cpu(server.pid) - cpu) * 1000 / max(1, many["requests"])
            rows.append((kind, 1, alone))
            rows.append((kind, args.clients, many))
            server.terminate()
            server.wait(timeout=30)
        print(f"load at the end {os.getloadavg()[0]:.1f} (1 min), cpus {os.cpu_count()}")
        print(
            "| server | clients | requests | failed | req/s | p50 ms | p99 ms | page KB "
            "| server CPU ms/request | backends in use (max) |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for kind, clients, row in rows:
            print(
                f"| {kind} | {clients} | {row['requests']} | {row['failed']} | {row['rps']:.1f} "
                f"| {row['p50']:.0f} | {row['p99']:.0f} | {row['kb']:.0f} | {row['cpu_ms']:.1f} "
                f"| {row['backends_max']} |"
            )
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drop(args.database_url, args.db)
        forget_keys(args.redis_url, name)


if __name__ == "__main__":
    main()
