"""The tool executor: lookups, risk, impact, and the actions proposed or executed; and,
in the same step, the compliance check of what it did (nodes.validation) unless it handed
actions to the outbox."""

from __future__ import annotations

from typing import Any, cast

from diagnosis.agent import summaries
from diagnosis.agent.nodes.proposals import (
    board_for,
    note_if_in_force,
    open_proposals,
    propose_action,
    proposed,
    revise_proposals,
)
from diagnosis.agent.recording import merged_step, recorded
from diagnosis.agent.state import AgentContext
from diagnosis.agent.tools import (
    ENRICHMENT_SOURCES,
    ToolContext,
    run_action,
    run_deterministic,
    run_enrichment,
)
from diagnosis.eventlog.names import FINDING_RECORDED, TIMELINE_APPENDED
from diagnosis.eventlog.types.findings import recorded as finding
from diagnosis.events import append_step_event
from diagnosis.models import AgentRun, ToolCall
from packs.airport.agent import fsm, policy
from packs.airport.agent.nodes.validation import validate
from packs.airport.agent.planning import action_calls_of, facts_of
from packs.airport.agent.state import ApronState
from packs.airport.findings import IMPACT, RISK


@recorded("tool_executor")
def tool_executor(state: ApronState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The calls, then their compliance check in the same step and run (it was a step of
    its own: a graph step costs a job ~0.4 ms of CPU), its events keyed as that step's
    (`merged_step`). Not when the calls handed actions to the outbox: the check must see
    their results, which come with this step's commit; the graph then runs the
    `compliance_validator` step after this one, as before. The step is one savepoint:
    if the check fails, the calls' work rolls back with it and the retry runs both."""
    update = execute_calls(state, ctx, run)
    if update.get("_commit"):
        update["validated"] = False
        return update
    with merged_step(ctx, "compliance_validator", state) as counted:
        checked = validate(cast(ApronState, {**state, **update}), ctx, run)
    # One summary for the two: "5 call(s) handled; state IMPACT_ANALYZED".
    summary = f"{update.pop('_summary')}; {checked.pop('_summary')}"
    return {**update, **checked, **counted, "validated": True, "_summary": summary}


def execute_calls(state: ApronState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    definition = ctx.definition
    tctx = ToolContext(ctx.session_id, ctx.graph, run, ctx.producer, definition=definition)
    calls = state["plan"].get("calls", [])
    update: dict[str, Any] = {}
    refusals: list[dict[str, Any]] = []
    actions = action_calls_of(ctx)
    facts = facts_of(state, ctx, actions)

    lookups = [c for c in calls if c["tool"] in ENRICHMENT_SOURCES]
    if lookups:
        enrichment = run_enrichment(tctx, lookups)
        earlier = state.get("enrichment")
        if earlier:  # the model looked some sources up in an earlier step: keep them
            enrichment = {
                **earlier,
                **enrichment,
                "degraded": [*earlier.get("degraded", []), *enrichment["degraded"]],
            }
        update["enrichment"] = enrichment
        append_step_event(
            ctx.session_id,
            TIMELINE_APPENDED,
            {
                "kind": "enrichment",
                "degraded": enrichment["degraded"],
                "sources": sorted(k for k in enrichment if k != "degraded"),
                "enrichment": enrichment,
            },
            producer=ctx.producer,
            run=run,
        )

    fields = state.get("fields") or {}
    proposing = [c for c in calls if c.get("mode") == "propose"]
    if proposing and state.get("replanning"):
        calls = [c for c in calls if c.get("mode") != "propose"] + revise_proposals(
            ctx,
            run,
            proposing,
            int(state.get("revision") or 0),
            actions,
            answered=bool((state.get("replanning") or {}).get("answered")),
        )
        update["replanning"] = None
    made = {a.call_id for a in actions}
    board = board_for([c for c in calls if c.get("mode") == "propose"])
    opened = open_proposals(
        tctx, calls, lambda tool: fsm.check_step(definition, facts, tool), made, board
    )
    for call in calls:
        tool = call["tool"]
        if tool in ENRICHMENT_SOURCES:
            continue
        violation = fsm.check_step(definition, facts, tool)
        if violation:
            refusals.append({"call_id": call["call_id"], "tool": tool, "violation": violation})
            continue
        if tool == "assess_risk":
            risk = run_deterministic(
                tctx,
                {**call, "args": {"fields": fields}},
                lambda: policy.assess_risk(
                    definition, policy.with_defaults(definition, fields), ctx.graph
                ),
            )
            update["risk"] = risk
            replanning = state.get("replanning") or {}
            before = replanning.get("previous_risk")
            found = risk
            if before:
                found = {
                    **risk,
                    # Re-run after a correction: what it was, and what was corrected.
                    "reassessed_from": {k: before.get(k) for k in ("rule", "level", "score")},
                    "corrected": replanning.get("corrected", {}),
                    # Or after an optional question's answer (asked alongside).
                    **({"answered": replanning["answered"]} if replanning.get("answered") else {}),
                }
            append_step_event(
                ctx.session_id,
                FINDING_RECORDED,
                finding(RISK, found),
                producer=ctx.producer,
                run=run,
            )
            facts = fsm.Facts(facts.p1_complete, True, False, False, False)
        elif tool == "analyze_impact":
            level: str = (update.get("risk") or state.get("risk") or {})["level"]

            def analyze(level: str = level) -> dict[str, Any]:
                return policy.analyze_impact(definition, fields, ctx.graph, level)

            impact = run_deterministic(
                tctx,
                {
                    **call,
                    "args": {"start": fields.get(definition["impact"]["start"]), "level": level},
                },
                analyze,
            )
            update["impact"] = impact
            append_step_event(
                ctx.session_id,
                FINDING_RECORDED,
                finding(IMPACT, impact),
                producer=ctx.producer,
                run=run,
            )
            facts = fsm.Facts(facts.p1_complete, True, True, False, False)
        elif call.get("mode") == "execute":
            tool_call = ToolCall.objects.get(session_id=ctx.session_id, call_id=call["call_id"])
            run_action(tctx, tool_call.pk)
        elif call["call_id"] in opened:
            proposed(tctx, *opened[call["call_id"]])
        elif not note_if_in_force(ctx, run, call, made, board):
            propose_action(tctx, call, fresh=call["call_id"] not in made)
    if any(c["tool"] not in ENRICHMENT_SOURCES and c["tool"] not in ANALYSES for c in calls):
        ctx.actions = None  # proposed, executed or withdrawn here: read them again
        # An action handed to the outbox goes out when its transaction commits, and
        # the next steps must see its result: the group ends with this step.
        update["_commit"] = True
    if proposing and not refusals:
        update["actions_planned"] = True
    update["refusals"] = refusals
    update["_summary"] = summaries.calls_handled(len(calls) - len(refusals), len(refusals))
    return update


# With the lookups (filled when the packs are ready, so read at each call): not actions.
ANALYSES = frozenset({"assess_risk", "analyze_impact"})
