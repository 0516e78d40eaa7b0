"""supervisord event listener for `make run` (scripts/run.sh).

A web server (gunicorn or daphne) that cannot start at all (a port in use, a bad
setting) ends in FATAL: no restart cures that, so the whole run stops, with the reason
on stderr and in a marker file run.sh turns into its exit status. A worker or the LLM
runner never gives up (its retries are unbounded), so only the web servers get here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from supervisor import childutils


def main() -> None:
    web = set(os.environ.get("AERO_SUPERVISED_WEB", "").split())
    marker = Path(os.environ["AERO_SUPERVISOR_FATAL"])
    while True:
        headers, payload = childutils.listener.wait(sys.stdin, sys.stdout)
        if headers["eventname"] == "PROCESS_STATE_FATAL":
            fields, _ = childutils.eventdata(payload + "\n")
            name = fields.get("processname", "")
            # By program: several daphne processes are daphne-1, daphne-2 ...
            if fields.get("groupname", name) in web:
                marker.write_text(name)
                print(f"{name} could not start: stopping AERO", file=sys.stderr, flush=True)
                childutils.getRPCInterface(os.environ).supervisor.shutdown()
        childutils.listener.ok(sys.stdout)


if __name__ == "__main__":
    main()
