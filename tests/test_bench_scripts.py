"""The benchmarks are how the speed goals are checked (`make bench`), so each must run:
every script once at a tiny size, on this run's own scratch databases and Redis keys. A
merge once left `bench/perf.py` with two `--what` options, and `bench/history_search.py`
stopped at a NOT NULL column its COPY left out: `make bench` printed no figure."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.db import connection

from tests.settings import TEST_DB_NAME

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SCRIPTS = sorted(path.name for path in BENCH.glob("*.py") if not path.name.startswith("_"))
# perf.py runs perf_measure.py on each tree: measured through it.
DRIVEN_BY_ANOTHER = {"perf_measure.py": "perf.py"}


def test_every_benchmark_is_checked() -> None:
    assert "perf.py" in SCRIPTS and "llm_bound.py" in SCRIPTS
    assert set(SCRIPTS) == set(tiny_runs("x", "redis://h/1", "postgres://h/p")) | set(
        DRIVEN_BY_ANOTHER
    ), "a new benchmark needs a tiny run here"


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_benchmark_starts_and_prints_its_usage(script: str) -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


def tiny_runs(suffix: str, redis_url: str, server: str) -> dict[str, tuple[list[str], str]]:
    """Each script's arguments at a tiny size, and a line its figures print."""
    redis_db = urlsplit(redis_url).path.strip("/") or "0"
    services = ["--database-url", server, "--redis-url", redis_url, "--redis-db", redis_db]
    tiny_llm = ["--sessions", "2", "--latency", "0.1", "--only", "waits"]
    # This checkout only: a base tree would be this same commit measured again (the
    # point is that the script runs); `make bench` compares with the base.
    tiny_perf = ["--base", "none", "--what", "session,push", "--samples", "1"]
    # The push at a tiny size: 4 viewers of one session over this checkout's 2 daphne
    # processes (the many-sessions run needs --push-sessions above 1).
    tiny_perf += ["--viewers", "4", "--push-sessions", "1", "--events", "1"]
    port = str(18600 + int(redis_db) * 10)  # one per worker: two run at once
    queue_db = [
        "--database-url",
        server,
        "--redis-url",
        redis_url,
        "--db",
        f"aero_bench_aq{suffix}",
    ]
    tiny_queue = ["--approvals", "60", "--incidents", "6", "--decided", "30", "--clients", "3"]
    tiny_queue += ["--seconds", "1"]
    tiny_queue += ["--servers", "gunicorn"]
    return {
        "diagnosis.py": (
            [
                *("--lines", "2000", "--samples", "200"),
                *("--modes", "--runs", "1", "--db", f"aero_bench_dm{suffix}"),
                *("--database-url", server),
            ],
            "hierarchical / react: statements",
        ),
        "history_search.py": (["--scale", "0.001", "--requests", "2"], "newest first"),
        "replay_step.py": (["--events", "200", "--requests", "2"], "step page, random step"),
        "timeline_render.py": (["--sessions", "1", "--events", "50"], "render 200 timeline"),
        "restart.py": (["--restarts", "1"], "unchanged steps skipped"),
        "session_queries.py": (
            ["--db", f"aero_bench_sq{suffix}", "--database-url", server],
            "Django connection:",
        ),
        "llm_bound.py": (
            [*services, *tiny_llm, "--db-suffix", suffix],
            "waiting after",
        ),
        "perf.py": (
            [*services, *tiny_perf, "--db-suffix", suffix, "--port", port],
            "| ",
        ),
        "slow_tools.py": (
            [*services, "--sessions", "2", "--latency", "0.5", "--db-suffix", suffix],
            "0.5 s tool: all 2 sessions done in",
        ),
        "approval_queue.py": (
            [*queue_db, *tiny_queue, "--port", str(18650 + int(redis_db) * 10)],
            "| gunicorn | 3 |",
        ),
        "job_cpu.py": (
            ["--sessions", "2", "--warm", "1", "--database-url", server, "--db-suffix", suffix],
            '"statements_per_job"',
        ),
        "session_page.py": (
            [
                *("--repeat", "2", "--services", "--database-url", server),
                # The script appends the database number to a server's URL.
                *("--redis-url", redis_url.rsplit("/", 1)[0], "--redis-db", redis_db),
                *("--db-suffix", suffix),
            ],
            '"events_2000_cpu_p50_ms"',
        ),
    }


@pytest.fixture
def scratch() -> Iterator[tuple[str, str, str]]:
    """A suffix unique to this run and worker, the server's maintenance URL, and the
    databases the benches make, dropped afterwards."""
    params = connection.settings_dict
    server = f"postgres://{params['USER'] or 'postgres'}@{params['HOST'] or '127.0.0.1'}:"
    server += f"{params['PORT'] or 5432}/postgres"
    # The worker's test database name, whether or not it was set up yet (this test runs
    # early: tests/conftest.py starts the long ones first).
    suffix = "_" + TEST_DB_NAME.removeprefix("test_")
    history = f"aero_bench_hs{suffix}"
    subprocess.run(["psql", server, "-qc", f"CREATE DATABASE {history}"], check=True)
    yield suffix, server, history
    names = [history, f"aero_bench_sq{suffix}", f"aero_bench_llm{suffix}", f"aero_bench_dm{suffix}"]
    names += [f"aero_bench_aq{suffix}", f"aero_bench_slow{suffix}"]
    names += [f"aero_bench_jobcpu{suffix}", f"aero_bench_page{suffix}"]
    names += [f"aero_bench_{tree}{suffix}" for tree in ("base", "head")]
    # One psql for them all (each -c its own statement): nine psql starts took 0.8 s at
    # load 10, one 0.1 s; dropping the few that exist is the rest of the teardown.
    drops = [a for name in names for a in ("-c", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")]
    subprocess.run(["psql", server, "-q", *drops])


@pytest.mark.long
@pytest.mark.services
@pytest.mark.parametrize("script", [s for s in SCRIPTS if s not in DRIVEN_BY_ANOTHER])
def test_the_benchmark_runs_at_a_tiny_size_and_prints_its_figures(
    script: str, scratch: tuple[str, str, str]
) -> None:
    suffix, server, history = scratch
    if connection.vendor != "postgresql":
        pytest.skip("the benchmarks need PostgreSQL")
    arguments, figure = tiny_runs(suffix, str(settings.REDIS_URL), server)[script]
    # Not the caller's PROMETHEUS_MULTIPROC_DIR: run.sh empties that folder at start.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AERO_", "DJANGO_", "PROMETHEUS_"))
    }
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    if script == "history_search.py":
        env["DATABASE_URL"] = f"{server.rsplit('/', 1)[0]}/{history}"
    result = subprocess.run(
        [sys.executable, str(BENCH / script), *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    assert figure in result.stdout, result.stdout[-2000:]
