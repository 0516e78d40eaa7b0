"""Benchmark: history search over 100,000 sessions and 5 million events (at --scale 1).
Prints p50/p95 per query shape through the real view (query + render), asserts nothing.
Needs PostgreSQL: DATABASE_URL must name a scratch database (it is migrated and filled).

  createdb -h 127.0.0.1 -U postgres aero_bench_history
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/aero_bench_history \\
      .venv/bin/python bench/history_search.py [--scale 0.1] [--requests 40] [--explain]

Rows go in with COPY (psycopg), sessions first, then events (50 per session: agent steps,
model calls, tools, approvals, and the operator's opening message and answers in Chinese
or English), then one report per finished session; VACUUM ANALYZE before measuring.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._env import in_process  # noqa: E402

FLIGHTS = [f"{a}{n}" for a in ("CA", "MU", "CZ", "HU", "ZH", "3U") for n in range(1000, 1400)]
POSITIONS = [str(p) for p in range(101, 140)] + [f"{t}{n}" for t in "ABC" for n in range(1, 6)]
STATUSES = ["completed"] * 6 + ["canceled", "failed", "waiting_user", "running"]
RISKS = ["LOW", "MEDIUM", "HIGH"]
OPENINGS = [
    "{f} 在{p}机位燃油泄漏，发动机仍在运转，还在持续漏",
    "{f} 滑行道{p} 液压油泄漏 发动机已关车",
    "{f} fuel leak at stand {p}, engines running",
    "{f} bird strike on departure, engine ingestion suspected",
    "{f} 爆胎 {p} 跑道有碎片 无烟无火",
    "{f} tire burst at {p}, debris on the runway",
]
ANSWERS = ["在{p}机位", "发动机已关闭", "still leaking", "about 2 m2", "没有起火", "engines off"]
FILLER = [
    ("agent.node_started", {"node": "reasoning"}),
    ("agent.node_completed", {"node": "reasoning", "summary": "call assess_risk"}),
    ("llm.call", {"provider": "offline", "purpose": "extract", "status": "ok", "tokens_in": 0}),
    ("tool.call_started", {"tool_name": "lookup_flight_plan", "risk_level": "R0"}),
    ("tool.call_completed", {"tool_name": "lookup_flight_plan", "risk_level": "R0"}),
    ("fsm.transition", {"from": "INIT", "to": "FIELDS_COLLECTED"}),
    ("session.status_changed", {"from": "queued", "to": "running", "reason": ""}),
]
EVENTS_PER_SESSION = 50
# Search reads no hash: the filled rows carry a placeholder, not a chain (verify_chain
# would call every one of them broken; bench/replay_step.py builds a real one).
NO_CHAIN = "f" * 64


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report_markdown(flight: str, position: str, opening: str) -> str:
    return (
        f"# 处置报告 {flight}\n\n机位 {position}：{opening}\n\n"
        "| 措施 | 结果 |\n|---|---|\n"
        "| 通知塔台 | 已通知 |\n| 清污 | 已派遣 |\n"
    )


def fill(sessions: int, rng: random.Random) -> None:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.utils import timezone

    from scenarios_admin.models import Scenario

    users = [User.objects.get_or_create(username=f"bench-user-{i}")[0] for i in range(20)]
    scenarios = [(s.pk, s.latest_version().pk) for s in Scenario.objects.all()]  # type: ignore[union-attr]
    now = timezone.now()
    started = time.perf_counter()
    rows = []
    with connection.cursor() as cursor:
        raw = cursor.connection
        with raw.cursor().copy(
            "COPY diagnosis_session (id, scenario_id, scenario_version_id, title, language, "
            "status, created_by_id, created_at, updated_at, tokens_in, tokens_out, cost, "
            "last_seq, snapshot, job_attempts, failure, chain_head, lease_holder) FROM STDIN"
        ) as copy:
            for i in range(sessions):
                flight, position = rng.choice(FLIGHTS), rng.choice(POSITIONS)
                opening = rng.choice(OPENINGS).format(f=flight, p=position)
                created = now - timedelta(minutes=i * 5 + rng.randint(0, 4))
                status = rng.choice(STATUSES)
                snapshot = {
                    "fields": {"flight_no": flight, "position": position},
                    "risk": {"level": rng.choice(RISKS), "rule": "R-1", "score": 50},
                }
                sid = uuid.uuid4()
                scenario, version = rng.choice(scenarios)
                copy.write_row(
                    (
                        sid,
                        scenario,
                        version,
                        opening[:120],
                        "zh",
                        status,
                        rng.choice(users).pk,
                        created,
                        created + timedelta(minutes=3),
                        0,
                        0,
                        0,
                        EVENTS_PER_SESSION,
                        json.dumps(snapshot),
                        0,
                        "",
                        NO_CHAIN,
                        "",
                    )
                )
                rows.append((sid, created, opening, status, flight, position))
        print(f"sessions: {sessions} in {time.perf_counter() - started:.1f} s")

        started = time.perf_counter()
        with raw.cursor().copy(
            "COPY diagnosis_event (event_id, session_id, seq, type, ts, payload, trace_id, "
            "producer, key, hash) FROM STDIN"
        ) as copy:
            for sid, created, opening, status, flight, position in rows:
                for seq in range(1, EVENTS_PER_SESSION + 1):
                    if seq == 2:
                        type_, payload = "user.message", {"text": opening, "author": "op"}
                    elif seq in (20, 35):
                        answer = rng.choice(ANSWERS).format(p=position)
                        type_, payload = "user.message", {"text": answer, "author": "op"}
                    elif seq == EVENTS_PER_SESSION and status == "completed":
                        # The report's full text is in its event, as in a real log.
                        markdown = report_markdown(flight, position, opening)
                        type_, payload = "report.ready", {"markdown": markdown, "language": "zh"}
                    else:
                        type_, payload = FILLER[seq % len(FILLER)]
                    copy.write_row(
                        (
                            uuid.uuid4(),
                            sid,
                            seq,
                            type_,
                            created + timedelta(seconds=seq),
                            json.dumps(payload, ensure_ascii=False),
                            "",
                            "bench",
                            "",
                            NO_CHAIN,
                        )
                    )
        print(f"events: {sessions * EVENTS_PER_SESSION} in {time.perf_counter() - started:.1f} s")

        started = time.perf_counter()
        with raw.cursor().copy(
            "COPY diagnosis_report (session_id, language, markdown, created_at) FROM STDIN"
        ) as copy:
            for sid, created, opening, status, flight, position in rows:
                if status == "completed":
                    copy.write_row(
                        (
                            sid,
                            "zh",
                            report_markdown(flight, position, opening),
                            created + timedelta(minutes=3),
                        )
                    )
        print(f"reports in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        # VACUUM as autovacuum would after a bulk load: without it the first queries pay
        # for setting hint bits on millions of fresh rows, and the search documents
        # (written by the trigger, not by COPY) had no statistics: the text shapes measured
        # ~105 ms p50 on a quiet machine right after the fill, 14 ms after this.
        cursor.execute(
            "VACUUM ANALYZE diagnosis_session, diagnosis_event, diagnosis_report,"
            " replay_session_search"
        )
        print(f"vacuum analyze in {time.perf_counter() - started:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0, help="1.0 = 100k sessions, 5M events")
    parser.add_argument("--requests", type=int, default=40, help="per query shape")
    parser.add_argument("--explain", action="store_true", help="print each shape's plan")
    parser.add_argument("--no-fill", action="store_true", help="measure an already filled db")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("DATABASE_URL must name a scratch PostgreSQL database")
    in_process()
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.urls import reverse
    from django.utils import timezone

    from replay import history
    from replay.forms import HistoryForm
    from scenarios_admin.builtin import load_builtin_data
    from scenarios_admin.models import Scenario

    call_command("migrate", verbosity=0)
    load_builtin_data()
    rng = random.Random(11)
    if not args.no_fill:
        fill(int(100_000 * args.scale), rng)

    auditor, _ = User.objects.get_or_create(username="bench-auditor", is_superuser=True)
    client = Client()
    client.force_login(auditor)
    url = reverse("replay:history")
    # The built-in scenarios, read from the data (scenarios are data, not names in code).
    slugs = sorted(Scenario.objects.values_list("slug", flat=True))
    today = timezone.localdate()
    some_cursor = ""

    def shapes() -> dict[str, dict[str, str]]:
        flight, position = rng.choice(FLIGHTS), rng.choice(POSITIONS)
        return {
            "newest first": {},
            "status": {"status": rng.choice(["failed", "canceled", "completed"])},
            "flight": {"flight": flight},
            "position + risk": {"position": position, "risk": rng.choice(RISKS)},
            "scenario + date range": {
                "scenario": rng.choice(slugs),
                "since": (today - timedelta(days=rng.randint(20, 200))).isoformat(),
                "until": (today - timedelta(days=rng.randint(1, 19))).isoformat(),
            },
            "creator": {"creator": f"bench-user-{rng.randint(0, 19)}"},
            "text, Chinese": {"q": rng.choice(["发动机仍在运转", "液压油泄漏", "跑道有碎片"])},
            "text, Chinese + flight": {"q": "燃油泄漏", "flight": flight},
            "text, English": {"q": rng.choice(["fuel leak", "engine ingestion", "debris"])},
            "text, report": {"q": f"处置报告 {flight}"},
            "oldest first": {"sort": "created"},
            "next page": {"cursor": some_cursor} if some_cursor else {},
        }

    first = client.get(url)
    some_cursor = first.context["next_link"].split("cursor=")[-1] if first.context else ""
    from urllib.parse import unquote

    some_cursor = unquote(some_cursor)
    timings: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for _ in range(args.requests):
        for name, params in shapes().items():
            began, began_cpu = time.perf_counter(), time.process_time()
            response = client.get(url, params)
            elapsed = (time.perf_counter() - began) * 1000
            assert response.status_code == 200, (name, response.status_code)
            timings.setdefault(name, []).append(elapsed)
            # This process's CPU time (the database's is not in it): less inflated than
            # wall time when other work shares the cores.
            cpu.setdefault(name, []).append((time.process_time() - began_cpu) * 1000)
    sessions = int(100_000 * args.scale)
    print(f"history page over {sessions} sessions / {sessions * EVENTS_PER_SESSION} events:")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, values in timings.items():
        print(
            f"  {name:24s} p50 {statistics.median(values):7.1f} ms   "
            f"p95 {percentile(values, 0.95):7.1f} ms   "
            f"(CPU here p50 {statistics.median(cpu[name]):6.1f} ms, "
            f"p95 {percentile(cpu[name], 0.95):6.1f} ms)"
        )
    if args.explain:
        for name, params in shapes().items():
            form = HistoryForm(params)
            assert form.is_valid(), form.errors
            query = history.search_queryset(form.cleaned_data).order_by("-created_at", "-pk")[:51]
            sql, sql_params = query.query.sql_with_params()
            with connection.cursor() as cursor:
                cursor.execute(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {sql}", sql_params)
                plan = "\n".join(row[0] for row in cursor.fetchall())
            print(f"\n-- {name}: {params}\n{plan}")


if __name__ == "__main__":
    main()
