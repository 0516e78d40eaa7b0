"""The output generator: the report, once every required action is settled."""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from diagnosis.agent import budget, summaries
from diagnosis.agent.nodes.proposals import DONE_OR_UNDER_WAY, base_call_id
from diagnosis.agent.recording import recorded
from diagnosis.agent.state import AgentContext
from diagnosis.eventlog.names import FINDING_RECORDED, FSM_TRANSITION
from diagnosis.events import append_step_event
from diagnosis.models import (
    WITHDRAWN_NOT_CALLED_FOR,
    WITHDRAWN_NOT_CALLED_FOR_ANSWER,
    AgentRun,
    Event,
)
from diagnosis.reporting import write_report
from packs.airport.agent import fsm, policy
from packs.airport.agent.planning import action_calls_of, facts_of
from packs.airport.agent.state import ApronState
from packs.airport.findings import RISK, RISK_ASSESSED


@recorded("output_generator", last=True)
def output_generator(state: ApronState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    if state["plan"]["step"] == "stop":
        outcome, by, reason = budget.stop_reason(state["plan"]["request"])
        write_report(
            ctx.session_id,
            ctx.definition,
            dict(state),
            producer=ctx.producer,
            run=run,
            notes=[{"kind": "budget_stopped", "by": by, "outcome": outcome, "reason": reason}],
        )
        return {"reported": True, "_summary": "report written (budget refused)"}
    facts = facts_of(state, ctx)
    violation = fsm.check_step(ctx.definition, facts, "write_report")
    if violation:
        raise RuntimeError(violation)  # the validator routes here only when settled
    notes = [corrections_note(state, ctx), unanswered_note(state, ctx.definition)]
    write_report(
        ctx.session_id,
        ctx.definition,
        dict(state),
        producer=ctx.producer,
        run=run,
        notes=[note for note in notes if note],
    )
    done = fsm.state_name(ctx.definition, fsm.state_index(fsm.Facts(True, True, True, True, True)))
    append_step_event(
        ctx.session_id,
        FSM_TRANSITION,
        {"from": state.get("fsm"), "to": done},
        producer=ctx.producer,
        run=run,
    )
    return {"reported": True, "fsm": done, "_summary": summaries.REPORT_WRITTEN}


def corrections_note(state: ApronState, ctx: AgentContext) -> dict[str, Any]:
    """Facts corrected (or an optional answer given) after the risk was assessed, as the
    report's note (diagnosis.report_notes): each re-assessment (what changed, the risk
    before and after), the approvals withdrawn because the new facts no longer call for
    them, and the actions approved under the earlier facts that the new ones no longer
    call for, kept as history (done is done). {} when there were none."""
    if not state.get("revision"):
        return {}  # never re-planned: nothing to read (no query on the common path)
    reassessed = [
        e.payload
        for e in Event.objects.filter(
            # A session logged before findings were generic re-assessed as risk.assessed.
            Q(type=FINDING_RECORDED, payload__kind=RISK) | Q(type=RISK_ASSESSED),
            session_id=ctx.session_id,
            payload__has_key="reassessed_from",
        ).order_by("seq")
    ]
    if not reassessed:
        return {}
    actions = action_calls_of(ctx)
    wanted = {
        p["call_id"]
        for p in policy.required_actions(
            ctx.definition,
            state.get("fields") or {},
            ctx.graph,
            state.get("risk") or {},
            state.get("impact") or {},
        )
    }
    return {
        "kind": "corrections",
        "reassessed": [
            {
                "changed": {**(risk.get("corrected") or {}), **(risk.get("answered") or {})},
                "answered": bool(risk.get("answered")),
                "before": {
                    "level": risk["reassessed_from"].get("level"),
                    "rule": risk["reassessed_from"].get("rule"),
                },
                "after": {"level": risk.get("level"), "rule": risk.get("rule")},
            }
            for risk in reassessed
        ],
        "withdrawn": [
            {"tool": a.tool_name, "args": a.request_payload}
            for a in actions
            if a.decision_reason in (WITHDRAWN_NOT_CALLED_FOR, WITHDRAWN_NOT_CALLED_FOR_ANSWER)
        ],
        "kept": [
            {"tool": a.tool_name, "args": a.request_payload}
            for a in actions
            if a.status in DONE_OR_UNDER_WAY and base_call_id(a.call_id) not in wanted
        ],
    }


def unanswered_note(state: ApronState, definition: dict[str, Any]) -> dict[str, Any]:
    """The optional fields asked alongside the approvals and still unknown at the end
    (never answered, or answered "unknown"): the report names them. {} when none."""
    fields = state.get("fields") or {}
    unanswered = [
        name
        for name in dict.fromkeys(state.get("asked") or [])
        if definition["fields"][name]["priority"] == "P2" and fields.get(name) is None
    ]
    return {"kind": "unanswered", "fields": unanswered} if unanswered else {}
