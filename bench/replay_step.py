"""Benchmark: the replay step page of a 50,000-event session. Prints numbers, asserts
nothing. Runs on a throw-away embedded database unless DATABASE_URL is set (then on that
PostgreSQL database: use a scratch one, e.g. postgres://postgres@127.0.0.1:5432/aero_bench).

One real session is run through the agent; then the kinds of events a long session piles up
(agent steps, model calls, lookups, notes: the real ones, repeated with new seqs) fill it
to --events, and a real session's events close it (questions, approvals, the report).
Then random steps are fetched
through the Django test client as an auditor: the first visit of a step may fold up to
100 events after a cached checkpoint; the page's p95 is the number to watch.

  .venv/bin/python bench/replay_step.py [--events 50000] [--requests 200]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._env import in_process  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()

    in_process()  # no Redis: the replay cache is per process (LocMem) here
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.test import Client
    from django.urls import reverse
    from django.utils import timezone

    from aero.roles import ensure_role_groups
    from approvals.actions import do_decide
    from approvals.models import Approval
    from diagnosis.actions import do_create_session
    from diagnosis.chain import GENESIS, event_hash, verify_chain
    from diagnosis.models import Event, Session
    from scenarios_admin.builtin import load_builtin_data
    from scenarios_admin.models import Scenario

    call_command("migrate", verbosity=0)
    load_builtin_data()
    ensure_role_groups()
    suffix = uuid.uuid4().hex[:6]
    operator = User.objects.create_user(f"bench-op-{suffix}")
    approver = User.objects.create_superuser(f"bench-approver-{suffix}")
    auditor = User.objects.create_user(f"bench-auditor-{suffix}")
    auditor.groups.add(Group.objects.get(name="auditor"))

    session = do_create_session(
        operator,
        Scenario.objects.get(slug="oil_spill"),
        "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏",
    )
    while approval := Approval.objects.filter(session=session).open().order_by("pk").first():
        step = "confirm" if approval.status == "confirming" else "approve"
        do_decide(approval.pk, approver, step, "bench", digest=approval.digest)
    session.refresh_from_db()
    real = list(Event.objects.filter(session=session).order_by("seq"))
    print(f"real session: {len(real)} events, status {session.status}")
    filler_types = ("agent.node_started", "agent.node_completed", "llm.call", "agent.note")
    filler = [e for e in real if e.type in filler_types or e.type.startswith("tool.call_")]
    filler = [e for e in filler if not e.payload.get("call_id", "").startswith("action:")]
    # The real session is moved to the end: the filler comes first.
    Event.objects.filter(session=session).delete()

    started = time.perf_counter()
    seq = 0
    batch: list[Event] = []
    head = GENESIS
    Event._meta.get_field("ts").auto_now_add = False  # type: ignore[attr-defined]  # hashed below
    with transaction.atomic():
        while seq < args.events:
            filling = seq < args.events - len(real)
            source = filler[seq % len(filler)] if filling else real[seq - (args.events - len(real))]
            seq += 1
            event = Event(
                session=session,
                seq=seq,
                type=source.type,
                payload=source.payload,
                producer=source.producer,
                run_id=source.run_id,
                ts=timezone.now(),
            )
            event.hash = head = event_hash(head, event)  # a real chain: verify walks it all
            batch.append(event)
            if len(batch) == 5000:
                Event.objects.bulk_create(batch)
                batch = []
        Event.objects.bulk_create(batch)
        Session.objects.filter(pk=session.pk).update(last_seq=seq, chain_head=head)
    session.refresh_from_db()
    print(f"filled to {session.last_seq} events in {time.perf_counter() - started:.1f} s")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE diagnosis_event")  # as autovacuum would after a load

    began = time.perf_counter()
    report = verify_chain(session.pk)
    print(
        f"verify_chain over {report.checked} events: ok={report.ok} "
        f"in {(time.perf_counter() - began) * 1000:.0f} ms"
    )
    client = Client()
    client.force_login(auditor)
    url = reverse("replay:replay-step", args=[session.pk])
    rng = random.Random(7)

    cpu: dict[str, list[float]] = {}

    def timed(params: dict[str, object], shape: str = "") -> float:
        began, began_cpu = time.perf_counter(), time.process_time()
        response = client.get(url, params)
        elapsed = (time.perf_counter() - began) * 1000
        # This process's CPU time: less inflated than wall time when other work shares the
        # cores (the database's own time is not in it).
        cpu.setdefault(shape, []).append((time.process_time() - began_cpu) * 1000)
        assert response.status_code == 200, response.status_code
        return elapsed

    last = timed({"seq": session.last_seq})
    print(f"first visit of the last step (folds all {session.last_seq} events): {last:.0f} ms")
    shapes: dict[str, list[float]] = {"random step": [], "next step": [], "filtered": []}
    for _ in range(args.requests):
        target = rng.randint(1, session.last_seq)
        shapes["random step"].append(timed({"seq": target}, "random step"))
        shapes["next step"].append(timed({"seq": min(target + 1, session.last_seq)}, "next step"))
        shapes["filtered"].append(timed({"seq": target, "groups": "approvals"}, "filtered"))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, values in shapes.items():
        print(
            f"step page, {name}: p50 {statistics.median(values):.1f} ms, "
            f"p95 {percentile(values, 0.95):.1f} ms over {len(values)} requests "
            f"(CPU in this process: p50 {statistics.median(cpu[name]):.1f} ms, "
            f"p95 {percentile(cpu[name], 0.95):.1f} ms)"
        )


if __name__ == "__main__":
    main()
