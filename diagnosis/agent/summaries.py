"""The agent's step summaries as the log keeps them (English, on `agent.node_completed`),
and the patterns that read them back (diagnosis.wording.step_summary_words words them
per reader). One module writes and reads them, so the two cannot drift apart."""

from __future__ import annotations

import re
from collections.abc import Iterable

REPORT_WRITTEN = "report written"


def fields_recognised(count: int, missing: Iterable[str]) -> str:
    missing = list(missing)
    return f"{count} field(s) recognised" + (f", missing {', '.join(missing)}" if missing else "")


def calls_handled(handled: int, refused: int) -> str:
    return f"{handled} call(s) handled" + (f", {refused} refused" if refused else "")


def asks_for(field: str) -> str:
    return f"ask for {field}"


def calls(tools: Iterable[str]) -> str:
    return "call " + ", ".join(tools)


def compliance_state(state: str) -> str:
    return f"state {state}"


# (pattern, kind) per summary above; a plan's other steps are logged by name ("await",
# "finish").
PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^(?P<n>\d+) field\(s\) recognised(?:, missing (?P<missing>.+))?$"), "fields"),
    (re.compile(r"^(?P<n>\d+) call\(s\) handled(?:, (?P<refused>\d+) refused)?$"), "calls"),
    (re.compile(r"^ask for (?P<field>\S+)$"), "ask"),
    (re.compile(r"^call (?P<tools>.+)$"), "call"),
    (re.compile(r"^state (?P<state>\S+)$"), "state"),
    (re.compile(r"^(?P<step>await|finish)$"), "plan"),
    (re.compile(f"^{re.escape(REPORT_WRITTEN)}$"), "report"),
]
