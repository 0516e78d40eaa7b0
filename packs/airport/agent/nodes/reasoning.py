"""The reasoning node: picks the next step (the policy's, or the model's checked by it)
and words the question when the step is to ask."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from diagnosis.agent import prompts, summaries
from diagnosis.agent.react import react_plan
from diagnosis.agent.recording import recorded
from diagnosis.agent.state import AgentContext
from diagnosis.eventlog.names import AGENT_NOTE, AGENT_QUESTION, AGENT_QUESTION_CLOSED
from diagnosis.events import append_event_once
from diagnosis.models import AgentRun, ToolCallStatus
from packs.airport.agent.planning import action_calls_of, offline_plan
from packs.airport.agent.react_policy import decide
from packs.airport.agent.state import ApronState, progress
from scenarios_admin.definition import value_order


def default_plan(state: ApronState, ctx: AgentContext) -> dict[str, Any]:
    """With a real provider the model picks the calls (diagnosis.agent.react), checked by
    the policy; the step that runs is always the policy's (safety-critical sequencing is
    policy, not model output). Offline: the deterministic planner alone."""
    return react_plan(state, ctx, offline_plan, decide, progress)


# Tests replace this to script an agent that misbehaves.
PLANNER: dict[str, Callable[[ApronState, AgentContext], dict[str, Any]]] = {"plan": default_plan}


@recorded("reasoning", rows=False)
def reasoning(state: ApronState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    note_unexecuted_actions(ctx, run)
    plan = PLANNER["plan"](state, ctx)
    update: dict[str, Any] = {"plan": plan, "refusals": []}
    if plan["step"] == "ask":
        update.update(_question(state, ctx, run, plan["field"], optional=False))
        update["_summary"] = summaries.asks_for(plan["field"])
    elif plan["step"] == "await" and plan.get("ask"):
        update.update(_question(state, ctx, run, plan["ask"], optional=True))
        update["_summary"] = "await"
    elif plan["step"] == "finish" and (open_question := state.get("question") or {}).get(
        "optional"
    ):
        close_question(ctx, run, open_question, state.get("language", "en"))
        update["question"] = None
        update["_summary"] = "finish"
    elif plan["step"] == "call":
        update["_summary"] = summaries.calls(c["tool"] for c in plan["calls"])
    else:
        update["_summary"] = plan["step"]
    return update


def _question(
    state: ApronState, ctx: AgentContext, run: AgentRun, field: str, *, optional: bool
) -> dict[str, Any]:
    """Word the question about `field` and log it (once, by key). An optional one is asked
    alongside the approvals: the agent does not wait for its answer."""
    asked = list(state.get("asked") or [])
    explained = list(state.get("explained") or [])
    offer_correction = False
    spec = ctx.definition["fields"][field]
    lang = state.get("language", "en")
    text = spec["ask"][lang]
    candidate = (state.get("unconfirmed") or {}).get(field)
    if candidate is not None and "replaces" in candidate:
        text = prompts.conflict(
            spec, candidate["value"], candidate["replaces"], candidate["evidence"], lang
        )
    elif candidate is not None:
        text = prompts.confirmation(spec, candidate["value"], candidate["evidence"], lang)
    elif field in asked and state.get("unsure"):
        # Why it is needed is said once; asked again, the question is short. Both
        # point at the correction form (the fact can be given there whenever known).
        if field in explained:
            text = prompts.STILL_NEEDED[lang].format(label=spec["label"][lang])
        else:
            text = _unsure_hint(spec, lang) + text + prompts.CORRECTION_OFFER[lang]
            explained.append(field)
        offer_correction = True
    elif field in asked and not state.get("only_corrections"):
        text = _retry_hint(spec, lang) + text
    asked.append(field)
    question = {"field": field, "text": text, "key": f"q{len(asked)}"}
    payload = {"field": field, "label": spec["label"][lang], "text": text}
    if optional:
        question["optional"] = payload["optional"] = True
    if offer_correction:
        question["offer_correction"] = payload["offer_correction"] = True
    append_event_once(
        ctx.session_id,
        AGENT_QUESTION,
        question["key"],
        payload,
        producer=ctx.producer,
        run=run,
    )
    return {"asked": asked, "question": question, "explained": explained}


def close_question(
    ctx: AgentContext,
    run: AgentRun,
    question: dict[str, Any],
    lang: str,
    *,
    reason: str = "unanswered",
    optional: bool = True,
) -> None:
    """A question closes without its field settled, once (by key), with why: left open
    when every action was decided ("unanswered": the session completes without it, and
    the page and the report say so), or answered without a value (see
    nodes.input.close_question_not_settled)."""
    append_event_once(
        ctx.session_id,
        AGENT_QUESTION_CLOSED,
        f"closed:{question['key']}",
        {
            "question": question["key"],
            "field": question["field"],
            "label": ctx.definition["fields"][question["field"]]["label"][lang],
            "answered": False,
            "reason": reason,
            "optional": optional,
        },
        producer=ctx.producer,
        run=run,
    )


def note_unexecuted_actions(ctx: AgentContext, run: AgentRun) -> None:
    """A rejected or timed-out action goes back to the agent with its reason: it carries
    on without it (the report records it) and says so on the timeline, once."""
    for call in action_calls_of(ctx):
        if call.status not in (ToolCallStatus.REJECTED, ToolCallStatus.TIMEOUT):
            continue
        outcome = "rejected" if call.status == ToolCallStatus.REJECTED else "timed out"
        append_event_once(
            ctx.session_id,
            AGENT_NOTE,
            f"unexecuted:{call.pk}",
            {
                "tool_call": call.pk,
                "tool_name": call.tool_name,
                "args": call.request_payload,
                "outcome": outcome,
                "reason": call.decision_reason,
                "text": f"Continuing without {call.tool_name} ({outcome}: "
                f"{call.decision_reason or 'no reason given'}); the report records it"
                + ("; a manual to-do was opened." if outcome == "timed out" else "."),
            },
            producer=ctx.producer,
            run=run,
        )


def _options(spec: dict[str, Any], lang: str) -> str:
    values = spec.get("values") or {}
    return " / ".join(values[k].get("label", {}).get(lang, k) for k in value_order(spec))


def _retry_hint(spec: dict[str, Any], lang: str) -> str:
    names = _options(spec, lang)
    if lang == "zh":
        return "未能识别您的回答。" + (f"可选：{names}。" if names else "")
    return "I could not recognise that answer. " + (f"Options: {names}. " if names else "")


def _unsure_hint(spec: dict[str, Any], lang: str) -> str:
    """The operator does not know yet: a required fact decides the risk, so it is asked
    again, with what to do (an unknown never matches a rule: guessing is not an option)."""
    names = _options(spec, lang)
    if lang == "zh":
        return "风险评估需要这一项：请向机组或现场人员确认后告诉我。" + (
            f"可选：{names}。" if names else ""
        )
    return "The risk cannot be assessed without this: please check with the crew or the " + (
        f"staff on site, then tell me. Options: {names}. " if names else "staff on site. "
    )


def route_after_reasoning(
    state: ApronState,
) -> Literal["ask_user", "tool_executor", "await_approval", "compliance_validator"]:
    step = state["plan"]["step"]
    if step == "ask":
        return "ask_user"
    if step == "call":
        return "tool_executor"
    if step == "await":
        return "await_approval"
    return "compliance_validator"  # finish, or stop (the budget ran out and was refused)
