"""The compliance validator: the plan checked against the compliance state machine.

`validate` is the check; the `compliance_validator` node runs it as a step of its own
after the reasoning step's finish (or stop) and after a tool step that handed actions to
the outbox (it must see their results, committed with that step). After any other tool
step the tool executor runs it inside its own step (nodes.execution): one graph step
fewer."""

from __future__ import annotations

from typing import Any, Literal

from diagnosis.agent import budget, summaries
from diagnosis.agent.recording import recorded
from diagnosis.agent.state import AgentContext
from diagnosis.eventlog.names import BUDGET_STOPPED, FSM_TRANSITION, FSM_VIOLATION
from diagnosis.events import append_event_once, append_step_event
from diagnosis.models import AgentRun
from packs.airport.agent import fsm
from packs.airport.agent.planning import facts_of
from packs.airport.agent.state import ApronState


@recorded("compliance_validator", rows=False)
def compliance_validator(state: ApronState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    return validate(state, ctx, run)


def validate(state: ApronState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The check, its events recorded under `run`: the refusals as `fsm.violation`s, a
    report asked for too early refused, the move of the compliance state."""
    corrections = list(state.get("corrections") or [])
    for refusal in state.get("refusals") or []:
        corrections.append(refusal["violation"])
        append_step_event(ctx.session_id, FSM_VIOLATION, refusal, producer=ctx.producer, run=run)
    facts = facts_of(state, ctx)
    finishing = state["plan"]["step"] == "finish"
    if state["plan"]["step"] == "stop":
        # The budget ran out and continuing was refused: the agent ends here and
        # reports what was done (nothing is awaiting: the model is only asked before
        # the actions are proposed or after they are settled).
        outcome, by, reason = budget.stop_reason(state["plan"]["request"])
        append_event_once(
            ctx.session_id,
            BUDGET_STOPPED,
            f"budget:{state['plan']['request']}:stopped",
            {"tool_call": state["plan"]["request"], "outcome": outcome, "by": by, "reason": reason},
            producer=ctx.producer,
            run=run,
        )
        plan = dict(state["plan"])
        plan["approved_finish"] = True
        return {"plan": plan, "refusals": [], "_summary": "stopped: budget refused"}
    if finishing and not facts.actions_settled:
        violation = {
            "tool": "write_report",
            "violation": fsm.check_step(ctx.definition, facts, "write_report")
            or "report requested with required actions undecided",
        }
        corrections.append(violation["violation"])
        append_step_event(ctx.session_id, FSM_VIOLATION, violation, producer=ctx.producer, run=run)
        finishing = False
    current = fsm.state_name(ctx.definition, fsm.state_index(facts))
    previous = state.get("fsm") or fsm.state_name(ctx.definition, 0)
    if current != previous:
        append_step_event(
            ctx.session_id,
            FSM_TRANSITION,
            {"from": previous, "to": current},
            producer=ctx.producer,
            run=run,
        )
    plan = dict(state["plan"])
    plan["approved_finish"] = finishing
    return {
        "fsm": current,
        "corrections": corrections,
        "refusals": [],
        "plan": plan,
        "_summary": summaries.compliance_state(current),
    }


def route_after_validation(state: ApronState) -> Literal["output_generator", "reasoning"]:
    return "output_generator" if state["plan"].get("approved_finish") else "reasoning"


def route_after_tools(
    state: ApronState,
) -> Literal["compliance_validator", "output_generator", "reasoning"]:
    """After the tool step: on as the check it ran decides, or to the check as a step of
    its own when the tool step left it (`validated` is False)."""
    return route_after_validation(state) if state.get("validated") else "compliance_validator"
