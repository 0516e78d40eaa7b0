"""One tree's measurements for bench/perf.py (prints one JSON object, asserts nothing).

Runs against the source tree given by --tree (this checkout, or a temporary worktree of
the base commit), so it only uses what both trees have: do_create_session, append_event,
render_updates (either signature), the page URLs, `manage.py aero_worker`, daphne.

  python bench/perf_measure.py --tree DIR --mode embedded|services [--what ...]
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
from pathlib import Path
from typing import Any

from _measure_inline import pages, per_session, setup
from _measure_push import live_push
from _measure_servers import at_once, concurrent_pages, diagnoses_at_once, rq_latency


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=Path, required=True)
    parser.add_argument("--mode", choices=("embedded", "services"), required=True)
    parser.add_argument("--head", action="store_true", help="the tree is this change")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--open", type=int, default=2000)
    parser.add_argument("--at-once", type=int, default=40)
    parser.add_argument("--at-once-timeout", type=float, default=150)
    parser.add_argument("--diagnoses", type=int, default=100)
    parser.add_argument("--viewers", type=int, default=100)
    parser.add_argument("--push-sessions", type=int, default=1)
    parser.add_argument("--viewers-per-session", type=int, default=1)
    parser.add_argument("--ws-processes", type=int, default=1, help="daphne processes")
    parser.add_argument("--events", type=int, default=5)
    parser.add_argument("--push-clients", type=int, default=1, help="viewer client processes")
    parser.add_argument("--push-rate", type=float, default=0, help="events/s; 0: back to back")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--port", type=int, default=18500)
    parser.add_argument("--what", default="all")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="aero-bench-logs-"))
    # Thousands of sockets: this process's daphnes and viewer clients inherit the limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # Comma-separated: all, inline (per session + views), session (per session only),
    # views (the two pages at one client), rq, push, pages (concurrent clients).
    what = set(args.what.split(",")) if args.what != "all" else {"inline", "rq", "push", "pages"}
    if "inline" in what:
        what |= {"session", "views"}
    inline_first = args.mode == "embedded" or bool(what & {"session", "views"})
    setup(args.tree, args.mode, "inline" if inline_first else "rq")
    out: dict[str, Any] = {"mode": args.mode, "logs": str(logs)}
    if "session" in what:
        out.update(per_session(args.samples))
    if "views" in what:
        out.update(pages(200, args.open, args.samples * 5))
    if args.mode == "services" and "rq" in what:
        from django.conf import settings

        settings.AERO_JOB_BACKEND = "rq"
        out.update(rq_latency(args.samples * 3, logs))
        out.update(at_once(args.at_once, args.at_once_timeout, logs))
        if args.head:  # the base has no diagnosis pack
            out.update(diagnoses_at_once(args.diagnoses, args.at_once_timeout, logs))
    if args.mode == "services" and "push" in what:
        processes, clients, rate = args.ws_processes, args.push_clients, args.push_rate
        if args.viewers > 0:
            out.update(
                live_push(args.viewers, 1, args.events, args.port, logs, processes, clients, rate)
            )
        if args.push_sessions > 1:
            watching = args.push_sessions * args.viewers_per_session
            many = live_push(
                watching, args.push_sessions, args.events, args.port, logs, processes, clients, rate
            )
            out.update({f"many_{k}": v for k, v in many.items()})
    if args.mode == "services" and "pages" in what:
        out.update(concurrent_pages(args.clients, args.seconds, args.port + 10, logs, args.head))
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
