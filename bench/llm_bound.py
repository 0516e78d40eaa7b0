"""Model-bound sessions (issue 11 item 9): model calls as waits (the LLM runner)
against the blocking design (calls inside the rq job), measured in the same run. Prints;
asserts nothing.

  .venv/bin/python bench/llm_bound.py [--sessions 200] [--latency 3] [--blocking-timeout 120]
      [--only waits|blocking] [--repeat N]

Each session is the worked example (oil spill at stand 105) with a real provider: the
simulated model (`manage.py fake_llm`, real HTTP, streamed replies) answers each of the
session's 3 model calls after `--latency` seconds: the extraction, a reasoning step that
asks for the lookups, the risk and the impact at once, and one that proposes the
actions; then the session waits for its first approval: the floor is 3 x latency. Two
rq workers run the jobs; in the waits design one `aero_llm_runner` makes the calls. The
clock starts once the workers (and the runner) are up. Printed per design: the time
from the first session created until all of them wait for an approval, and the
peak total RSS of the workers (+ runner). The blocking design holds a worker for every
call, so it stops at `--blocking-timeout` and the time for all is projected from the
sessions done by then. `--repeat N` measures the waits design N times (a fresh database
each time) and prints every run and their median: on a shared 2-core machine the same
code measured 20.6-27.0 s minutes apart, so one run says little.

Needs PostgreSQL and Redis: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres,
the maintenance database; a scratch database `aero_bench_llm<--db-suffix>` is dropped and
created per design) and REDIS_URL (default redis://127.0.0.1:6379; database AERO_BENCH_REDIS_DB,
default 13, is flushed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._env import (  # noqa: E402
    clean_environment,
    forget_keys,
    migrate_and_load,
    wait_listening,
)

PY = sys.executable
MESSAGE = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"


def script(latency: float) -> dict[str, Any]:
    """The simulated model: three calls per session, each after `latency` seconds. Its
    first reasoning reply asks for the lookups, the risk and the impact at once (parallel
    tool calls: the compliance state machine runs them in order within the step), its
    second proposes the actions."""
    slow = {"latency": latency}
    return {
        "models": ["fake-1"],
        "chunk_size": 8,
        "rules": [
            {
                **slow,
                "match": {"has_tools": False},
                "usage": {"prompt_tokens": 420, "completion_tokens": 96},
                "json": {
                    "flight_no": {"value": "CA1234", "quote": "CA1234"},
                    "position": {"value": "105", "quote": "105机位"},
                    "fluid_type": {"value": "FUEL", "quote": "燃油泄漏"},
                    "engine_status": {"value": "RUNNING", "quote": "发动机仍在运转"},
                    "continuous": {"value": True, "quote": "还在持续漏"},
                },
            },
            {
                **slow,
                "match": {"after_tool": "analyze_impact"},
                "content": "Proposing the response actions.",
                "tool_calls": [
                    {"name": "notify_atc", "arguments": {"message": "Fuel spill at 105"}},
                    {"name": "dispatch_cleanup_crew", "arguments": {"position": "105"}},
                    {"name": "request_fire_standby", "arguments": {"position": "105"}},
                    {"name": "suspend_stand_operations", "arguments": {"stand": "105"}},
                    {"name": "close_taxiway", "arguments": {"taxiway": "A"}},
                    {"name": "close_taxiway", "arguments": {"taxiway": "B"}},
                ],
            },
            {
                **slow,
                "match": {"has_tools": True},
                "content": "Looking up the flight and the stand first.",
                "tool_calls": [
                    {"name": "lookup_aircraft_info", "arguments": {"flight_no": "CA1234"}},
                    {"name": "lookup_flight_plan", "arguments": {"flight_no": "CA1234"}},
                    {"name": "lookup_stand_location", "arguments": {"position": "105"}},
                    {"name": "assess_risk", "arguments": {}},
                    {"name": "analyze_impact", "arguments": {}},
                ],
            },
        ],
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / 1024


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of the processes so far (load changes it far less than
    wall time: the per-job figure to compare between runs)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return total / ticks


def process_cpu(pid: int) -> float:
    return cpu_seconds([pid])


class BackendCPU:
    """PostgreSQL's CPU for the scratch database: its backends' user + system time,
    polled (a backend that exits between two polls loses at most its last interval).
    The backends are found by their process titles ("postgres: … <user> <database> …"),
    read from /proc: a psql run per poll started a client and a backend of its own
    twice a second, CPU taken from the processes measured."""

    def __init__(self, database_url: str, name: str) -> None:
        self.database_url, self.name = database_url, name
        self.seen: dict[int, float] = {}

    def poll(self) -> None:
        marker = f" {self.name} "
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue  # it exited meanwhile
            if title.startswith("postgres:") and marker in title:
                pid = int(entry.name)
                self.seen[pid] = max(self.seen.get(pid, 0.0), process_cpu(pid))

    @property
    def total(self) -> float:
        return sum(self.seen.values())


def redis_pid() -> int | None:
    result = subprocess.run(["pgrep", "-x", "redis-server"], capture_output=True, text=True)
    pids = result.stdout.split()
    return int(pids[0]) if pids else None


def scratch_name(args: argparse.Namespace) -> str:
    return f"aero_bench_llm{args.db_suffix}"


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def environment(args: argparse.Namespace, waits: bool) -> dict[str, str]:
    env = clean_environment()
    database = urlsplit(args.database_url)._replace(path=f"/{scratch_name(args)}").geturl()
    redis = urlsplit(args.redis_url)._replace(path=f"/{args.redis_db}").geturl()
    env.update(
        DATABASE_URL=database,
        REDIS_URL=redis,
        AERO_DATA_DIR=tempfile.mkdtemp(prefix="aero-bench-llm-"),
        AERO_QUEUE=f"bench-{scratch_name(args)}",
        AERO_CHANNEL_PREFIX=f"bench-{scratch_name(args)}",
        AERO_LLM_WAITS="1" if waits else "0",
        AERO_LLM_REACT="1",
        AERO_LOG_LEVEL="WARNING",
    )
    return env


def measure(args: argparse.Namespace, waits: bool, fake_url: str) -> dict[str, Any]:
    env = environment(args, waits)
    subprocess.run(
        ["psql", args.database_url, "-qc",
         f"DROP DATABASE IF EXISTS {scratch_name(args)} WITH (FORCE)",
         "-c", f"CREATE DATABASE {scratch_name(args)}"],
        check=True, capture_output=True,
    )  # fmt: skip
    forget_keys(env["REDIS_URL"], env["AERO_QUEUE"])  # a run stopped earlier may have left some
    migrate_and_load(PY, ROOT, env)
    wait_listening(int(urlsplit(fake_url).port or 0))
    log = (Path(env["AERO_DATA_DIR"]) / "processes.log").open("w")
    processes = [
        subprocess.Popen(
            [PY, "manage.py", "aero_worker"], cwd=ROOT, env=env, stdout=log, stderr=log
        )
        for _ in range(2)
    ]
    if waits:
        processes.append(
            subprocess.Popen(
                [PY, "manage.py", "aero_llm_runner"], cwd=ROOT, env=env, stdout=log, stderr=log
            )
        )
    driver = subprocess.Popen(
        [PY, __file__, "--drive", "--sessions", str(args.sessions), "--fake-url", fake_url,
         "--timeout", str(args.timeout if waits else args.blocking_timeout),
         "--ready", str(len(processes))],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    spies = []
    if args.profile:
        # py-spy (measuring only, not a dependency): collapsed stacks per process.
        named = [("worker1", processes[0].pid), ("worker2", processes[1].pid)]
        named += [("runner", p.pid) for p in processes[2:]]
        named += [("fake_llm", args.fake_pid)] if args.fake_pid else []
        for label, pid in named:
            out = Path(args.profile) / f"{'waits' if waits else 'blocking'}-{label}.txt"
            spies.append(subprocess.Popen(
                [str(Path(PY).parent / "py-spy"), "record", "--pid", str(pid),
                 # AERO_PYSPY_ARGS: py-spy's options instead (`--gil --rate 200`)
                 *(os.environ.get("AERO_PYSPY_ARGS") or "--rate 50").split(),
                 "--format", "raw", "--nonblocking", "--output", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip
    peak = 0.0
    backends = BackendCPU(args.database_url, scratch_name(args))
    redis = redis_pid()
    redis_before = process_cpu(redis) if redis else 0.0
    fake_before = process_cpu(args.fake_pid) if args.fake_pid else 0.0
    ready = Path(env["AERO_DATA_DIR"]) / "clock-started"
    # The workers' and the runner's CPU when the clock started (their start-up).
    at_start: tuple[float, float] | None = None
    while driver.poll() is None:
        if at_start is None and ready.exists():
            at_start = (
                cpu_seconds([p.pid for p in processes[:2]]),
                cpu_seconds([p.pid for p in processes[2:]]),
            )
        peak = max(peak, rss_mb([p.pid for p in processes]))
        backends.poll()
        time.sleep(0.5)
    output = driver.stdout.read() if driver.stdout else ""
    backends.poll()
    start_workers, start_runner = at_start or (0.0, 0.0)
    workers_cpu = cpu_seconds([p.pid for p in processes[:2]]) - start_workers
    runner_cpu = cpu_seconds([p.pid for p in processes[2:]]) - start_runner
    fake_cpu = (process_cpu(args.fake_pid) - fake_before) if args.fake_pid else 0.0
    # The machine's one Redis: other engineers' use is in this figure too (a ceiling).
    redis_cpu = (process_cpu(redis) - redis_before) if redis else 0.0
    for spy in spies:
        spy.send_signal(signal.SIGINT)
    for spy in spies:
        spy.wait(timeout=30)
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    result: dict[str, Any] = {
        "peak_rss_mb": peak,
        "processes": len(processes),
        "workers_cpu_s": round(workers_cpu, 1),
        "runner_cpu_s": round(runner_cpu, 1),
        "fake_llm_cpu_s": round(fake_cpu, 1),
        "postgres_cpu_s": round(backends.total, 1),
        "redis_cpu_s": round(redis_cpu, 1),
    }
    for line in output.splitlines():
        if line.startswith("RESULT "):
            result.update(json.loads(line[len("RESULT ") :]))
    forget_keys(env["REDIS_URL"], env["AERO_QUEUE"])
    if result.get("jobs"):
        result["worker_cpu_ms_per_job"] = round(1000 * workers_cpu / result["jobs"], 1)
    return result


def provider_and_user(fake_url: str) -> Any:
    """The fake model as the enabled provider, and an operator to create sessions."""
    from decimal import Decimal

    from django.contrib.auth.models import Group, User

    from aero.roles import ensure_role_groups
    from scenarios_admin.models import ProviderConfig

    config = ProviderConfig(
        name="fake",
        kind="openai",
        base_url=fake_url,
        model="fake-1",
        price_input_per_1k=Decimal("0.01"),
        price_output_per_1k=Decimal("0.02"),
        timeout_seconds=30,
    )
    config.set_api_key("sk-bench")
    config.save()
    ensure_role_groups()
    user = User.objects.create_user("bench-operator")
    user.groups.add(Group.objects.get(name="operator"))
    return user


def drive(args: argparse.Namespace) -> None:
    """In the design's environment: a provider, an operator, the sessions; then watch."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "aero.settings")
    import django

    django.setup()
    from diagnosis.actions import do_create_session
    from diagnosis.models import AgentRun, Session, ToolCall
    from scenarios_admin.models import Scenario

    user = provider_and_user(args.fake_url)
    scenario = Scenario.objects.get(slug="oil_spill")
    # The clock starts once every worker (and the runner) is up, as in production, where
    # they are long-running: their start-up (imports, ~3 s of CPU each) is not the
    # design's cost and, on 2 cores, would otherwise delay the first jobs.
    from diagnosis.models import WorkerBeat

    up_by = time.monotonic() + 60
    while WorkerBeat.objects.count() < args.ready and time.monotonic() < up_by:
        time.sleep(0.1)
    if WorkerBeat.objects.count() < args.ready:
        print("warning: not every process was up after 60 s; the clock starts anyway",
              file=sys.stderr, flush=True)  # fmt: skip
    # This process stands in for the web process, which imports the model client at its
    # start (diagnosis.startup), as the workers and the runner do before their beat.
    from diagnosis.startup import warm_up_imports

    warm_up_imports()
    (Path(os.environ["AERO_DATA_DIR"]) / "clock-started").touch()
    started = time.monotonic()

    from django.db import connection

    def create(_: int) -> str:
        # Each creation gives its connection back to the pool, as a web request does: 8
        # threads holding theirs beside this one's found the pool (8) empty after 10 s.
        try:
            return str(do_create_session(user, scenario, MESSAGE).pk)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = list(pool.map(create, range(args.sessions)))
    created = time.monotonic() - started
    done_at: float | None = None
    waiting = 0
    while time.monotonic() - started < args.timeout:
        waiting = (
            ToolCall.objects.filter(session_id__in=ids, status="awaiting_approval")
            .values("session_id")
            .distinct()
            .count()
        )
        if waiting >= len(ids):
            done_at = time.monotonic() - started
            break
        time.sleep(0.25)
    elapsed = time.monotonic() - started
    failed = Session.objects.filter(pk__in=ids, status="failed").count()
    # Jobs that ran the graph (each takes the lease and opens one root run).
    jobs = AgentRun.objects.filter(session_id__in=ids, parent__isnull=True).count()
    print(
        "RESULT "
        + json.dumps(
            {
                "sessions": len(ids),
                "created_s": round(created, 1),
                "all_waiting_s": None if done_at is None else round(done_at, 1),
                "waiting_at_end": waiting,
                "elapsed_s": round(elapsed, 1),
                "failed": failed,
                "jobs": jobs,
                "load": loadavg(),
            }
        ),
        flush=True,
    )


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose time for all waiting is the median (a run that did not finish counts
    as the slowest), with every run's time beside it."""

    def key(run: dict[str, Any]) -> float:
        done = run.get("all_waiting_s")
        return float("inf") if done is None else float(done)

    ordered = sorted(runs, key=key)
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["runs_s"] = [run.get("all_waiting_s") for run in runs]
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--latency", type=float, default=3.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--blocking-timeout", type=float, default=120.0)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
    )
    parser.add_argument("--redis-db", default=os.environ.get("AERO_BENCH_REDIS_DB", "13"))
    parser.add_argument("--only", choices=("waits", "blocking"))
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of the waits design (their median)"
    )
    parser.add_argument(
        "--db-suffix", default="", help="appended to the scratch database's name (parallel runs)"
    )
    parser.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ready", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--fake-url", help=argparse.SUPPRESS)
    parser.add_argument("--profile", help="a folder: py-spy's collapsed stacks per process")
    parser.set_defaults(fake_pid=None)
    args = parser.parse_args()
    if args.drive:
        drive(args)
        return

    port = free_port()
    script_file = Path(tempfile.mkdtemp(prefix="aero-bench-llm-")) / "script.json"
    script_file.write_text(json.dumps(script(args.latency)))
    env = clean_environment()
    env["AERO_DATA_DIR"] = str(script_file.parent)
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    fake = subprocess.Popen(
        [PY, "manage.py", "fake_llm", "--port", str(port), "--script", str(script_file)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # Not waited for here: it starts while measure() sets the database up, and is waited
    # for before the first session.
    args.fake_pid = fake.pid
    fake_url = f"http://127.0.0.1:{port}/v1"
    print(
        f"{args.sessions} sessions, 3 model calls of {args.latency:g} s each before"
        f" the first approval; 2 rq workers. Load average at start: {loadavg()}",
        flush=True,
    )
    results: dict[str, dict[str, Any]] = {}
    try:
        for design, waits in (("waits", True), ("blocking", False)):
            if args.only and args.only != design:
                continue
            runs = max(1, args.repeat) if waits else 1
            measured = []
            for run in range(runs):
                print(f"  measuring {design} ({run + 1} of {runs}) ...", flush=True)
                measured.append(measure(args, waits, fake_url))
                print(f"    {measured[-1]}", flush=True)
            results[design] = median_run(measured)
    finally:
        fake.terminate()
        fake.wait(timeout=10)
    print()
    print(f"{'design':10} {'all waiting':>14} {'peak RSS':>10} {'in flight per GB':>18}  load")
    for design, r in results.items():
        sessions, peak = r.get("sessions", 0), r.get("peak_rss_mb", 0.0)
        if r.get("all_waiting_s") is not None:
            when = f"{r['all_waiting_s']:.1f} s"
        elif r.get("waiting_at_end"):
            projected = r["elapsed_s"] * sessions / r["waiting_at_end"]
            when = f"~{projected:.0f} s (proj.)"
        else:
            when = "none"
        # In flight at once: every session in the waits design; one per worker blocked.
        in_flight = sessions if design == "waits" else 2
        per_gb = in_flight / (peak / 1024) if peak else 0.0
        print(f"{design:10} {when:>14} {peak:>8.0f} MB {per_gb:>18.0f}  {r.get('load', '')}")
        if len(r.get("runs_s", [])) > 1:
            print(f"{'':10} median of {len(r['runs_s'])} runs: {r['runs_s']} s")
        print(
            f"{'':10} created in {r.get('created_s')} s; {r.get('waiting_at_end')} of "
            f"{sessions} waiting after {r.get('elapsed_s')} s; {r.get('failed')} failed; "
            f"{r.get('processes')} processes measured"
        )
        print(
            f"{'':10} {r.get('jobs')} jobs; workers' CPU {r.get('workers_cpu_s')} s"
            f" ({r.get('worker_cpu_ms_per_job')} ms per job, after start-up);"
            f" runner's CPU {r.get('runner_cpu_s')} s"
        )
        print(
            f"{'':10} fake_llm's CPU {r.get('fake_llm_cpu_s')} s; PostgreSQL backends'"
            f" {r.get('postgres_cpu_s')} s; redis-server's {r.get('redis_cpu_s')} s"
            " (the machine's one Redis: a ceiling)"
        )


if __name__ == "__main__":
    main()
