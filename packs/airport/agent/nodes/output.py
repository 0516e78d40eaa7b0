"""The output generator: the report, once every required action is settled."""

from __future__ import annotations

from typing import Any

from diagnosis.agent import budget, prompts, summaries
from diagnosis.agent.nodes.proposals import DONE_OR_UNDER_WAY, base_call_id
from diagnosis.agent.recording import recorded
from diagnosis.agent.state import AgentContext, AgentState
from diagnosis.events import append_step_event
from diagnosis.models import (
    WITHDRAWN_NOT_CALLED_FOR,
    WITHDRAWN_NOT_CALLED_FOR_ANSWER,
    AgentRun,
    Event,
)
from diagnosis.reporting import display_value, md_cell, write_report
from packs.airport.agent import fsm, policy
from packs.airport.agent.planning import action_calls_of, facts_of


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
        postscript="\n".join(
            part
            for part in (
                corrections_postscript(state, ctx),
                unanswered_postscript(state, ctx.definition),
            )
            if part
        ),
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


def corrections_postscript(state: AgentState, ctx: AgentContext) -> str:
    """Facts corrected (or an optional answer given) after the risk was assessed: each
    re-assessment (what it was, what changed), the approvals withdrawn because the new
    facts no longer call for them, and the actions approved under the earlier facts that
    the new ones no longer call for, kept as history (done is done)."""
    if not state.get("revision"):
        return ""  # never re-planned: nothing to read (no query on the common path)
    reassessed = [
        e.payload
        for e in Event.objects.filter(
            session_id=ctx.session_id, type="risk.assessed", payload__has_key="reassessed_from"
        ).order_by("seq")
    ]
    if not reassessed:
        return ""
    lang = "zh" if state.get("language") == "zh" else "en"
    words = prompts.CORRECTIONS_POSTSCRIPT[lang]
    fields = ctx.definition["fields"]
    sep = "、" if lang == "zh" else ", "
    lines = [words["title"]]
    for risk in reassessed:
        changed = {**(risk.get("corrected") or {}), **(risk.get("answered") or {})}
        what = sep.join(
            f"{md_cell(fields[n]['label'][lang])} → {md_cell(display_value(fields[n], v, lang))}"
            for n, v in changed.items()
            if n in fields
        )
        before = risk["reassessed_from"]
        lines.append(
            words["answered" if risk.get("answered") else "corrected"].format(
                what=what,
                before=f"{before.get('level')} ({before.get('rule')})",
                after=f"{risk.get('level')} ({risk.get('rule')})",
            )
        )
    actions = action_calls_of(ctx)
    withdrawn = [
        a
        for a in actions
        if a.decision_reason in (WITHDRAWN_NOT_CALLED_FOR, WITHDRAWN_NOT_CALLED_FOR_ANSWER)
    ]
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
    kept = [
        a
        for a in actions
        if a.status in DONE_OR_UNDER_WAY and base_call_id(a.call_id) not in wanted
    ]
    if withdrawn:
        lines.append(words["withdrawn"].format(calls=_calls(withdrawn, sep)))
    if kept:
        lines.append(words["kept"].format(calls=_calls(kept, sep)))
    return "\n".join(lines)


def _calls(calls: list[Any], sep: str) -> str:
    return sep.join(
        md_cell(c.tool_name)
        + (
            " ("
            + ", ".join(f"{k}={v}" for k, v in c.request_payload.items() if k != "message")
            + ")"
            if any(k != "message" for k in c.request_payload)
            else ""
        )
        for c in calls
    )


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
