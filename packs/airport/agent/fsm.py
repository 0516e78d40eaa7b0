"""The compliance state machine. It validates the agent's steps; it never drives them.

The state is derived from facts, in order: all P1 fields known -> risk assessed ->
impact analysed -> every required action decided (approved ones executed) -> report.
A scenario names the six states (compliance.states); their meaning is positional.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aero.packs import action_tool

# Index of the state a step needs before it may run.
STEP_REQUIRES = {"assess_risk": 1, "analyze_impact": 2, "write_report": 4}
ACTION_REQUIRES = 3


@dataclass(frozen=True)
class Facts:
    p1_complete: bool
    risk_assessed: bool
    impact_analyzed: bool
    actions_settled: bool
    reported: bool


def state_index(facts: Facts) -> int:
    index = 0
    for reached in (
        facts.p1_complete,
        facts.risk_assessed,
        facts.impact_analyzed,
        facts.actions_settled,
        facts.reported,
    ):
        if not reached:
            break
        index += 1
    return index


def state_name(definition: dict[str, Any], index: int) -> str:
    states: Sequence[str] = definition["compliance"]["states"]
    return states[min(index, len(states) - 1)]


def check_step(definition: dict[str, Any], facts: Facts, step: str) -> str | None:
    """None when `step` is allowed now, else the violation in words."""
    current = state_index(facts)
    is_action = action_tool(step) is not None
    if is_action:
        required = ACTION_REQUIRES
    elif step in STEP_REQUIRES:
        required = STEP_REQUIRES[step]
    else:
        return None
    if current >= required and not (is_action and facts.reported):
        return None
    return (
        f"{step} needs state {state_name(definition, required)} but the session is in "
        f"{state_name(definition, current)}"
    )
