"""The single-agent run modes: ReAct (one evidence call a step, chosen from what is known,
moving to plan-execute after the pack's number of steps in a row that added nothing) and
plan-execute (a plan of calls shown before it runs, executed, one conclusion). With a
model configured, the model chooses ReAct's next call and the plan's calls
(packs.diagnosis.model_choice); offline, the playbook's order does."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _

from diagnosis.agent.recording import recorded
from diagnosis.agent.state import AgentContext
from diagnosis.events import append_step_event
from diagnosis.models import AgentRun
from packs.diagnosis.budget_pause import paused
from packs.diagnosis.investigation import FOLLOW_UPS, Investigation
from packs.diagnosis.model_choice import AWAIT, OFFLINE, budget_gate, pick_calls
from packs.diagnosis.modes import MODE_SWITCHED, PLAN
from packs.diagnosis.steps import (
    DiagnosisState,
    gather,
    investigation_of,
    playbook_of,
    set_mode,
)


def _next_call(inv: Investigation, evidence: list[dict[str, Any]]) -> dict[str, Any] | None:
    """ReAct's choice: the next source the bundle holds that is not read yet; then what
    the reading of the sources read so far leads to (a candidate's topology, the code the
    blamed deploy changed); None when nothing is left to read."""
    made = {e["id"] for e in evidence}
    for call in inv.base_calls():
        if call["call_id"] not in made:
            return call
    for call in inv.follow_ups(inv.reading(evidence)):
        if call["call_id"] not in made:
            return call
    return None


def _offered(inv: Investigation, evidence: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a model may pick next as the playbook words it: the sources not read yet and
    what the reading so far leads to."""
    made = {e["id"] for e in evidence}
    calls = [c for c in inv.base_calls() if c["call_id"] not in made]
    return calls + [c for c in inv.follow_ups(inv.reading(evidence)) if c["call_id"] not in made]


@recorded("react_step")
def react_step(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """Reason (choose the next call from what is known) -> act (call it) -> observe (did
    it add evidence?) -> decide (go on, conclude, or switch to plan-execute after the
    pack's number of steps in a row that added nothing)."""
    inv = investigation_of(ctx, state)
    evidence = list(state["evidence"]["calls"])
    call = _next_call(inv, evidence)
    gate = budget_gate(state, ctx, run)
    if gate == AWAIT:
        return paused("react_step")
    picked = pick_calls(
        inv,
        ctx,
        run,
        evidence,
        _offered(inv, evidence),
        [call] if call else [],
        purpose="reason",
        offline_only=gate == OFFLINE,
    )
    # One call a step (the model is asked again after it); none: it has read enough.
    call = picked.calls[0] if picked.calls else None
    update: dict[str, Any] = {}
    words = ""
    if call is not None:
        item = gather(inv, ctx, run, call)
        evidence.append(item)
        idle = 0 if item["new"] else state.get("idle", 0) + 1
        update["idle"] = idle
        words = f"{item['tool']}: " + (
            _("new evidence") if item["new"] else _("nothing new (%(n)s in a row)") % {"n": idle}
        )
        if _next_call(inv, evidence) is not None:
            limit = playbook_of(ctx).modes.react_idle_steps
            if idle >= limit:
                idle_calls = [e["id"] for e in evidence[-limit:]]
                append_step_event(
                    ctx.session_id,
                    MODE_SWITCHED,
                    {
                        "from": "react",
                        "to": "plan_execute",
                        "reason": "no_new_evidence",
                        "steps": idle,
                        "calls": idle_calls,
                    },
                    producer=ctx.producer,
                    run=run,
                )
                update["mode"] = "plan_execute"
            return {**update, "evidence": {"calls": evidence}, "_summary": words}
    # Nothing left to read: the reading of what was read is the conclusion.
    return {
        **update,
        "evidence": {"calls": evidence},
        "conclusion": inv.conclusion(evidence),
        "_summary": (words + "; " if words else "") + _("enough evidence: conclude"),
    }


@recorded("plan")
def plan(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """Plan-execute's plan, shown before it runs (its group commits with it): the reads
    not made yet, with their arguments, then what their reading leads to. After a switch
    from ReAct, the calls left."""
    inv = investigation_of(ctx, state)
    evidence = list(state["evidence"]["calls"])
    made = {e["id"] for e in evidence}
    calls = [c for c in inv.base_calls() if c["call_id"] not in made]
    then: list[str] = list(FOLLOW_UPS)
    if not calls:  # every source read (a switch from ReAct): what they led to
        calls = [c for c in inv.follow_ups(inv.reading(evidence)) if c["call_id"] not in made]
        then = []
    gate = budget_gate(state, ctx, run)
    if gate == AWAIT:
        return paused("plan")
    picked = pick_calls(
        inv, ctx, run, evidence, calls, calls, purpose="plan", offline_only=gate == OFFLINE
    )
    calls = picked.calls
    if run.mode != "plan_execute":
        set_mode(run, "plan_execute")
    payload: dict[str, Any] = {
        "mode": "plan_execute",
        "calls": [{"id": c["call_id"], "tool": c["tool"], "args": c["args"]} for c in calls],
        "then": then,
    }
    if picked.by != "offline":
        payload["by"] = picked.by  # the model planned these calls
    append_step_event(
        ctx.session_id,
        PLAN,
        payload,
        producer=ctx.producer,
        run=run,
    )
    return {
        "plan": calls,
        "_commit": True,
        "_summary": _("%(n)s calls planned") % {"n": len(calls)},
    }


@recorded("execute")
def execute(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The plan's calls in order, then what their reading leads to, then one conclusion."""
    set_mode(run, "plan_execute")
    inv = investigation_of(ctx, state)
    evidence = list(state["evidence"]["calls"])
    for call in state.get("plan") or []:
        evidence.append(gather(inv, ctx, run, call))
    made = {e["id"] for e in evidence}
    for call in inv.follow_ups(inv.reading(evidence)):
        if call["call_id"] not in made:
            evidence.append(gather(inv, ctx, run, call))
    return {
        "evidence": {"calls": evidence},
        "conclusion": inv.conclusion(evidence),
        "_summary": _("%(n)s evidence calls") % {"n": len(evidence)},
    }
