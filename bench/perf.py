"""Issue 8's goals, measured for the base commit and for this checkout in the same run,
side by side with the ratio. Prints; asserts nothing.

  .venv/bin/python bench/perf.py [--base a141182|none] [--at-once 40] [--viewers 100] ...

The base commit is checked out into a temporary `git worktree` (removed afterwards).
Embedded mode (SQLite, inline jobs) is measured for the in-process figures; the others
need PostgreSQL and Redis: DATABASE_URL and REDIS_URL name the servers (defaults: this
machine), and each tree gets scratch databases `aero_bench_base` / `aero_bench_head`
(dropped and re-created; `--db-suffix _p` makes them `aero_bench_base_p` ..., so two
runs do not collide) and Redis database AERO_BENCH_REDIS_DB (default 13, flushed).
Scale options keep `make bench` to a few minutes; the table says what ran.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._env import clean_environment, forget_keys  # noqa: E402

MEASURE = ROOT / "bench" / "perf_measure.py"


def run_tree(tree: Path, mode: str, head: bool, db: str, args: argparse.Namespace) -> dict:
    env = clean_environment()
    env["AERO_DATA_DIR"] = tempfile.mkdtemp(prefix=f"aero-bench-{mode}-")
    if mode == "services":
        pg = urlsplit(args.database_url)
        subprocess.run(
            ["psql", args.database_url, "-qc", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)",
             "-c", f"CREATE DATABASE {db}"],
            check=True, capture_output=True,
        )  # fmt: skip
        env["DATABASE_URL"] = pg._replace(path=f"/{db}").geturl()
        redis = urlsplit(args.redis_url)._replace(path=f"/{args.redis_db}").geturl()
        forget_keys(redis, f"bench-{db}")  # a run stopped earlier may have left some
        env["REDIS_URL"] = redis
        env["AERO_QUEUE"] = f"bench-{db}"
        env["AERO_CHANNEL_PREFIX"] = f"bench-{db}"
    command = [
        sys.executable, str(MEASURE), "--tree", str(tree), "--mode", mode,
        "--samples", str(args.samples), "--open", str(args.open),
        "--at-once", str(args.at_once), "--viewers", str(args.viewers),
        "--diagnoses", str(args.diagnoses),
        "--push-sessions", str(args.push_sessions), "--events", str(args.events),
        "--viewers-per-session", str(args.viewers_per_session),
        "--push-clients", str(args.push_clients), "--push-rate", str(args.push_rate),
        # The base served WebSockets from one daphne; this change from several.
        "--ws-processes", str(args.ws_processes if head else 1),
        "--clients", str(args.clients), "--seconds", str(args.seconds),
        "--port", str(args.port + (0 if head else 100)), "--what", args.what,
        "--at-once-timeout", str(args.at_once_timeout),
    ] + (["--head"] if head else [])  # fmt: skip
    print(f"  measuring {'this change' if head else 'base'} ({mode}) ...", flush=True)
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    finally:
        if mode == "services":
            forget_keys(env["REDIS_URL"], f"bench-{db}")
    for line in result.stdout.splitlines():
        if line.startswith("RESULT "):
            data: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return data
    print(result.stdout[-2000:], result.stderr[-4000:], sep="\n")
    return {}


def fmt(value: Any, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "did not finish"
    if isinstance(value, float):
        return f"{value:,.1f}{unit}"
    return f"{value}{unit}"


def ratio(base: Any, head: Any, higher_is_better: bool = False) -> str:
    try:
        b, h = float(base), float(head)
    except (TypeError, ValueError):
        return ""
    if not (math.isfinite(b) and math.isfinite(h)) or b == 0 or h == 0:
        return ""
    if b == h:
        return "same"
    return (
        f"{(h / b if higher_is_better else b / h):.1f}x better"
        if ((h > b) if higher_is_better else (h < b))
        else f"{(b / h if higher_is_better else h / b):.1f}x worse"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--base", default="a141182", help="the commit to compare with; 'none': this checkout only"
    )
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))  # fmt: skip
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--redis-db", default=os.environ.get("AERO_BENCH_REDIS_DB", "13"))
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--open", type=int, default=2000, help="open approvals on the queue page")
    parser.add_argument(
        "--at-once", type=int, default=20, help="sessions submitted at once (goal: 1000)"
    )
    parser.add_argument(
        "--at-once-timeout", type=float, default=150, help="seconds to wait for them all"
    )
    parser.add_argument(
        "--what",
        default="all",
        help="comma-separated: all, inline (session + page times), session (per session "
        "only), rq (the worker), push, pages (concurrent clients)",
    )
    parser.add_argument(
        "--diagnoses", type=int, default=100, help="IT diagnoses at once (this checkout)"
    )
    parser.add_argument("--viewers", type=int, default=100)
    parser.add_argument(
        "--push-sessions", type=int, default=20, help="viewers on as many sessions (goal: 100)"
    )
    parser.add_argument("--viewers-per-session", type=int, default=1)
    parser.add_argument(
        "--ws-processes", type=int, default=2, help="daphne processes serving this checkout"
    )
    parser.add_argument("--events", type=int, default=3)
    parser.add_argument(
        "--push-clients", type=int, default=1, help="client processes the viewers are spread over"
    )
    parser.add_argument(
        "--push-rate",
        type=float,
        default=0,
        help="events a second over all sessions, spread evenly (0: each round back to back)",
    )
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--port", type=int, default=18500)
    parser.add_argument(
        "--db-suffix", default="", help="appended to the scratch databases' names (parallel runs)"
    )
    args = parser.parse_args()

    results: dict[str, dict[str, Any]] = {}
    trees: list[tuple[bool, str, Path]] = [(True, "head", ROOT)]
    git = ["git", "-C", str(ROOT), "worktree"]
    if args.base != "none":
        tree = Path(tempfile.mkdtemp(prefix="aero-base-")) / "tree"
        subprocess.run([*git, "add", "--detach", "-q", str(tree), args.base], check=True)
        (tree / ".venv").symlink_to(Path(sys.executable).parent.parent)
        trees.insert(0, (False, "base", tree))
    try:
        for head, label, source in trees:
            for mode in ("embedded", "services"):
                data = run_tree(source, mode, head, f"aero_bench_{label}{args.db_suffix}", args)
                results[f"{label}-{mode}"] = data
    finally:
        if args.base != "none":
            subprocess.run([*git, "remove", "--force", str(tree)], check=False)

    def row(figure: str, goal: str, key: str, mode: str, unit: str, higher: bool = False) -> None:
        base = results.get(f"base-{mode}", {}).get(key)
        head = results.get(f"head-{mode}", {}).get(key)
        cells = [f"{figure} [{mode}]", goal, fmt(base, unit), fmt(head, unit)]
        # Counts that should equal the sessions submitted (jobs, runs) have no "better".
        counts = ("at_once_jobs", "at_once_runs", "at_once_executed", "diag_concluded")
        compared = "" if key in counts else ratio(base, head, higher)
        print("| " + " | ".join([*cells, compared]) + " |")

    n, v, d = args.at_once, args.viewers, args.diagnoses
    m = f"{args.push_sessions * args.viewers_per_session} viewers"
    p = f"{args.ws_processes} daphne processes (base: 1)"
    print(f"\nIssue 8 goals: base {args.base} vs this checkout, same run, same machine.")
    print(
        f"Scale: {n} sessions at once (goal 1,000), {v} viewers on one session, "
        f"{m} on {args.push_sessions} sessions, {args.events} events each, {p}, "
        f"{args.open} open approvals, {args.clients} clients x {args.seconds:g} s.\n"
    )
    print("| figure | goal | base | this change | ratio |")
    print("|---|---|---|---|---|")
    for mode in ("embedded", "services"):
        row("CPU per offline session to its first wait", "< 150 ms", "cpu_ms", mode, " ms")
        row("queries per session to its first wait", "<= 60", "queries", mode, "")
        row("transactions per session to its first wait", "<= 15", "transactions", mode, "")
        row("  + checkpointer statements (own connection)", "", "checkpointer_queries", mode, "")
        row("session page (200 events) p50", "< 40 ms", "session_page_p50_ms", mode, " ms")
        row("session page (2,000 events) p50", "< 100 ms", "session_page_long_p50_ms", mode, " ms")
        row("  its CPU p50, 200 events", "", "session_page_cpu_p50_ms", mode, " ms")
        row("  its CPU p50, 2,000 events", "", "session_page_long_cpu_p50_ms", mode, " ms")
        row(f"queue page, {args.open} open, p50", "< 200 ms", "queue_page_p50_ms", mode, " ms")
    rows: list[tuple[str, str, str, str, bool]] = [
        ("create -> first approval wait p50, 1 rq worker", "", "rq_p50_ms", " ms", False),
        ("create -> first approval wait p95, 1 rq worker", "< 300 ms", "rq_p95_ms", " ms", False),
        (f"{n} sessions at once, 2 workers: all waiting", "< 120 s", "at_once_s", " s", False),
        (f"{n} sessions at once: at their wait", "all", "at_once_done", "", True),
        (f"{n} sessions at once: rq jobs created", "one each", "at_once_jobs", "", False),
        (f"{n} sessions at once: agent runs", "", "at_once_runs", "", False),
        (f"{n} sessions at once: jobs the workers ran", "one each", "at_once_executed", "", False),
        (
            f"{d} IT diagnoses at once, 2 workers: all concluded",
            "< 60 s",
            "diag_at_once_s",
            " s",
            False,
        ),
        (f"{d} IT diagnoses at once: with a root cause", "all", "diag_concluded", "", True),
        (f"commit -> browser p50, {v} viewers, 1 session", "", "push_p50_ms", " ms", False),
        (f"commit -> browser p99, {v} viewers, 1 session", "< 50 ms", "push_p99_ms", " ms", False),
        (f"failed handshakes, {v} at once", "0", "push_failed_handshakes", "", False),
        (f"  unanswered when the events began, {v}", "0", "push_unanswered_handshakes", "", False),
        (f"  seconds until all {v} were answered", "", "push_handshakes_s", " s", False),
        (f"  sockets the server closed, {v}", "0", "push_closed", "", False),
        (f"deliveries received, {v} viewers", "all", "push_received", "", True),
        (f"deliveries expected, {v} viewers", "", "push_expected", "", True),
        (f"deliveries received, {m}", "all", "many_push_received", "", True),
        (f"deliveries expected, {m}", "", "many_push_expected", "", True),
        (f"failed handshakes, {m}", "0", "many_push_failed_handshakes", "", False),
        (f"  unanswered, {m}", "0", "many_push_unanswered_handshakes", "", False),
        (f"  seconds until all {m} were answered", "", "many_push_handshakes_s", " s", False),
        (f"  sockets the server closed, {m}", "0", "many_push_closed", "", False),
        (f"daphne CPU per event, {v} viewers", "", "push_cpu_ms_per_event", " ms", False),
        (f"  viewers given an event twice, {v}", "0", "push_repeated", "", False),
        (f"  client CPU per event, {v} viewers", "", "push_client_cpu_ms_per_event", " ms", False),
        (f"  viewers given an event twice, {m}", "0", "many_push_repeated", "", False),
        (f"  client CPU per event, {m}", "", "many_push_client_cpu_ms_per_event", " ms", False),
        (
            f"commit -> browser p50, {m} on {args.push_sessions} sessions",
            "",
            "many_push_p50_ms",
            " ms",
            False,
        ),
        (
            f"daphne CPU per event, {m} on {args.push_sessions} sessions",
            "",
            "many_push_cpu_ms_per_event",
            " ms",
            False,
        ),
        (
            f"commit -> browser p99, {m} on {args.push_sessions} sessions",
            "< 50 ms",
            "many_push_p99_ms",
            " ms",
            False,
        ),
        (f"  events committed a second, {v} viewers", "", "push_events_per_s", "", True),
        (f"  events committed a second, {m}", "", "many_push_events_per_s", "", True),
        (
            f"session page, {args.clients} clients, as served",
            "",
            "pages_served_rps",
            " req/s",
            True,
        ),
        ("same, plain gunicorn", "", "pages_gunicorn_rps", " req/s", True),
        ("same, daphne alone", "", "pages_daphne_rps", " req/s", True),
        ("same, uvicorn, 3 workers", "", "pages_uvicorn_rps", " req/s", True),
    ]
    for figure, goal, key, unit, higher in rows:
        row(figure, goal, key, "services", unit, higher)
    for label in ("base", "head"):
        data = results.get(f"{label}-services", {})
        served, plain = data.get("pages_served_rps"), data.get("pages_gunicorn_rps")
        if served and plain:
            print(f"{label}: served / gunicorn = {served / plain:.2f}x (goal >= 1.0x)")
    print("\nRaw:", json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
