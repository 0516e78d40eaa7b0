"""Benchmarks: prints numbers, asserts nothing. Runs on a throw-away embedded database
unless DATABASE_URL is set (then on that PostgreSQL database: use a scratch one).

  .venv/bin/python bench/timeline_render.py [--sessions 10] [--events 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._env import in_process  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()

    in_process()
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.template.loader import render_to_string

    from aero.roles import user_roles
    from diagnosis.actions import do_create_session

    try:
        from diagnosis.live_render import render_updates
    except ImportError:  # an older tree: rendering lived in the consumers' module
        from diagnosis.consumers import render_updates  # type: ignore[no-redef]
    from diagnosis.events import append_event
    from diagnosis.models import Event
    from scenarios_admin.builtin import load_builtin_data
    from scenarios_admin.models import Scenario

    call_command("migrate", verbosity=0)
    load_builtin_data()
    user, _ = User.objects.get_or_create(username="bench", defaults={"is_superuser": True})
    scenario = Scenario.objects.get(slug="oil_spill")
    text = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"

    durations = []
    for _ in range(args.sessions):
        started = time.perf_counter()
        session = do_create_session(user, scenario, text)
        durations.append((time.perf_counter() - started) * 1000)
    session.refresh_from_db()
    print(
        f"agent run to first approval wait: median {statistics.median(durations):.0f} ms, "
        f"max {max(durations):.0f} ms over {args.sessions} sessions "
        f"({session.last_seq} events each, status {session.status})"
    )

    started = time.perf_counter()
    for i in range(args.events):
        append_event(session.pk, "timeline.appended", {"kind": "bench", "i": i}, producer="bench")
    elapsed = time.perf_counter() - started
    print(f"event append (own transaction, session row lock): {args.events / elapsed:.0f} events/s")

    events = list(Event.objects.filter(session=session).order_by("-seq")[:200])
    started = time.perf_counter()
    for _ in range(5):
        render_to_string("diagnosis/_timeline_append.html", {"events": events})
    print(f"render 200 timeline events: {(time.perf_counter() - started) / 5 * 1000:.1f} ms")

    started = time.perf_counter()
    update = render_updates(user_roles(user), session.pk, session.last_seq - 200)
    html = update.html if update is not None else ""
    print(
        "consumer catch-up of 200 events + panels: "
        f"{(time.perf_counter() - started) * 1000:.1f} ms "
        f"({len(html) // 1024} KiB)"
    )


if __name__ == "__main__":
    main()
