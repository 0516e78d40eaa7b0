"""The hierarchical run mode: an orchestrator whose four specialists run as child agents
of it (each its own job, in parallel on as many workers; diagnosis.agent.child_agents),
each with its own run and steps, their evidence aggregated in a fixed order; degrading
to the minimal path when more than the pack's share of them failed."""

from __future__ import annotations

from typing import Any, TypedDict

from django.utils.translation import gettext as _
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from diagnosis.agent import waits
from diagnosis.agent.child_agents import Child, wait_for_children
from diagnosis.agent.recording import child_run, commit_steps, recorded
from diagnosis.agent.state import AgentContext
from diagnosis.events import append_step_event
from diagnosis.models import AgentRun
from packs.diagnosis.budget_pause import paused
from packs.diagnosis.investigation import Investigation
from packs.diagnosis.model_choice import AWAIT, budget_gate, budget_refused, pick_calls
from packs.diagnosis.modes import (
    AGGREGATED,
    MODE_SWITCHED,
    PLAN,
    SPECIALIST_KIND,
    SPECIALIST_REPORTED,
    SPECIALISTS,
)
from packs.diagnosis.skill_calls import is_skill
from packs.diagnosis.specialist_questions import (
    specialist_answer,
    specialist_ask,
    window_question,
)
from packs.diagnosis.steps import (
    DiagnosisState,
    gather,
    investigation_of,
    playbook_of,
    set_mode,
    system_of,
)

# The tools each specialist may use when a model chooses its calls: its playbook reads
# and the searches of the same source.
SPECIALIST_TOOLS = {
    "logs": ("log_signatures", "log_search"),
    "metrics": ("anomalies", "metric_query"),
    "changes_code": ("deploys", "config_changes", "commits", "code"),
    "knowledge": ("topology", "similar_cases"),
}
# A degraded hierarchical run's evidence: the metrics and the changes.
MINIMAL_PATH = ("anomalies", "deploys", "config_changes", "commits")


def specialist_calls(inv: Investigation, name: str) -> tuple[list[dict[str, Any]], str]:
    """A specialist's calls, and why it cannot work ("" when it can): logs and metrics
    read their source; changes and code read the changes, then the code each frame of the
    blamed deploy's new errors points at; knowledge looks up each candidate's place in the
    service graph and the past cases like this one. A specialist chooses its follow-ups
    from the playbook's reading of the bundle (its own look at the case); the orchestrator
    concludes from what was read."""
    base = {c["tool"]: c for c in inv.base_calls()}
    sources = inv.bundle.sources
    if name == "logs":
        return [base[t] for t in ("log_signatures",) if t in base], (
            "" if sources["logs"] else _("the bundle has no logs.jsonl")
        )
    if name == "metrics":
        return [base[t] for t in ("anomalies",) if t in base], (
            "" if sources["metrics"] else _("the bundle has no metrics.csv")
        )
    follow = inv.follow_ups(inv.whole)
    if name == "changes_code":
        calls = [base[t] for t in ("deploys", "config_changes", "commits") if t in base]
        calls += [c for c in follow if c["tool"] == "code"]
        held = sources["deploys"] or sources["config_changes"] or sources.get("commits", False)
        return calls, "" if held else _("the bundle has no deploys.yaml or config_changes.yaml")
    return [
        c for c in follow if c["tool"] in ("topology", "similar_cases") or is_skill(c["tool"])
    ], ""


@recorded("orchestrate", fans_out=True)
def orchestrate(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The orchestrator splits the work: its plan names the specialists and their tools;
    the group commits before it waits for them. With a model, the budget is checked
    once for the specialists' calls: spent, the orchestrator waits before it splits."""
    if budget_gate(state, ctx, run) == AWAIT:
        return paused("orchestrate")
    set_mode(run, "hierarchical")
    inv = investigation_of(ctx, state)
    specialists = [
        {"name": name, "tools": [c["tool"] for c in specialist_calls(inv, name)[0]]}
        for name in SPECIALISTS
    ]
    append_step_event(
        ctx.session_id,
        PLAN,
        {"mode": "hierarchical", "specialists": specialists},
        producer=ctx.producer,
        run=run,
    )
    return {
        "orchestrator": run.pk,
        "_summary": _("%(n)s specialists in parallel") % {"n": len(specialists)},
    }


class SpecialistState(TypedDict, total=False):
    session_id: str
    specialist: str
    problem_type: str
    language: str
    calls: list[dict[str, Any]]  # the evidence items so far
    failed: str  # why it could not work
    done: bool
    ask: str  # a question for the reporter, asked next (specialist_questions)
    asked: bool
    window: dict[str, str] | None  # the log window the reporter's answer gave
    answer_seq: int  # the answer's seq: the orchestrator counts it as read


class _SpecialistFailed(Exception):
    """Ends a failed specialist's block: its run is marked failed (recording.child_run)."""


@recorded("look")
def specialist_look(state: SpecialistState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """A specialist's ReAct step: its next call not made yet, made; done when none is left."""
    inv = Investigation(
        ctx.session_id, system_of(ctx), playbook_of(ctx), state.get("problem_type") or ""
    )
    calls, cannot = specialist_calls(inv, state["specialist"])
    if cannot:
        return {"failed": cannot, "done": True, "_summary": cannot}
    made = {e["id"] for e in state.get("calls") or []}
    if state["specialist"] == "logs" and not made and not state.get("asked"):
        question = window_question(inv, state.get("language") or "")
        if question:
            return {"ask": question, "_summary": _("asks the reporter")}
    left = [c for c in calls if c["call_id"] not in made]
    # With a model, the model chooses among its tools (the playbook's order offline), in
    # the job (no waits) or as a wait of the specialist's own child job; offline once
    # continuing past the model budget was refused.
    offline = budget_refused(ctx)
    picked = pick_calls(
        inv,
        ctx,
        run,
        state.get("calls") or [],
        left,
        left[:1],
        purpose="specialist",
        tools=SPECIALIST_TOOLS[state["specialist"]],
        role=f"{state['specialist']} specialist",
        offline_only=offline,
    )
    if not picked.calls:
        return {"done": True, "_summary": _("nothing left to read")}
    call = picked.calls[0]
    if state.get("window") and call["tool"] == "log_signatures":
        call = {**call, "args": dict(state["window"] or {})}  # the reporter's window
    item = gather(inv, ctx, run, call)
    return {
        "calls": [*(state.get("calls") or []), item],
        "done": not [c for c in left if c["call_id"] != item["id"]],
        "_summary": item["summary"][:200],
    }


@recorded("hand_back")
def specialist_report(state: SpecialistState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """What the specialist hands back, as an event: its evidence, and failed with the
    reason when it could not work or a call of its failed."""
    calls = state.get("calls") or []
    reason = state.get("failed") or "; ".join(
        f"{e['id']}: {e['error']}" for e in calls if e.get("error")
    )
    owner = ctx.parent_run or run
    append_step_event(
        ctx.session_id,
        SPECIALIST_REPORTED,
        {
            "specialist": state["specialist"],
            "status": "failed" if reason else "completed",
            "run": owner.pk,
            "evidence": [e["id"] for e in calls],
            "reason": reason,
        },
        producer=ctx.producer,
        run=run,
    )
    return {"failed": reason, "_summary": reason or _("reported")}


def _after_look(state: SpecialistState) -> str:
    return "ask" if state.get("ask") else "report" if state.get("done") else "look"


def _specialist_graph() -> Any:
    builder = StateGraph(SpecialistState, context_schema=AgentContext)
    builder.add_node("look", specialist_look, input_schema=SpecialistState)
    builder.add_node("report", specialist_report, input_schema=SpecialistState)
    builder.add_node("ask", specialist_ask, input_schema=SpecialistState)
    builder.add_node("answer", specialist_answer, input_schema=SpecialistState)
    builder.add_edge(START, "look")
    builder.add_conditional_edges("look", _after_look, ["look", "ask", "report"])
    builder.add_edge("ask", "answer")
    builder.add_edge("answer", "look")
    builder.add_edge("report", END)
    return builder.compile()


SPECIALIST_GRAPH = _specialist_graph()


def await_specialists(state: DiagnosisState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """The orchestrator waits for its specialists as it would for the model: each runs
    as a child agent of its own (its own job, diagnosis.agent.child_agents), and this
    step reads their reports once every one has handed back. Without waits (the CLI)
    they run here, one after the other."""
    ctx = runtime.context
    orchestrator = AgentRun(pk=state["orchestrator"], session_id=ctx.session_id)
    orchestrator._state.adding = False
    problem_type = state["bundle"].get("problem_type") or ""
    children = [
        Child(
            name,
            {
                "specialist": name,
                "problem_type": problem_type,
                "language": state.get("language") or "",
            },
        )
        for name in SPECIALISTS
    ]
    join = f"specialists:{ctx.session_id}:{orchestrator.pk}"
    try:
        reports = wait_for_children(ctx, SPECIALIST_KIND, join, children, orchestrator)
    except waits.ModelWait as wait:
        commit_steps(ctx)
        waits.interrupt_for(wait)
        raise  # not reached: interrupt_for raises the interrupt
    return {"specialists": [{"name": c.name, **reports[c.name]} for c in children]}


def run_specialist(ctx: AgentContext, key: str, args: dict[str, Any]) -> dict[str, Any]:
    """A specialist as a child agent: its run under the orchestrator's (its own mode,
    status, times, tokens), its steps recorded under it (its own graph), keyed by `key`
    so a run again (a kill -9, a wait) writes nothing twice. Returns its report."""
    name = args["specialist"]
    agent = f"specialist_{name}"
    report: dict[str, Any] = {"name": name, "status": "completed", "reason": ""}
    try:
        with child_run(ctx, agent, key) as child:
            assert child.parent_run is not None
            report["run"] = child.parent_run.pk
            result = SPECIALIST_GRAPH.invoke(
                {
                    "session_id": str(ctx.session_id),
                    "specialist": name,
                    "problem_type": args.get("problem_type") or "",
                    "language": args.get("language") or "",
                    "calls": [],
                },
                context=child,
            )
            commit_steps(child)  # its steps before its end
            report["evidence"] = result.get("calls") or []
            report["answer_seq"] = result.get("answer_seq") or 0
            if result.get("failed"):
                report.update(status="failed", reason=result["failed"])
                raise _SpecialistFailed(result["failed"])
    except _SpecialistFailed:
        pass  # its run is marked failed; the orchestrator counts it
    return report


@recorded("aggregate")
def aggregate(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The orchestrator aggregates its specialists' evidence, in their fixed order, and
    concludes. When more than the pack's share of them failed, it degrades to the minimal
    path: the metrics and the changes only (a failed read made again once), and says so."""
    set_mode(run, "hierarchical")
    inv = investigation_of(ctx, state)
    reports = {r["name"]: r for r in state.get("specialists") or []}
    ordered = [reports[name] for name in SPECIALISTS if name in reports]
    failed = [r["name"] for r in ordered if r["status"] == "failed"]
    append_step_event(
        ctx.session_id,
        AGGREGATED,
        {
            "specialists": [
                {k: r.get(k) for k in ("name", "status", "run", "reason")} for r in ordered
            ],
            "failed": len(failed),
            "of": len(ordered),
        },
        producer=ctx.producer,
        run=run,
    )
    evidence = list(state["evidence"]["calls"])
    gathered = [item for r in ordered for item in r.get("evidence") or []]
    threshold = playbook_of(ctx).modes.specialist_failure_threshold
    words = _("%(ok)s of %(of)s specialists reported") % {
        "ok": len(ordered) - len(failed),
        "of": len(ordered),
    }
    if ordered and len(failed) / len(ordered) > threshold:
        append_step_event(
            ctx.session_id,
            MODE_SWITCHED,
            {
                "from": "hierarchical",
                "to": "minimal",
                "reason": "specialists_failed",
                "failed": failed,
                "of": len(ordered),
                "threshold": threshold,
            },
            producer=ctx.producer,
            run=run,
        )
        for tool in MINIMAL_PATH:
            done = [e for e in gathered if e["tool"] == tool and not e["error"]]
            if done:
                evidence += done
            elif any(c["tool"] == tool for c in inv.base_calls()):
                evidence.append(gather(inv, ctx, run, inv.retry_call(tool)))
        words += "; " + _("degraded to the minimal path")
    else:
        evidence += gathered
    # A specialist's answer was its own: the orchestrator's waits never read it as theirs.
    answered = max((r.get("answer_seq") or 0 for r in ordered), default=0)
    return {
        "evidence": {"calls": evidence},
        "conclusion": inv.conclusion(evidence),
        "consumed_seq": max(state.get("consumed_seq") or 0, answered),
        "_summary": words,
    }
