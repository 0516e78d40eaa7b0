"""IT diagnosis offline: a bundle checked and concluded (DuckDB over its files), at a small
and a large size. Prints CPU, wall time and peak RSS; asserts nothing.

Goals (issue 31): 20k log lines concluded in < 1 s of CPU; 1M log lines and 100k metric
samples in < 5 s wall and < 500 MB RSS.

    .venv/bin/python bench/diagnosis.py                 # both sizes
    .venv/bin/python bench/diagnosis.py --lines 2000 --samples 2000   # one tiny run
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--lines", type=int, help="one run with this many log lines")
    parser.add_argument("--samples", type=int, default=10_000, help="metric samples of that run")
    args = parser.parse_args()
    sizes = [(args.lines, args.samples)] if args.lines else [(20_000, 10_000), (1_000_000, 100_000)]
    for lines, samples in sizes:
        print(json.dumps(measure(lines, samples)), flush=True)


if __name__ == "__main__":
    main()
