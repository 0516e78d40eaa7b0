"""The output generator: the report, once every required action is settled."""

from __future__ import annotations

from typing import Any

from diagnosis.agent import budget, fsm, prompts, summaries
from diagnosis.agent.planning import facts_of
from diagnosis.agent.recording import recorded
from diagnosis.agent.state import AgentContext, AgentState
from diagnosis.events import append_step_event
from diagnosis.models import AgentRun
from diagnosis.reporting import md_cell, write_report


@recorded("output_generator", last=True)
def output_generator(state: AgentState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    if state["plan"]["step"] == "stop":
        outcome, by, reason = budget.stop_reason(state["plan"]["request"])
        lang = "zh" if state.get("language") == "zh" else "en"
        preface = prompts.BUDGET_STOPPED_PREFACE[lang].format(
            by=md_cell(by), reason=md_cell(reason or outcome)
        )
        write_report(
            ctx.session_id,
            ctx.definition,
            dict(state),
            producer=ctx.producer,
            run=run,
            preface=preface,
        )
        return {"reported": True, "_summary": "report written (budget refused)"}
    facts = facts_of(state, ctx)
    violation = fsm.check_step(ctx.definition, facts, "write_report")
    if violation:
        raise RuntimeError(violation)  # the validator routes here only when settled
    write_report(
        ctx.session_id,
        ctx.definition,
        dict(state),
        producer=ctx.producer,
        run=run,
        postscript=unanswered_postscript(state, ctx.definition),
    )
    done = fsm.state_name(ctx.definition, fsm.state_index(fsm.Facts(True, True, True, True, True)))
    append_step_event(
        ctx.session_id,
        "fsm.transition",
        {"from": state.get("fsm"), "to": done},
        producer=ctx.producer,
        run=run,
    )
    return {"reported": True, "fsm": done, "_summary": summaries.REPORT_WRITTEN}


def unanswered_postscript(state: AgentState, definition: dict[str, Any]) -> str:
    """The optional fields asked alongside the approvals and still unknown at the end
    (never answered, or answered "unknown"): the report names them."""
    fields = state.get("fields") or {}
    lang = "zh" if state.get("language") == "zh" else "en"
    unanswered = [
        name
        for name in dict.fromkeys(state.get("asked") or [])
        if definition["fields"][name]["priority"] == "P2" and fields.get(name) is None
    ]
    if not unanswered:
        return ""
    sep = "、" if lang == "zh" else ", "
    labels = sep.join(md_cell(definition["fields"][n]["label"][lang]) for n in unanswered)
    return prompts.UNANSWERED_POSTSCRIPT[lang].format(labels=labels)
