"""Slow tools are waits (issue 36 item 5): N IT diagnosis sessions, each reading its
metrics through a slow tool that takes `--latency` seconds, on the usual 2 rq workers and
one LLM runner. Prints; asserts nothing. The issue names bench/diagnosis.py; this is the
script that prints the figure.

  .venv/bin/python bench/slow_tools.py [--sessions 100] [--latency 3]

Each session is the shipped example ex-pool-inventory (no code tool call) without its
metrics.csv, started on a configured metrics source: its metrics are read by the slow
tool `metrics_read`. The runner here is `aero_llm_runner` with that tool replaced by a
stand-in for Prometheus: it sleeps `--latency` seconds, then answers the example's own
samples (what tests/test_slow_tools.py shows a real Prometheus answers).

Two phases. First the workers run every session up to its read: each job ends at the
read (a wait), so no worker is held by it; the runner's stand-in holds every read it
claims until all N sessions wait. Then the reads are let go at once: the wave, from
their release until the last read is answered, takes about
one read (`--latency` plus the runner's own work), not N x latency (tools in the jobs
of 2 workers: N x latency / 2). Then the workers resume each session with its samples
up to its fix's approval. Printed per latency: the wave, the whole batch (from the
first session created until every session waits for its fix's approval or ended; on a
loaded machine this is the workers' share of the CPU, not the reads), the jobs, the
reads and the workers' CPU.

`--wave-only` stops once every read is answered (the figure issue 36 asks for; the
second phase takes minutes on a loaded machine). `--trace` profiles the wave in the
runner: when the last tool call ended, how long the answers' transactions took (their
sum over the runner's database threads, and the span), the runner's SQL by statement,
and its time in the garbage collector (bench/RESULTS.md has what it found).

Needs PostgreSQL and Redis: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres,
the maintenance database; a scratch database `aero_bench_slow<--db-suffix>` is dropped and
created per run) and REDIS_URL (default redis://127.0.0.1:6379, database --redis-db;
only the bench's own keys are removed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._env import clean_environment, forget_keys, migrate_and_load  # noqa: E402

PY = sys.executable
EXAMPLE = "ex-pool-inventory"
EXAMPLES = ROOT / "packs" / "diagnosis" / "data" / "examples"
# Threads creating the sessions, as the web process's request threads would.
CREATORS = 8


def scratch_name(args: argparse.Namespace) -> str:
    return f"aero_bench_slow{args.db_suffix}"


def cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return total / ticks


def environment(args: argparse.Namespace, data_dir: Path) -> dict[str, str]:
    env = clean_environment()
    database = urlsplit(args.database_url)._replace(path=f"/{scratch_name(args)}").geturl()
    redis = urlsplit(args.redis_url)._replace(path=f"/{args.redis_db}").geturl()
    env.update(
        DATABASE_URL=database,
        REDIS_URL=redis,
        AERO_DATA_DIR=str(data_dir),
        AERO_QUEUE=f"bench-{scratch_name(args)}",
        AERO_CHANNEL_PREFIX=f"bench-{scratch_name(args)}",
        AERO_LLM_WAITS="1",
        AERO_LOG_LEVEL="WARNING",
    )
    if args.trace:
        env["AERO_BENCH_TRACE"] = str(data_dir / "trace.jsonl")
    return env


def measure(args: argparse.Namespace, latency: float) -> dict[str, Any]:
    data_dir = Path(tempfile.mkdtemp(prefix="aero-bench-slow-"))
    env = environment(args, data_dir)
    subprocess.run(
        ["psql", args.database_url, "-qc",
         f"DROP DATABASE IF EXISTS {scratch_name(args)} WITH (FORCE)",
         "-c", f"CREATE DATABASE {scratch_name(args)}"],
        check=True, capture_output=True,
    )  # fmt: skip
    forget_keys(env["REDIS_URL"], env["AERO_QUEUE"])
    migrate_and_load(PY, ROOT, env)
    log = (data_dir / "processes.log").open("w")
    workers = [
        subprocess.Popen(
            [PY, "manage.py", "aero_worker"], cwd=ROOT, env=env, stdout=log, stderr=log
        )
        for _ in range(2)
    ]
    runner = subprocess.Popen(
        [PY, __file__, "--runner", "--latency", str(latency)],
        cwd=ROOT, env=env, stdout=log, stderr=log,
    )  # fmt: skip
    processes = [*workers, runner]
    driver = subprocess.Popen(
        [PY, __file__, "--drive", "--sessions", str(args.sessions),
         "--timeout", str(args.timeout), "--ready", str(len(processes)),
         *(["--wave-only"] if args.wave_only else [])],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    ready = data_dir / "clock-started"
    at_start: float | None = None
    while driver.poll() is None:
        if at_start is None and ready.exists():
            at_start = cpu_seconds([p.pid for p in workers])
        time.sleep(0.5)
    output = driver.stdout.read() if driver.stdout else ""
    workers_cpu = cpu_seconds([p.pid for p in workers]) - (at_start or 0.0)
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    log.close()
    forget_keys(env["REDIS_URL"], env["AERO_QUEUE"])
    result: dict[str, Any] = {"latency_s": latency, "workers_cpu_s": round(workers_cpu, 1)}
    for line in output.splitlines():
        if line.startswith("RESULT "):
            result.update(json.loads(line[len("RESULT ") :]))
    if "sessions" not in result:
        result["log"] = (data_dir / "processes.log").read_text()[-2000:]
    if args.trace:
        result["profile"] = profile(data_dir)
    return result


def profile(data_dir: Path) -> dict[str, Any]:
    """Where the wave's time went in the runner (--trace): from the reads' release, when
    the last tool call ended (its 3 s and the stand-in's own work), how long the answers'
    transactions took (summed over the runner's database threads, and from the first to
    the last), the runner's statements by their first words, and its time in the garbage
    collector after the release."""
    released = (data_dir / "all-waiting").stat().st_mtime
    rows = [json.loads(line) for line in (data_dir / "trace.jsonl").read_text().splitlines()]
    tools = [r for r in rows if "tool" in r]
    finishes = [r for r in rows if "finish" in r]
    collections = [r for r in rows if "gc" in r and r["end"] >= released]
    statements = [r for r in rows if "sql" in r and r["end"] >= released]
    if not tools or not finishes:
        return {}
    return {
        "last_tool_end_s": round(max(r["end"] for r in tools) - released, 2),
        "tool_s_mean": round(sum(r["end"] - r["start"] for r in tools) / len(tools), 2),
        "finish_sum_s": round(sum(r["end"] - r["start"] for r in finishes), 2),
        "finish_first_start_s": round(min(r["start"] for r in finishes) - released, 2),
        "finish_last_end_s": round(max(r["end"] for r in finishes) - released, 2),
        "gc_s": round(sum(r["end"] - r["start"] for r in collections), 2),
        "gc_runs": len(collections),
        "gc_gen2_s": round(sum(r["end"] - r["start"] for r in collections if r["gc"] == 2), 2),
        # the statements the runner ran after the release, by their first words
        "sql_s": {
            words: round(sum(r["end"] - r["start"] for r in statements if r["sql"] == words), 2)
            for words in sorted({r["sql"] for r in statements})
        },
    }


def run_runner(latency: float) -> None:
    """`aero_llm_runner` whose metrics read is a stand-in for Prometheus: `latency`
    seconds, then the example's own samples over the asked window and metrics."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "aero.settings")
    import django

    django.setup()
    from datetime import datetime

    from django.core.management import call_command

    from diagnosis.agent import slow_tools
    from packs.diagnosis import slow
    from packs.diagnosis.bundle import open_bundle
    from packs.diagnosis.evidence import Evidence

    bundle = open_bundle(EXAMPLES / f"{EXAMPLE}.tar.gz")
    evidence = Evidence(bundle)
    rows = evidence.con.execute("SELECT ts, service, metric, value FROM metrics").fetchall()
    evidence.close()

    gate = Path(os.environ["AERO_DATA_DIR"]) / "all-waiting"
    # The answer as the real read stores it (a checkout from before it had its own
    # encoding stored a row per sample: the same rows).
    encode = getattr(slow, "samples_result", None) or (
        lambda rows: {"samples": [[ts.isoformat(), s, m, v] for ts, s, m, v in rows]}
    )

    def read(args: dict[str, Any]) -> dict[str, Any]:
        while not gate.exists():
            time.sleep(0.05)
        time.sleep(latency)
        since, until = (datetime.fromisoformat(args[k]) for k in ("since", "until"))
        wanted = set(args["metrics"])
        kept = sorted(
            (r for r in rows if r[2] in wanted and since <= r[0] <= until),
            key=lambda r: (r[1], r[2], r[0]),
        )
        # As the real read answers (packs.diagnosis.slow): the same encoding.
        return encode([(ts, s, m, float(v)) for ts, s, m, v in kept])

    trace = os.environ.get("AERO_BENCH_TRACE")
    if trace:
        read = _traced(read, Path(trace))
    # The reads wait for the gate (every session waiting on its read), however long the
    # workers take to get every session there.
    slow_tools.register_slow_tool(slow.METRICS_READ, read, lambda _: 3600.0)
    call_command("aero_llm_runner")


def _traced(read: Any, path: Path) -> Any:
    """The runner's profile of the wave (--trace): per read, when its tool started and
    ended, when its answer's transaction started and ended, and the runner's time in
    the garbage collector; written as JSON lines to `path` as they happen."""
    import gc
    import threading

    from diagnosis.llm_runner import records, runner

    out = path.open("a", buffering=1)
    # Reentrant: the collector's callback may run inside a write (json.dumps allocates).
    lock = threading.RLock()

    def write(**row: Any) -> None:
        with lock:
            out.write(json.dumps(row) + "\n")

    collecting: dict[str, float] = {}

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collecting["at"] = time.time()
        elif "at" in collecting:
            write(gc=info["generation"], start=collecting.pop("at"), end=time.time())

    gc.callbacks.append(on_gc)

    def tool(args: dict[str, Any]) -> dict[str, Any]:
        started = time.time()
        result: dict[str, Any] = read(args)
        write(tool=args["since"], start=started, end=time.time())
        return result

    finish = records.finish_tool

    def finish_tool(call: Any, *rest: Any) -> None:
        started = time.time()
        finish(call, *rest)
        write(finish=call.key, start=started, end=time.time())

    runner.finish_tool = finish_tool  # type: ignore[attr-defined]

    from django.db.backends import utils

    execute = utils.CursorWrapper._execute

    def timed(self: Any, sql: str, *rest: Any) -> Any:
        started = time.time()
        try:
            return execute(self, sql, *rest)
        finally:
            words = sql.split()
            write(sql=" ".join(words[:3])[:60], start=started, end=time.time())

    utils.CursorWrapper._execute = timed  # type: ignore[method-assign]
    return tool


def drive(args: argparse.Namespace) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "aero.settings")
    # A connection per creating thread, and the main thread's watching.
    os.environ["AERO_DB_POOL_SIZE"] = str(CREATORS + 2)
    import django

    django.setup()
    from django.contrib.auth.models import Group, User

    from aero.roles import ensure_role_groups
    from diagnosis.models import AgentRun, Event, LLMRequest, Session, WorkerBeat
    from packs.diagnosis.models import MetricsSource
    from packs.diagnosis.sessions import start_from_bundle

    ensure_role_groups()
    user = User.objects.create_user("bench-operator")
    user.groups.add(Group.objects.get(name="operator"))
    # Never asked: the runner's stand-in answers for it.
    MetricsSource.objects.create(
        name="bench-prom", base_url="http://127.0.0.1:9", timeout_seconds=10
    )
    folder = Path(os.environ["AERO_DATA_DIR"]) / "example"
    with tarfile.open(EXAMPLES / f"{EXAMPLE}.tar.gz") as archive:
        archive.extractall(folder, filter="data")
    (root,) = [p for p in folder.iterdir() if p.is_dir()]
    (root / "metrics.csv").unlink()
    up_by = time.monotonic() + 90
    while WorkerBeat.objects.count() < args.ready and time.monotonic() < up_by:
        time.sleep(0.1)
    data = Path(os.environ["AERO_DATA_DIR"])
    (data / "clock-started").touch()
    started = time.monotonic()

    def create(_: int) -> str:
        return str(start_from_bundle(user, root, {"metrics_source": "bench-prom"}).pk)

    with ThreadPoolExecutor(max_workers=CREATORS) as pool:
        ids = list(pool.map(create, range(args.sessions)))
    created = time.monotonic() - started
    moving = ("queued", "running", "retrying")
    asked = LLMRequest.objects.filter(session_id__in=ids, purpose="tool:metrics_read")
    ended = Session.objects.filter(pk__in=ids).exclude(status__in=moving)
    while time.monotonic() - started < args.timeout:
        if asked.count() + ended.filter(llm_requests__isnull=True).count() >= len(ids):
            break
        time.sleep(0.25)
    # Every job has ended at its read (none is held by it): the reads are let go at once.
    all_waiting = time.monotonic() - started
    released = time.time()
    (data / "all-waiting").touch()
    done_at: float | None = None
    reads = Event.objects.filter(session_id__in=ids, type="tool.slow_call")
    while args.wave_only and time.monotonic() - started < args.timeout:
        # Only the wave is measured: stop once every read is answered.
        if reads.count() >= len(ids):
            break
        time.sleep(0.1)
    while not args.wave_only and time.monotonic() - started < args.timeout:
        if not Session.objects.filter(pk__in=ids, status__in=moving).exists():
            done_at = time.monotonic() - started
            break
        time.sleep(0.25)
    elapsed = time.monotonic() - started
    statuses = dict.fromkeys(("waiting_user", "completed", "failed"), 0)
    for status in Session.objects.filter(pk__in=ids).values_list("status", flat=True):
        statuses[status] = statuses.get(status, 0) + 1
    answered = [ts.timestamp() for ts in reads.values_list("ts", flat=True)]
    # Each read's time on the runner: from its start (its end less its latency) to its end.
    # (a read held at the gate started at the release)
    spans = [
        (max(ts.timestamp() - latency / 1000, released), ts.timestamp())
        for ts, latency in reads.values_list("ts", "payload__latency_ms")
    ]
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    at_once = most = 0
    for _, step in edges:
        at_once += step
        most = max(most, at_once)
    print(
        "RESULT "
        + json.dumps(
            {
                "sessions": len(ids),
                "created_s": round(created, 1),
                # Until every session waited on its read; then from the reads' release
                # until the last was answered (all of them, or None).
                "all_waiting_s": round(all_waiting, 1),
                "wave_s": round(max(answered) - released, 1) if len(answered) == len(ids) else None,
                "all_done_s": None if done_at is None else round(done_at, 1),
                "elapsed_s": round(elapsed, 1),
                "statuses": statuses,
                "reads_ok": reads.filter(payload__status="ok").count(),
                "reads_failed": reads.filter(payload__status="error").count(),
                "jobs": AgentRun.objects.filter(session_id__in=ids, parent__isnull=True).count(),
                # Reads overlap: their time summed, the span from the first start to
                # the last end, and the most in flight at once.
                "reads_sum_s": round(sum(b - a for a, b in spans), 1),
                "reads_span_s": round(max(b for _, b in spans) - min(a for a, _ in spans), 1)
                if spans
                else None,
                "reads_at_once": most,
                "load": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument(
        "--latency", default="3", help="the tool's seconds, one run each (comma-separated)"
    )
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
    )
    parser.add_argument("--redis-db", default=os.environ.get("AERO_BENCH_REDIS_DB", "13"))
    parser.add_argument(
        "--db-suffix", default="", help="appended to the scratch database's name (parallel runs)"
    )
    parser.add_argument(
        "--wave-only",
        action="store_true",
        help="stop once every read is answered (the wave), not at every fix's approval",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="profile the wave in the runner: its tool calls, answers and garbage collection",
    )
    parser.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--runner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ready", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        drive(args)
        return
    if args.runner:
        run_runner(float(args.latency))
        return
    latencies = [float(x) for x in args.latency.split(",")]
    print(
        f"{args.sessions} sessions, each reading its metrics through a slow tool;"
        f" 2 rq workers, 1 runner. Load average at start: "
        + " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        flush=True,
    )
    results = []
    for latency in latencies:
        print(f"  measuring a {latency:g} s tool ...", flush=True)
        results.append(measure(args, latency))
        print(f"    {results[-1]}", flush=True)
    print()
    for r in results:
        done = r.get("all_done_s")
        when = f"{done:.1f} s" if done is not None else "(not done)"
        sessions = r.get("sessions", 0)
        wave = r.get("wave_s")
        print(
            f"{r['latency_s']:g} s tool: all {sessions} reads answered {wave} s after their"
            f" release, every session waiting on its read (one wave:"
            f" {r['latency_s']:g} s; serially {sessions * r['latency_s']:.0f} s; in the jobs"
            f" of 2 workers {sessions * r['latency_s'] / 2:.0f} s)"
        )
        if r.get("profile"):
            print(f"{r['latency_s']:g} s tool: the runner's profile of the wave: {r['profile']}")
        if args.wave_only:
            continue
        print(
            f"{r['latency_s']:g} s tool: all {sessions} sessions done in {when};"
            f" {r.get('jobs', 0)} jobs, {r.get('reads_ok', 0)} reads made"
            f" ({r.get('reads_sum_s')} s of reads within {r.get('reads_span_s')} s,"
            f" up to {r.get('reads_at_once')} at once),"
            f" workers' CPU {r.get('workers_cpu_s', 0)} s; {r.get('statuses')}"
        )
    base = next((r for r in results if r["latency_s"] == 0), None)
    for r in results:
        if r["latency_s"] == 0 or base is None:
            continue
        if r.get("all_done_s") is None or base.get("all_done_s") is None:
            continue
        sessions = r.get("sessions", args.sessions)
        print(
            f"a {r['latency_s']:g} s tool added {r['all_done_s'] - base['all_done_s']:.1f} s"
            f" to {sessions} sessions (serially {sessions * r['latency_s']:.0f} s;"
            f" tools in the jobs of 2 workers {sessions * r['latency_s'] / 2:.0f} s)"
        )


if __name__ == "__main__":
    main()
