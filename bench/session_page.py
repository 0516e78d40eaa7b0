"""The session page's CPU and wall time for one tree, embedded (issue 37 item 3): p50 of
`--repeat` requests by one operator for a session of 200 and of 2,000 events, after
one warm-up request. `--after-event`: an event is appended before each request, so no
panel or row is kept from the request before (what the first viewer of a new event
pays). Run it for the base tree and this one in turn; it prints one JSON object.

  python bench/session_page.py --tree DIR [--repeat 20] [--after-event]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--after-event", action="store_true")
    args = parser.parse_args()
    # The tree's own helpers (the base tree's, when measuring the base).
    sys.path.insert(0, str(args.tree / "bench"))
    from _measure_inline import big_session, pct, setup, user

    setup(args.tree, "embedded", "inline")
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
