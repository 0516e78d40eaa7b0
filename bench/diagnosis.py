"""IT diagnosis offline: a bundle checked and concluded (DuckDB over its files), at a small
and a large size. Prints CPU, wall time and peak RSS; asserts nothing.

Goals (issue 31): 20k log lines concluded in < 1 s of CPU; 1M log lines and 100k metric
samples in < 5 s wall and < 500 MB RSS.

`--modes`: the cost of a run mode (issue 35 item 7). One shipped example bundle diagnosed
as a whole session (created, gathered, concluded, its fix proposed, up to the approval
wait; jobs inline) in ReAct and in hierarchical mode, side by side: the SQL statements of
every connection (Django's, each specialist thread's, the checkpointer's) and the CPU of
the process (every thread; the MCP git server's own process not counted), the mean of
`--runs` sessions each after a warm one. Goal: hierarchical with its 4 specialists
< 3x ReAct. Needs PostgreSQL: a scratch database (`--db`, dropped and re-created).

    .venv/bin/python bench/diagnosis.py                 # both sizes
    .venv/bin/python bench/diagnosis.py --lines 2000 --samples 2000   # one tiny run
    .venv/bin/python bench/diagnosis.py --modes [--bundle ex-pool-inventory] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from packs.diagnosis.bundle import Limits, opened  # noqa: E402
from packs.diagnosis.playbook import diagnose  # noqa: E402
from packs.diagnosis.system import demo_shop  # noqa: E402

TZ = timezone(timedelta(hours=8))
REPORTED = datetime(2026, 10, 2, 11, 20, tzinfo=TZ)
SERVICES = ["gateway", "auth", "catalog", "search", "orders", "payments", "inventory"]
METRICS = [
    "http_error_ratio",
    "latency_p99_ms",
    "up",
    "db_connections_in_use",
    "db_connections_max",
]


def write_bundle(root: Path, lines: int, samples: int) -> None:
    """A bad deploy of payments at T0 = reported - 20 min, buried in `lines` log lines."""
    rng = random.Random(7)
    start = REPORTED - timedelta(minutes=120)
    t0 = REPORTED - timedelta(minutes=20)
    (root / "incident.yaml").write_text(
        f"description: payments failing\nreported_at: '{REPORTED.isoformat()}'\n", "utf-8"
    )
    span = (REPORTED - start).total_seconds()
    with (root / "logs.jsonl").open("w", encoding="utf-8") as f:
        for i in range(lines):
            at = start + timedelta(seconds=span * i / lines)
            service = SERVICES[i % len(SERVICES)]
            record: dict[str, object] = {
                "ts": at.isoformat(timespec="milliseconds"),
                "service": service,
                "level": "INFO",
                "msg": f"GET /v1/items/{rng.randrange(10**6)} 200 in {rng.randrange(90)}ms",
                "trace_id": f"{rng.getrandbits(64):016x}",
            }
            if at >= t0 and service == "payments" and i % 3 == 0:
                record.update(
                    level="ERROR",
                    msg=f"ValueError: 'signature' while handling charge {rng.randrange(10**6)}",
                    stack=["payments/app/handlers.py:26 in verify_callback"],
                )
            f.write(json.dumps(record) + "\n")
    per_series = max(1, samples // (len(SERVICES) * len(METRICS)))
    step = span / per_series
    with (root / "metrics.csv").open("w", encoding="utf-8") as f:
        f.write("ts,service,metric,value\n")
        for n in range(per_series):
            at = start + timedelta(seconds=step * n)
            for service in SERVICES:
                for metric in METRICS:
                    value = {
                        "http_error_ratio": 0.01,
                        "latency_p99_ms": 100.0,
                        "up": 1.0,
                        "db_connections_in_use": 20.0,
                    }.get(metric, 100.0)
                    if metric == "http_error_ratio" and service == "payments" and at >= t0:
                        value = 0.4
                    f.write(f"{at.isoformat(timespec='milliseconds')},{service},{metric},{value}\n")
    (root / "deploys.yaml").write_text(
        "- id: D-1\n  service: payments\n  version: '2.0'\n"
        f"  at: '{(t0 - timedelta(minutes=7)).isoformat()}'\n"
        "  files: [payments/app/handlers.py]\n",
        "utf-8",
    )


def measure(lines: int, samples: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_bundle(root, lines, samples)
        cpu, wall = time.process_time(), time.perf_counter()
        with opened(root, Limits(max_bytes=2 * 1024**3, max_log_lines=5_000_000)) as bundle:
            checked = time.perf_counter() - wall
            found = diagnose(bundle, demo_shop())
        return {
            "log_lines": lines,
            "metric_samples": bundle.metric_rows,
            "cpu_s": round(time.process_time() - cpu, 3),
            "wall_s": round(time.perf_counter() - wall, 3),
            "check_wall_s": round(checked, 3),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "conclusion": [found.hypothesis, found.service, found.deploy],
        }


class Statements:
    """Every statement any connection of the process sends (Django's on each thread and
    the checkpointer's are all psycopg cursors), counted while `on`."""

    def __init__(self) -> None:
        import psycopg

        self.count = 0
        self.on = False
        self.lock = threading.Lock()
        for name in ("execute", "executemany"):
            original = getattr(psycopg.Cursor, name)
            setattr(psycopg.Cursor, name, self._counted(original))

    def _counted(self, original: Any) -> Any:
        def counted(cursor: Any, *args: Any, **kwargs: Any) -> Any:
            if self.on:
                with self.lock:
                    self.count += 1
            return original(cursor, *args, **kwargs)

        return counted


def compare_modes(database_url: str, db: str, bundle_name: str, runs: int) -> None:
    subprocess.run(
        ["psql", database_url, "-qc", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)",
         "-c", f"CREATE DATABASE {db}"],
        check=True, capture_output=True,
    )  # fmt: skip
    from bench._env import in_process

    os.environ["DATABASE_URL"] = urlsplit(database_url)._replace(path=f"/{db}").geturl()
    in_process()
    os.chdir(ROOT)
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import override_settings

    from diagnosis.models import Session
    from packs.diagnosis.sessions import start_from_bundle

    call_command("migrate", verbosity=0)
    call_command("load_builtin", verbosity=0)
    user = User.objects.create_user("bench", password="x")
    bundle = ROOT / "packs" / "diagnosis" / "data" / "examples" / f"{bundle_name}.tar.gz"
    statements = Statements()
    stored = tempfile.mkdtemp(prefix="aero-bench-bundles-")

    def session(mode: str) -> tuple[int, float, float, str]:
        statements.count, statements.on = 0, True
        cpu, wall = time.process_time(), time.perf_counter()
        made = start_from_bundle(user, bundle, {"producer": "bench", "preferred_mode": mode})
        spent = (time.process_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000
        statements.on = False
        made = Session.objects.get(pk=made.pk)
        cause = (made.snapshot.get("root_cause") or {}).get("hypothesis", "")
        return statements.count, spent[0], spent[1], f"{made.status} {cause}"

    rows: dict[str, tuple[float, float, float, str]] = {}
    with override_settings(AERO_BUNDLE_DIR=Path(stored)):
        for mode in ("react", "hierarchical"):
            session(mode)  # warm: the compiled graphs, the connections, the caches
            measured = [session(mode) for _ in range(runs)]
            rows[mode] = (
                sum(m[0] for m in measured) / runs,
                sum(m[1] for m in measured) / runs,
                sum(m[2] for m in measured) / runs,
                measured[-1][3],
            )
    print(f"\nRun modes, {bundle_name}, to the approval wait (mean of {runs} warm sessions):")
    print("| mode | statements | CPU ms | wall ms | ended |")
    print("|---|---:|---:|---:|---|")
    for mode, (count, cpu, wall, ended) in rows.items():
        print(f"| {mode} | {count:.0f} | {cpu:.0f} | {wall:.0f} | {ended} |")
    react, hierarchical = rows["react"], rows["hierarchical"]
    print(
        f"hierarchical / react: statements {hierarchical[0] / react[0]:.2f}x,"
        f" CPU {hierarchical[1] / react[1]:.2f}x (goal < 3x)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--lines", type=int, help="one run with this many log lines")
    parser.add_argument("--samples", type=int, default=10_000, help="metric samples of that run")
    parser.add_argument(
        "--modes", action="store_true", help="ReAct vs hierarchical sessions (alone unless --lines)"
    )
    parser.add_argument("--bundle", default="ex-deploy-payments", help="the shipped example")
    parser.add_argument("--runs", type=int, default=3, help="sessions measured per mode")
    parser.add_argument("--db", default="aero_bench_modes", help="scratch database (--modes)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
    )
    args = parser.parse_args()
    sizes = [(args.lines, args.samples)] if args.lines else [(20_000, 10_000), (1_000_000, 100_000)]
    if args.modes and not args.lines:
        sizes = []
    for lines, samples in sizes:
        print(json.dumps(measure(lines, samples)), flush=True)
    if args.modes:
        compare_modes(args.database_url, args.db, args.bundle, args.runs)


if __name__ == "__main__":
    main()
