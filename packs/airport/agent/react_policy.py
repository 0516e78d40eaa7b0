"""The apron policy's check of the model's calls in a ReAct step: what runs, what is
refused, what is corrected (the core's loop, diagnosis.agent.react, calls it)."""

from __future__ import annotations

import json
from typing import Any

from aero.compiled import Arg, Compiled
from diagnosis.agent.choice import Choice
from diagnosis.agent.state import AgentContext
from diagnosis.agent.tools import ENRICHMENT_SOURCES
from diagnosis.models import ToolCall
from packs.airport.agent import fsm, policy
from packs.airport.agent.planning import enrichment_calls, facts_of, revision_suffix
from packs.airport.agent.state import ApronState

# The packs' lookups (registered when the apps are ready: read when first compiled).
_lookups_made = Compiled(
    ToolCall,
    lambda: ToolCall.objects.filter(
        session_id=Arg(0, ToolCall._meta.get_field("session")),
        tool_name__in=sorted(ENRICHMENT_SOURCES),
    ).values_list("tool_name", flat=True),
)


def decide(
    valid: list[dict[str, Any]],
    reference: dict[str, Any],
    state: ApronState,
    ctx: AgentContext,
) -> Choice:
    """The model's valid calls, checked one by one against the compliance state machine
    and the policy; the ones that pass are what runs.

    - a lookup runs with the arguments of the confirmed fields (a value the model made up
      is not looked up: the operator confirms facts, not the model);
    - risk and impact run only when the state machine allows them and only once: the
      rule table and the BFS give their results, nothing the model says changes them;
    - an action may be proposed only once the impact is known, only if the rule table
      requires it, and with the policy's arguments and risk class; every required action
      the model forgot is proposed anyway;
    - a call the state machine does not allow yet is refused, with the reason as its tool
      message; when nothing the model asked for can run, the policy's next step runs."""

    definition = ctx.definition
    fields = state.get("fields") or {}
    facts = facts_of(state, ctx)
    risk = state.get("risk")
    enrichment = state.get("enrichment") or {}
    # After a correction, the calls of revision n: the earlier results are not reused.
    suffix = revision_suffix(state)
    lookups = {
        c["tool"]: {**c, "call_id": c["call_id"] + suffix}
        for c in enrichment_calls(definition, fields)
    }
    done_lookups = set(_lookups_made.rows(ctx.session_id)) if enrichment else set()
    expected = reference.get("calls", []) if reference["step"] == "call" else []
    # The proposal step is open once risk and impact are known and nothing was proposed;
    # the policy's list of required actions is then fixed (the model may get there while
    # the policy would still look something up).
    entry_facts = facts
    required = [c for c in expected if c.get("mode") == "propose"]
    at_proposals = bool(required) or (
        bool(risk) and bool(state.get("impact")) and not state.get("actions_planned")
    )
    if at_proposals and not required:
        required = policy.required_actions(
            definition, fields, ctx.graph, risk or {}, state.get("impact") or {}
        )
        for position, proposal in enumerate(required):
            proposal.update(position=position, mode="propose")
    proposing = bool([c for c in expected if c.get("mode") == "propose"])
    unclaimed = list(required)
    choice = Choice(reference)
    plan_calls: list[dict[str, Any]] = []

    def refuse(call: dict[str, Any], why: str) -> None:
        choice.calls.append({"name": call["name"], "args": call.get("args") or {}, "refused": why})
        choice.corrections.append(
            {"tool": call["name"], "args": call.get("args") or {}, "violation": "refused: " + why}
        )

    def accept(call: dict[str, Any], planned: dict[str, Any]) -> None:
        choice.calls.append(
            {"name": call["name"], "args": call.get("args") or {}, "call_id": planned["call_id"]}
        )
        if all(p["call_id"] != planned["call_id"] for p in plan_calls):
            plan_calls.append(planned)

    for call in valid:
        name, args = call["name"], call.get("args") or {}
        if name in ENRICHMENT_SOURCES:
            if name in done_lookups or any(p["tool"] == name for p in plan_calls):
                refuse(call, f"{name} was already run; its result is in the conversation")
            elif name not in lookups:
                refuse(call, f"{name}: the field it needs is not known (confirmed) yet")
            else:
                if args != lookups[name]["args"]:
                    choice.corrections.append(
                        {
                            "tool": name,
                            "args": args,
                            "violation": f"{name} arguments set by the policy from the "
                            "confirmed fields: "
                            + json.dumps(lookups[name]["args"], ensure_ascii=False),
                        }
                    )
                accept(call, lookups[name])
        elif name == "assess_risk":
            violation = fsm.check_step(definition, facts, name)
            if risk:
                refuse(
                    call,
                    f"the risk is assessed by the rule table ({risk['rule']}: {risk['level']} "
                    f"{risk['score']}); it is neither re-run nor changed",
                )
            elif violation:
                refuse(call, violation)
            else:
                accept(call, {"call_id": "assess_risk" + suffix, "tool": "assess_risk", "args": {}})
                facts = fsm.Facts(facts.p1_complete, True, False, False, False)
        elif name == "analyze_impact":
            violation = fsm.check_step(definition, facts, name)
            if state.get("impact"):
                refuse(call, "the impact is analysed by the BFS on the airport graph already")
            elif violation:
                refuse(call, violation)
            else:
                accept(
                    call,
                    {"call_id": "analyze_impact" + suffix, "tool": "analyze_impact", "args": {}},
                )
                facts = fsm.Facts(facts.p1_complete, True, True, False, False)
        else:
            # Actions need the impact known before this step, not from the same reply:
            # the required list depends on it.
            violation = fsm.check_step(definition, entry_facts, name)
            if violation:
                refuse(call, violation)
            elif not at_proposals:
                refuse(call, f"{name}: the required actions were proposed already")
            else:
                proposing = True
                same = [c for c in unclaimed if c["tool"] == name and c["args"] == args]
                other = same or [c for c in unclaimed if c["tool"] == name]
                if not other:
                    refuse(
                        call,
                        f"{name} {json.dumps(args, ensure_ascii=False)} is not "
                        "required by the scenario's rules for this incident",
                    )
                    continue
                unclaimed.remove(other[0])
                if not same and name != "notify_atc":  # the ATC message is the model's words
                    choice.corrections.append(
                        {
                            "tool": name,
                            "args": args,
                            "violation": f"{name} arguments set by the policy: "
                            + json.dumps(other[0]["args"], ensure_ascii=False, sort_keys=True),
                        }
                    )
                accept(call, other[0])
    if proposing:
        for call in unclaimed:
            choice.corrections.append(
                {
                    "tool": call["tool"],
                    "args": call.get("args") or {},
                    "violation": f"required action {call['tool']} proposed although the model "
                    "did not call it",
                }
            )
        # All required proposals, in the policy's order (positions, stable call ids),
        # after whatever else the model asked for in the same reply.
        others = [c for c in plan_calls if c.get("mode") != "propose"]
        choice.plan = {"step": "call", "calls": others + required, "by": "model"}
    elif plan_calls:
        choice.plan = {"step": "call", "calls": plan_calls, "by": "model"}
    else:
        next_step = ", ".join(c["tool"] for c in expected) or reference["step"]
        choice.corrections.append(
            {
                "tool": "finish",
                "violation": (
                    "nothing the model asked for can run" if valid else "the model stopped early"
                )
                + f"; the policy's next step runs: {next_step}",
            }
        )
        choice.plan = reference
    return choice
