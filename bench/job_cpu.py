"""A model-bound job's own CPU, in-process (issue 37 item 6): `bench/llm_bound.py`'s
sessions (the worked example, the simulated model's three replies) run with the inline
backend in this one process, and each job function (`advance_session`) is timed with
`time.thread_time` (this thread's CPU) and `time.process_time` (the process's: with the
work a job hands to other threads, LangGraph's checkpoint writes; the model calls, made
by the inline runner between two jobs, are not in either) and its statements counted.
Prints; asserts nothing. Compare trees by running each tree's copy in turn (alternating pairs):

  .venv/bin/python bench/job_cpu.py [--sessions 40] [--db-suffix _x]

Needs PostgreSQL (DATABASE_URL, default the maintenance database on 127.0.0.1; a scratch
database `aero_bench_jobcpu<--db-suffix>` is dropped and created). No Redis.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._env import SECRETS, clean_environment, wait_listening  # noqa: E402
from bench.llm_bound import (  # noqa: E402
    MESSAGE,
    free_port,
    loadavg,
    provider_and_user,
    script,
)

PY = sys.executable


def start_fake_model() -> tuple[subprocess.Popen[bytes], str]:
    """The simulated model of bench/llm_bound.py, answering at once."""
    port = free_port()
    script_file = Path(tempfile.mkdtemp(prefix="aero-bench-jobcpu-")) / "script.json"
    script_file.write_text(json.dumps(script(0.0)))
    env = clean_environment()
    env["AERO_DATA_DIR"] = str(script_file.parent)
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    fake = subprocess.Popen(
        [PY, "manage.py", "fake_llm", "--port", str(port), "--script", str(script_file)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # Not waited for here: it starts while the bench sets its database up (main waits).
    return fake, f"http://127.0.0.1:{port}/v1"


def setup(database_url: str, name: str) -> None:
    subprocess.run(
        ["psql", database_url, "-qc", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)",
         "-c", f"CREATE DATABASE {name}"],
        check=True, capture_output=True,
    )  # fmt: skip
    for key in [k for k in os.environ if k.startswith(("AERO_", "DJANGO_", "PROMETHEUS_"))]:
        del os.environ[key]
    os.environ.update(SECRETS)
    os.environ.pop("REDIS_URL", None)
    os.environ.update(
        DATABASE_URL=urlsplit(database_url)._replace(path=f"/{name}").geturl(),
        AERO_DATA_DIR=tempfile.mkdtemp(prefix="aero-bench-jobcpu-"),
        AERO_JOB_BACKEND="inline",
        AERO_LLM_WAITS="1",
        AERO_LLM_REACT="1",
        AERO_LOG_LEVEL="WARNING",
        DJANGO_SETTINGS_MODULE="aero.settings",
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)
    call_command("load_builtin", verbosity=0)


class Timed:
    """Wraps the job function the inline backend calls: per job its thread CPU and its
    statements on Django's connection, by the job's place in its session."""

    def __init__(self) -> None:
        from django.db import connection

        # The inline backend imports the job function from its module at each dispatch.
        import diagnosis.jobs.job as job

        self.connection = connection
        self.job = job.advance_session
        self.recording = False
        self.statements = 0
        self.per_session: dict[str, int] = defaultdict(int)
        self.samples: dict[int, list[tuple[float, int, str, float]]] = defaultdict(list)
        self.profile: Any = None
        self.show_sql = False
        # The cyclic garbage collector's passes inside the counted jobs: their CPU is in
        # the jobs' figures, charged to whichever line allocated when one began.
        self.in_job = False
        self.gc_started = 0.0
        self.gc_cpu: dict[int, float] = defaultdict(float)
        self.gc_passes: dict[int, int] = defaultdict(int)
        gc.callbacks.append(self.on_gc)
        job.advance_session = self  # type: ignore[assignment]

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if not self.in_job:
            return
        if phase == "start":
            self.gc_started = time.thread_time()
        else:
            self.gc_cpu[info["generation"]] += time.thread_time() - self.gc_started
            self.gc_passes[info["generation"]] += 1

    def count(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.statements += 1
        if self.show_sql:
            print(f"    {sql[: int(os.environ.get('SQL_WIDTH', '160'))]}", file=sys.stderr)
        return execute(sql, params, many, context)

    def __call__(self, session_id: str) -> str:
        if not self.recording:
            return str(self.job(session_id))
        if self.show_sql:
            print(f"job {self.per_session[session_id] + 1} of {session_id}:", file=sys.stderr)
        self.statements = 0
        counted = self.per_session[session_id] > 0  # see `jobs` in main()
        with self.connection.execute_wrapper(self.count):
            if self.profile is not None and counted:
                self.profile.enable()
            self.in_job = counted
            started, process = time.thread_time(), time.process_time()
            outcome = str(self.job(session_id))
            cpu = time.thread_time() - started
            process = time.process_time() - process
            self.in_job = False
            if self.profile is not None and counted:
                self.profile.disable()
        self.per_session[session_id] += 1
        self.samples[self.per_session[session_id]].append((cpu, self.statements, outcome, process))
        return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--warm", type=int, default=3, help="sessions run first, not counted")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--db-suffix", default="")
    parser.add_argument(
        "--show-sql", action="store_true", help="print the last session's jobs' statements"
    )
    parser.add_argument("--profile", help="a file: cProfile's stats of the counted jobs")
    args = parser.parse_args()
    os.chdir(ROOT)
    fake, fake_url = start_fake_model()
    try:
        setup(args.database_url, f"aero_bench_jobcpu{args.db_suffix}")
        wait_listening(int(urlsplit(fake_url).port or 0))
        user = provider_and_user(fake_url)
        from diagnosis.actions import do_create_session
        from scenarios_admin.models import Scenario

        scenario = Scenario.objects.get(slug="oil_spill")
        timed = Timed()
        for _ in range(args.warm):
            do_create_session(user, scenario, MESSAGE)
        timed.recording = True
        if args.profile:
            import cProfile

            timed.profile = cProfile.Profile()
        load = loadavg()
        for number in range(args.sessions):
            timed.show_sql = args.show_sql and number == args.sessions - 1
            do_create_session(user, scenario, MESSAGE)
    finally:
        fake.terminate()
        fake.wait(timeout=10)
    if args.profile:
        timed.profile.dump_stats(args.profile)
    # The inline backend runs a first job before the opening extraction is answered
    # (it finds the request pending and ends); the rq backend enqueues none: the jobs
    # bench/llm_bound.py counts are the others.
    jobs = [s for place, samples in timed.samples.items() if place > 1 for s in samples]
    count = max(1, len(jobs))
    result = {
        "tree": str(ROOT),
        "load": load,
        "sessions": args.sessions,
        "jobs": len(jobs),
        "thread_cpu_ms_per_job": round(1000 * sum(s[0] for s in jobs) / count, 2),
        "process_cpu_ms_per_job": round(1000 * sum(s[3] for s in jobs) / count, 2),
        "statements_per_job": round(sum(s[1] for s in jobs) / count, 1),
        # The collector's CPU in the counted jobs, per job, and its passes by generation.
        "gc_ms_per_job": round(1000 * sum(timed.gc_cpu.values()) / count, 2),
        "gc_passes": {g: timed.gc_passes[g] for g in sorted(timed.gc_passes)},
        "by_place": {
            place: {
                "jobs": len(samples),
                "thread_ms_median": round(1000 * statistics.median(s[0] for s in samples), 2),
                "process_ms_median": round(1000 * statistics.median(s[3] for s in samples), 2),
                "statements": round(statistics.mean(s[1] for s in samples), 1),
                "outcomes": sorted({s[2] for s in samples}),
            }
            for place, samples in sorted(timed.samples.items())
        },
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
