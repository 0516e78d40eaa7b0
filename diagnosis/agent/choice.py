"""One ReAct step's outcome, as the core's loop (diagnosis.agent.react) records it and a
pack's policy check (its `decide`) makes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diagnosis.agent.state import AgentContext, AgentState


@dataclass
class Choice:
    """What the model asked for in one step and what the policy made of it: the plan that
    runs, each of the model's calls with the call it became or why it was refused, and
    every correction (an `fsm.violation` event each)."""

    plan: dict[str, Any]
    text: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    corrections: list[dict[str, Any]] = field(default_factory=list)

    @property
    def picked(self) -> list[str]:
        return [str(c.get("name")) for c in self.calls if not c.get("refused")]


# A pack's check of the model's valid calls: (calls, the policy's own next step, state,
# context) -> the step that runs, with each refusal and correction.
Decide = Callable[[list[dict[str, Any]], dict[str, Any], AgentState, AgentContext], Choice]
