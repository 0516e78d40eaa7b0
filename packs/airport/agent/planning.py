"""The deterministic planner and the facts it reads: the next step from what is known.
Shared by the reasoning node and the model's checked plan (diagnosis.agent.react)."""

from __future__ import annotations

from typing import Any

from aero.compiled import Arg, Compiled
from diagnosis.agent.state import AgentContext
from diagnosis.models import ToolCall, ToolCallStatus
from packs.airport.agent import fsm, policy
from packs.airport.agent.state import ApronState

UNFINISHED_EXECUTION = (ToolCallStatus.APPROVED, ToolCallStatus.EXECUTING, ToolCallStatus.RUNNING)


# Read by most steps: compiled once per connection.
_action_calls = Compiled(
    ToolCall,
    lambda: ToolCall.objects.filter(
        session_id=Arg(0, ToolCall._meta.get_field("session")), is_action=True
    ).order_by("position", "id"),
)


def action_calls(session_id: Any) -> list[ToolCall]:
    return list(_action_calls.rows(session_id))


def action_calls_of(ctx: AgentContext) -> list[ToolCall]:
    """The session's action calls, read once per step group, not once per step:
    the group's own steps are the only ones that change them (tool_executor forgets them
    when it did), and a decision landing meanwhile is seen when the group ends at a wait
    (await_approval reads the calls itself and forgets these): a stale list can only
    make the agent wait where it could have gone on, never act on a call undecided."""
    if ctx.actions is None:
        ctx.actions = action_calls(ctx.session_id)
    return ctx.actions


def facts_of(
    state: ApronState, ctx: AgentContext, actions: list[ToolCall] | None = None
) -> fsm.Facts:
    actions = action_calls_of(ctx) if actions is None else actions
    settled = state.get("actions_planned", False) and all(
        a.status
        in (
            ToolCallStatus.COMPLETED,
            ToolCallStatus.FAILED,
            ToolCallStatus.REJECTED,
            ToolCallStatus.TIMEOUT,
            ToolCallStatus.REFUSED,  # by the policy at execution time
            ToolCallStatus.CANCELED,  # withdrawn after a correction
        )
        for a in actions
    )
    return fsm.Facts(
        p1_complete=not policy.missing_p1(ctx.definition, state.get("fields") or {}),
        risk_assessed=bool(state.get("risk")),
        impact_analyzed=bool(state.get("impact")),
        actions_settled=settled,
        reported=bool(state.get("reported")),
    )


def offline_plan(state: ApronState, ctx: AgentContext) -> dict[str, Any]:
    """The deterministic planner: the next step from what is known. Always compliant."""
    definition = ctx.definition
    fields = state.get("fields") or {}
    conflicts = [n for n, p in (state.get("unconfirmed") or {}).items() if "replaces" in p]
    if conflicts:  # a changed value waits for the operator's yes or no first
        return {"step": "ask", "field": conflicts[0]}
    missing = policy.missing_p1(definition, fields)
    if missing:
        return {"step": "ask", "field": missing[0]}
    # Optional (P2) facts never hold the response up: they are asked alongside the
    # approvals (see the "await" step below), and an answer re-assesses.
    suffix = revision_suffix(state)
    if state.get("enrichment") is None:
        return {
            "step": "call",
            "calls": [
                {**c, "call_id": c["call_id"] + suffix}
                for c in enrichment_calls(definition, fields)
            ],
        }
    if not state.get("risk"):
        return {
            "step": "call",
            "calls": [{"call_id": "assess_risk" + suffix, "tool": "assess_risk", "args": {}}],
        }
    if not state.get("impact"):
        return {
            "step": "call",
            "calls": [{"call_id": "analyze_impact" + suffix, "tool": "analyze_impact", "args": {}}],
        }
    if not state.get("actions_planned"):
        proposals = policy.required_actions(
            definition, fields, ctx.graph, state["risk"] or {}, state["impact"] or {}
        )
        for position, proposal in enumerate(proposals):
            proposal["position"] = position
            proposal["mode"] = "propose"
        return {"step": "call", "calls": proposals}
    actions = action_calls_of(ctx)
    # Approved, or handed to the outbox and not recorded yet (a crash in between): run.
    approved = [a for a in actions if a.status in UNFINISHED_EXECUTION]
    if approved:
        return {
            "step": "call",
            "calls": [
                {
                    "call_id": a.call_id,
                    "tool": a.tool_name,
                    "args": a.request_payload,
                    "risk_class": a.risk_class,
                    "is_action": True,
                    "mode": "execute",
                }
                for a in approved
            ],
        }
    if any(a.status == ToolCallStatus.AWAITING_APPROVAL for a in actions):
        # While people decide, the next optional fact is asked (once): its answer
        # comes in like a correction and may raise the risk.
        optional = policy.unasked_p2(definition, fields, list(state.get("asked") or []))
        open_question = state.get("question")
        if optional and not open_question:
            return {"step": "await", "ask": optional[0]}
        return {"step": "await"}
    return {"step": "finish"}


def revision_suffix(state: ApronState) -> str:
    """After a correction the lookups and analyses run again as revision n: a call id of
    their own, so no earlier (recorded) result is reused. The policy's plan and
    the model's checked calls (react.decide) both use it."""
    revision = int(state.get("revision") or 0)
    return f"#r{revision}" if revision else ""


def enrichment_calls(definition: dict[str, Any], fields: dict[str, Any]) -> list[dict[str, Any]]:
    # field_order, not dict order: PostgreSQL's jsonb does not keep key order.
    by_type: dict[str, str] = {}
    for name in definition["field_order"]:
        by_type.setdefault(definition["fields"][name]["type"], name)
    calls = []
    flight_field = by_type.get("flight_no")
    if flight_field and fields.get(flight_field):
        for tool in ("lookup_aircraft_info", "lookup_flight_plan"):
            calls.append(
                {"call_id": tool, "tool": tool, "args": {"flight_no": fields[flight_field]}}
            )
    start = definition["impact"]["start"]
    if fields.get(start):
        calls.append(
            {
                "call_id": "lookup_stand_location",
                "tool": "lookup_stand_location",
                "args": {"position": fields[start]},
            }
        )
    return calls
