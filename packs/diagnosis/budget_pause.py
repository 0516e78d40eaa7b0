"""The model budget's pause in a diagnosis (model calls as the core's reasoning step
makes them, and paused as it is): a step that would ask the model when the session's
budget is spent does nothing yet; the graph waits in `await_budget` for the request to
continue (an R1 approval, opened by the step's check: `budget.exhausted`), then runs the
step again. Approved, the budget rises (`budget.raised`) and the step asks the model;
refused or timed out, `budget.stopped`, and the rest of the diagnosis chooses offline,
as the playbook would (packs.diagnosis.model_choice.budget_gate)."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from langgraph.runtime import Runtime

from diagnosis.agent.nodes.waiting import wait_for_user
from diagnosis.agent.state import AgentContext
from diagnosis.eventlog.names import USER_MESSAGE
from diagnosis.models import Event, ToolCall, ToolCallStatus
from packs.diagnosis.steps import DiagnosisState
from scenarios_admin.definition import BUDGET_TOOL


def paused(node: str) -> dict[str, Any]:
    """A step's update when the budget is spent: it waits, then `node` runs again."""
    return {"budget_wait": node, "_summary": _("waits: the model budget is spent")}


def await_budget(state: DiagnosisState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Waits for the request to continue past the model budget, as for an approval."""
    ctx = runtime.context
    waiting = list(
        ToolCall.objects.filter(
            session_id=ctx.session_id,
            tool_name=BUDGET_TOOL,
            status=ToolCallStatus.AWAITING_APPROVAL,
        ).values_list("pk", flat=True)
    )
    update: dict[str, Any] = {"budget_wait": "", "budget_resume": state.get("budget_wait") or ""}
    if waiting:
        wait_for_user(ctx, {"kind": "approval", "tool_calls": waiting})
        # A message while it waits is no decision, and no answer to a question asked
        # later: read, so that the wait does not wake on it again.
        last = (
            Event.objects.filter(session_id=ctx.session_id, type=USER_MESSAGE)
            .order_by("-seq")
            .values_list("seq", flat=True)
            .first()
        )
        if last is not None and last > (state.get("consumed_seq") or 0):
            update["consumed_seq"] = last
    return update


def route_after_budget(state: DiagnosisState) -> str:
    return state.get("budget_resume") or "conclude"
