"""The apron agent's state: the core's (diagnosis.agent.state.ApronState) and what its
own nodes keep between steps. The graph's channels are these keys, as they were when
the core declared them all, so checkpoints written before resume as they are."""

from __future__ import annotations

from typing import Any

from diagnosis.agent.state import AgentState


class ApronState(AgentState, total=False):
    evidence: dict[str, str]
    unconfirmed: dict[str, dict[str, Any]]  # field -> {value, evidence} awaiting confirmation
    # field -> values put to the operator and not confirmed: not put again on no new words.
    declined: dict[str, list[Any]]
    asked: list[str]  # fields asked about, in order (a field may repeat)
    # The last messages only corrected facts: the next question is no "not recognised".
    only_corrections: bool
    # The last answer said the operator does not know (extraction.UNSURE): the question
    # comes again with why it matters, not as an answer not understood.
    unsure: bool
    # Required fields the operator was told why they are needed (after "I don't know"):
    # told once; asked again, the question is short and points at the correction form.
    explained: list[str]
    enrichment: dict[str, Any] | None
    risk: dict[str, Any] | None
    impact: dict[str, Any] | None
    actions_planned: bool
    plan: dict[str, Any]
    refusals: list[dict[str, Any]]
    corrections: list[str]
    fsm: str
    # Corrections after the risk was assessed: the rules re-run and the proposals are
    # made again as revision n; `replanning` holds what it was before.
    revision: int
    replanning: dict[str, Any] | None
    # The tool step ran the compliance check itself (nodes.execution): routed on by it.
    validated: bool


def progress(state: ApronState) -> str:
    """What is known so far, as the ReAct step's key reads it (one digit per fact)."""
    done = [
        state.get("enrichment") is not None,
        bool(state.get("risk")),
        bool(state.get("impact")),
        bool(state.get("actions_planned")),
    ]
    return "".join("1" if d else "0" for d in done)
