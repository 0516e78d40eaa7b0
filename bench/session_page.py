"""The session page's CPU and wall time for one tree, embedded (issue 37 item 3): p50 of
`--repeat` requests by one operator for a session of 200 and of 2,000 events, after
one warm-up request. `--after-event`: an event is appended before each request, so no
panel or row is kept from the request before (what the first viewer of a new event
pays). Run it for the base tree and this one in turn; it prints one JSON object.

  python bench/session_page.py --tree DIR [--repeat 20] [--after-event]
      [--services --redis-db 11 --db-suffix _x]

`--services`: on PostgreSQL (a scratch database `aero_bench_page<suffix>`, dropped and
re-created) with Redis (`--redis-db`) for the caches, as production runs; embedded
(SQLite, caches in the process) otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _env import SECRETS, forget_keys


def services(database_url: str, redis_url: str, db: str) -> None:
    """This process's settings for a scratch database `db` and Redis at `redis_url`."""
    subprocess.run(
        ["psql", database_url, "-qc", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)",
         "-c", f"CREATE DATABASE {db}"],
        check=True, capture_output=True,
    )  # fmt: skip
    forget_keys(redis_url, f"bench-{db}")
    os.environ.update(SECRETS)
    os.environ["DATABASE_URL"] = urlsplit(database_url)._replace(path=f"/{db}").geturl()
    os.environ["REDIS_URL"] = redis_url
    os.environ["AERO_QUEUE"] = os.environ["AERO_CHANNEL_PREFIX"] = f"bench-{db}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--after-event", action="store_true")
    parser.add_argument("--services", action="store_true")
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "AERO_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    parser.add_argument("--redis-db", default="13")
    parser.add_argument("--db-suffix", default="")
    args = parser.parse_args()
    if args.services:
        services(
            args.database_url,
            f"{args.redis_url}/{args.redis_db}",
            f"aero_bench_page{args.db_suffix}",
        )
    # The tree's own helpers (the base tree's, when measuring the base).
    sys.path.insert(0, str(args.tree / "bench"))
    from _measure_inline import big_session, pct, setup, user

    setup(args.tree, "services" if args.services else "embedded", "inline")
    from django.test import Client

    from diagnosis.events import append_event

    out: dict[str, Any] = {"tree": str(args.tree), "load": os.getloadavg()[0]}
    for events in (200, 2000):
        session = big_session(events)
        client = Client()
        client.force_login(user("operator"))
        url = f"/sessions/{session.pk}/"
        client.get(url)  # warm: per-process caches, the rows and panels kept
        cpu, wall = [], []
        for n in range(args.repeat):
            if args.after_event:
                append_event(session.pk, "agent.note", {"text": f"more {n}"}, producer="bench")
            started, started_cpu = time.perf_counter(), time.process_time()
            response = client.get(url)
            cpu.append((time.process_time() - started_cpu) * 1000)
            wall.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.status_code
        out[f"events_{events}_cpu_p50_ms"] = round(pct(cpu, 0.5), 1)
        out[f"events_{events}_wall_p50_ms"] = round(pct(wall, 0.5), 1)
    out["load_end"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
