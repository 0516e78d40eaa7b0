"""Skills whose manifest raises their risk class (R1 or above) go through the approval
queue before they run: after the conclusion, each active one applying to the problem
type is proposed (an approval card naming the skill, its version and its arguments);
the session waits for the decisions; an approved one then runs as the evidence call it
is (a slow tool: a wait), a rejected or expired one is not run and the session says so
and goes on without it. No effect leaves AERO, so an approval sends nothing out
(scenarios_admin.definition.decision_only)."""

from __future__ import annotations

import time
from typing import Any

from langgraph.runtime import Runtime

from diagnosis.agent.nodes.proposals import propose_action
from diagnosis.agent.nodes.waiting import wait_for_user
from diagnosis.agent.recording import commit_steps, recorded
from diagnosis.agent.state import AgentContext
from diagnosis.eventlog.names import AGENT_NOTE
from diagnosis.events import append_event_once
from diagnosis.models import AgentRun, ToolCall, ToolCallStatus
from diagnosis.toolcalls import call_finished, call_started
from packs.diagnosis.skill_calls import PREFIX, gated_skill_calls, run_skill_call
from packs.diagnosis.steps import DiagnosisState, tool_context
from tools.models import SkillVersion


def has_gated_skills(state: DiagnosisState) -> bool:
    return bool(gated_skill_calls(state["conclusion"]))


def _gated_rows(session_id: Any) -> list[ToolCall]:
    return list(
        ToolCall.objects.filter(
            session_id=session_id, tool_name__startswith=PREFIX, is_action=False
        )
        .exclude(risk_class="R0")
        .order_by("position", "id")
    )


@recorded("propose_skills")
def propose_skills(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """Each R1+ skill applying to the problem type, proposed for approval (once)."""
    calls = gated_skill_calls(state["conclusion"])
    made = set(
        ToolCall.objects.filter(
            session_id=ctx.session_id, call_id__in=[c["call_id"] for c in calls]
        ).values_list("call_id", flat=True)
    )
    tctx = tool_context(ctx, run)
    for call in calls:
        propose_action(tctx, call, fresh=call["call_id"] not in made)
    ctx.actions = None
    return {"_commit": True, "_summary": f"{len(calls)} skills proposed for approval"}


def await_skills(state: DiagnosisState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """The core's approval wait, for the skills' calls (they are not actions)."""
    waiting = [
        row.pk for row in _gated_rows(runtime.context.session_id)
        if row.status == ToolCallStatus.AWAITING_APPROVAL
    ]  # fmt: skip
    if waiting:
        wait_for_user(runtime.context, {"kind": "approval", "tool_calls": waiting})
    else:
        commit_steps(runtime.context)
    return {}


@recorded("run_skills")
def run_skills(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The approved skills run (each a slow tool; a re-run reuses what ran); the others
    are noted as not run, with the decision and its reason."""
    tctx = tool_context(ctx, run)
    items = []
    for row in _gated_rows(ctx.session_id):
        if row.status in (ToolCallStatus.APPROVED, ToolCallStatus.RUNNING):
            _run_approved(tctx, row)
        if row.status in (ToolCallStatus.COMPLETED, ToolCallStatus.FAILED):
            error = row.error
            summary = f"failed: {error}" if error else row.response_payload.get("summary", "")
        else:
            error = _not_run(ctx, run, row)
            summary = error
        items.append({"id": row.call_id, "tool": row.tool_name, "summary": summary, "error": error})
    evidence = dict(state.get("evidence") or {})
    known = {e["id"] for e in evidence.get("calls", [])}
    evidence["calls"] = [
        *evidence.get("calls", []),
        *(item for item in items if item["id"] not in known),
    ]
    return {"_commit": True, "evidence": evidence, "_summary": f"{len(items)} skills decided"}


def _run_approved(tctx: Any, row: ToolCall) -> None:
    """The skill's run first (a wait may end the job here: nothing is written yet), then
    its start and its outcome on the approved call."""
    payload = row.request_payload
    version = SkillVersion.objects.filter(
        skill__name=row.tool_name.removeprefix(PREFIX), version=payload.get("version")
    ).first()
    call = {
        "call_id": row.call_id,
        "tool": row.tool_name,
        "args": dict(payload.get("arguments") or {}),
        "skill_version": version.pk if version is not None else None,
    }
    started = time.monotonic()
    try:
        response, error = run_skill_call(row.session_id, call), ""
    except Exception as exc:  # recorded on the call (a wait is no Exception: it passes)
        response, error = {}, str(exc) or type(exc).__name__
    if row.status == ToolCallStatus.APPROVED:
        call_started(tctx, row)
    call_finished(tctx, row, started, response=response, error=error)


def _not_run(ctx: AgentContext, run: AgentRun, row: ToolCall) -> str:
    """Why a proposed skill did not run, said once on the timeline."""
    by = row.decided_by.get_username() if row.decided_by is not None else ""
    text = f"{row.tool_name} {row.request_payload.get('version', '')} not run: {row.status}"
    text += f" by {by}" if by else ""
    text += f" ({row.decision_reason})" if row.decision_reason else ""
    append_event_once(
        ctx.session_id,
        AGENT_NOTE,
        f"skill_not_run:{row.call_id}",
        {
            "kind": "skill_not_run",
            "tool_name": row.tool_name,
            "args": row.request_payload,
            "status": row.status,
            # The timeline words it per reader: "continuing without TOOL (OUTCOME): REASON".
            "outcome": row.status,
            "reason": row.decision_reason,
            "text": text,
        },
        producer=ctx.producer,
        run=run,
    )
    return text
