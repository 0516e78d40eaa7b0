"""A diagnosis session's last steps: the conclusion (findings citing their evidence, or a
question to the reporter when the evidence names no root cause), the fix through the
core's approvals and outbox, and the report."""

from __future__ import annotations

from typing import Any

from diagnosis.agent.nodes.proposals import propose_action
from diagnosis.agent.recording import recorded
from diagnosis.agent.state import AgentContext
from diagnosis.agent.tools import run_action
from diagnosis.eventlog.names import (
    AGENT_NOTE,
    AGENT_QUESTION,
    FINDING_RECORDED,
    FSM_VIOLATION,
    USER_MESSAGE,
)
from diagnosis.events import append_event_once, append_step_event
from diagnosis.models import AgentRun, Event, Session, ToolCall, ToolCallStatus
from diagnosis.reporting import write_report
from packs.diagnosis import citations, model_choice
from packs.diagnosis.budget_pause import paused
from packs.diagnosis.fixes import fix_problems
from packs.diagnosis.knowledge import linked_cases
from packs.diagnosis.steps import (
    DiagnosisState,
    investigation_of,
    playbook_of,
    system_of,
    tool_context,
)
from scenarios_admin.definition import effective_risk_class

FIX_CALL = "fix-1"
QUESTION_KEY = "q-evidence"
ASK = {
    "zh": "证据不足以确定根因（缺少：{missing}）。"
    "请补充您知道的情况：哪个服务、什么时候开始、最近有哪些变更？",
    "en": "The evidence names no root cause (missing: {missing}). Please add what you know: "
    "which service, since when, and any recent change?",
}


@recorded("conclude")
def conclude(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The playbook's findings and its conclusion as `finding.recorded` events, each
    citing the evidence calls it rests on; with a model, in its words when it names the
    playbook's root cause and cites this session's results (else corrected, said as a
    violation: packs.diagnosis.model_choice)."""
    # The past cases are shown beside the conclusion; the playbook does not read them.
    evidence = state["evidence"]["calls"]
    cited = [e["id"] for e in evidence if not e.get("error") and e["tool"] != "similar_cases"]
    found: dict[str, Any] = state["conclusion"]
    violations: list[dict[str, Any]] = []
    gate = model_choice.budget_gate(state, ctx, run)
    if gate == model_choice.AWAIT:
        return paused("conclude")
    if gate == model_choice.ASK:
        language = "zh" if state.get("language") == "zh" else "en"
        found, cited, violations = model_choice.worded(
            investigation_of(ctx, state), ctx, run, evidence, found, cited, language
        )
    found, cited, checked = citations.checked(
        found, cited, citations.session_results(ctx.session_id), playbook_of(ctx)
    )
    violations += checked
    for violation in violations:
        append_step_event(ctx.session_id, FSM_VIOLATION, violation, producer=ctx.producer, run=run)
    for candidate in found["candidates"]:
        append_step_event(
            ctx.session_id,
            FINDING_RECORDED,
            {"kind": "hypothesis", **candidate},
            producer=ctx.producer,
            run=run,
        )
    append_step_event(
        ctx.session_id,
        FINDING_RECORDED,
        {
            "kind": "root_cause",
            **{k: v for k, v in found.items() if k not in ("candidates", "action")},
            "fix": found["action"],
            "evidence": cited,
        },
        producer=ctx.producer,
        run=run,
    )
    update: dict[str, Any] = {"_summary": f"root cause: {found['hypothesis']}"}
    if found is not state["conclusion"]:
        update["conclusion"] = found  # corrected or worded: the rest of the graph reads it
    if found["hypothesis"] == "unknown":
        lang = "zh" if state.get("language") == "zh" else "en"
        text = ASK[lang].format(missing=", ".join(found["missing"]) or "-")
        append_event_once(
            ctx.session_id,
            AGENT_QUESTION,
            QUESTION_KEY,
            {"field": "description", "label": "", "text": text},
            producer=ctx.producer,
            run=run,
        )
        update["question"] = {"field": "description", "text": text, "key": QUESTION_KEY}
    return update


@recorded("read_answer")
def read_answer(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The reporter's answer to the evidence question: kept in the log (it is the
    user.message) and read into the report; it adds no evidence the playbook could use."""
    answers = list(
        Event.objects.filter(
            session_id=ctx.session_id, type=USER_MESSAGE, seq__gt=state.get("consumed_seq", 0)
        )
        .order_by("seq")
        .values_list("seq", "payload")
    )
    if not answers:
        return {"_summary": "no answer"}
    return {
        "consumed_seq": answers[-1][0],
        "answers": [str(p.get("text", "")) for _, p in answers],
        "question": None,
        "_summary": "answer read",
    }


# --- fixes -----------------------------------------------------------------------------------


@recorded("propose_fix")
def propose_fix(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The playbook's fix, under the pack's policy, through the core's approvals."""
    found: dict[str, Any] = state["conclusion"]
    action = found["action"]
    risk_class = effective_risk_class(action["tool"], action["risk_class"])
    problems = fix_problems(action["tool"], action["args"], risk_class, found, system_of(ctx))
    if problems:
        # The playbook never proposes such a fix; a definition edited into one is refused.
        append_step_event(
            ctx.session_id,
            AGENT_NOTE,
            {"text": "fix not proposed: " + "; ".join(problems)},
            producer=ctx.producer,
            run=run,
        )
        return {"_summary": "fix refused by the policy"}
    call = {
        "call_id": FIX_CALL,
        "tool": action["tool"],
        "args": action["args"],
        "risk_class": risk_class,
        "is_action": True,
        "position": 1,
    }
    made = ToolCall.objects.filter(session_id=ctx.session_id, call_id=FIX_CALL).exists()
    propose_action(tool_context(ctx, run), call, fresh=not made)
    ctx.actions = None
    return {"_commit": True, "_summary": f"proposed {action['tool']} ({risk_class})"}


@recorded("execute_fix")
def execute_fix(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """An approved fix goes out through the outbox (its row was written with the
    decision); a message sent while the approval waited is read, not acted on."""
    update: dict[str, Any] = {"_commit": True}
    latest = (
        Event.objects.filter(
            session_id=ctx.session_id, type=USER_MESSAGE, seq__gt=state.get("consumed_seq", 0)
        )
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    if latest is not None:
        update["consumed_seq"] = latest
    tctx = tool_context(ctx, run)
    executed = 0
    for tool_call in ToolCall.objects.filter(
        session_id=ctx.session_id,
        is_action=True,
        status__in=(ToolCallStatus.APPROVED, ToolCallStatus.EXECUTING, ToolCallStatus.RUNNING),
    ):
        run_action(tctx, tool_call.pk)
        executed += 1
    ctx.actions = None
    update["_summary"] = f"{executed} fixes sent"
    return update


@recorded("report", last=True)
def report(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    found: dict[str, Any] = state["conclusion"]
    playbook = playbook_of(ctx)
    incident = state["bundle"]["incident"]
    labels: dict[str, str] = {
        str(k): v for k, v in playbook.problem_types.get(found["problem_type"], {}).items()
    }
    extra = {
        "incident": {**incident, "title": incident.get("title") or incident["description"][:80]},
        "diagnosis": {
            **found,
            # {"zh", "en"} pairs: the report is worded in each reader's language
            "summary": found["summary"],
            "problem_type_label": {
                language: labels.get(language, found["problem_type"]) for language in ("zh", "en")
            },
        },
        "evidence": state["evidence"]["calls"],
        "answers": state.get("answers", []),
        # the three best past cases, as the conclusion's step linked them
        "similar": linked_cases(Session.objects.get(pk=ctx.session_id)),
    }
    write_report(
        ctx.session_id, ctx.definition, dict(state), producer=ctx.producer, run=run, extra=extra
    )
    return {"reported": True, "_summary": "report written"}
