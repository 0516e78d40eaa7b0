"""A diagnosis session's graph: intake (and the run mode) -> evidence, gathered the way
the session's mode gathers it -> conclusion -> fix proposed -> approval -> fix executed
-> report, with an ask-the-reporter wait when the evidence names no root cause.

The run modes (DIAGNOSIS.md §4, docs/diagnosis-pack.md): ReAct, one evidence call a
step chosen from what is known, moving to plan-execute after the pack's number of steps
in a row that added nothing; plan-execute, a plan of calls shown before it runs; and
hierarchical, an orchestrator whose four specialists run in parallel as child runs,
degrading to the minimal path when too many fail. Every mode makes the same calls
(packs.diagnosis.investigation) and concludes with the playbook's reading of what they
read, so all three conclude alike from the same bundle.

Every step is recorded by the core (diagnosis.agent.recording): each evidence tool is an
R0 ToolCall with its start and result events, the conclusion is `finding.recorded`
events, the fix goes through the core's approval queue and outbox. The conclusion is
the offline playbook's (packs.diagnosis.playbook), pinned in the session's scenario
version; a model may word it later, never change it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Annotated, Any, Literal, TypedDict

from django.utils.translation import gettext as _
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from diagnosis.agent.nodes.proposals import propose_action
from diagnosis.agent.nodes.waiting import ask_user, await_approval
from diagnosis.agent.recording import child_run, recorded, task_key
from diagnosis.agent.state import AgentContext
from diagnosis.agent.tools import ToolContext, run_action, run_recorded
from diagnosis.events import append_event_once, append_step_event
from diagnosis.models import AgentRun, Event, Session, ToolCall, ToolCallStatus
from diagnosis.reporting import write_report
from packs.diagnosis.bundle import Bundle, open_bundle
from packs.diagnosis.fixes import fix_problems
from packs.diagnosis.investigation import FOLLOW_UPS, Investigation
from packs.diagnosis.knowledge import linked_cases
from packs.diagnosis.modes import (
    AGGREGATED,
    MODE_CHOSEN,
    MODE_SWITCHED,
    PLAN,
    SPECIALIST_REPORTED,
    SPECIALISTS,
    choose_mode,
)
from packs.diagnosis.names import SIMILAR
from packs.diagnosis.playbook import Playbook
from packs.diagnosis.storage import bundle_dir
from packs.diagnosis.system import System, demo_shop
from scenarios_admin.definition import effective_risk_class

FIX_CALL = "fix-1"
QUESTION_KEY = "q-evidence"
# A degraded hierarchical run's evidence: the metrics and the changes.
MINIMAL_PATH = ("anomalies", "deploys", "config_changes")
ASK = {
    "zh": "证据不足以确定根因（缺少：{missing}）。"
    "请补充您知道的情况：哪个服务、什么时候开始、最近有哪些变更？",
    "en": "The evidence names no root cause (missing: {missing}). Please add what you know: "
    "which service, since when, and any recent change?",
}


class DiagnosisState(TypedDict, total=False):
    """What the graph carries between steps (its checkpoint); the log is the history."""

    session_id: str
    language: str
    consumed_seq: int  # the last user.message seq read
    question: dict[str, Any] | None
    bundle: dict[str, Any]  # the read_bundle call's result
    evidence: dict[str, Any]  # {"calls": [{id, tool, summary, error}]}
    conclusion: dict[str, Any]  # the playbook's, as the findings record it
    mode: str  # the run mode running now (react | plan_execute | hierarchical)
    idle: int  # ReAct: steps in a row that added no evidence
    plan: list[dict[str, Any]]  # plan-execute: the calls planned
    orchestrator: int  # hierarchical: the orchestrator's run
    specialists: Annotated[list[dict[str, Any]], operator.add]  # their reports
    answers: list[str]
    new_input: bool  # the core's approval wait sets it
    reported: bool


def build_graph() -> StateGraph[DiagnosisState, AgentContext, DiagnosisState, DiagnosisState]:
    builder = StateGraph(DiagnosisState, context_schema=AgentContext)
    # The core's recorded nodes are annotated with the airport's state: each node reads
    # this graph's state instead.
    nodes: list[tuple[str, Any]] = [
        ("intake", intake),
        ("react_step", react_step),
        ("plan", plan),
        ("execute", execute),
        ("orchestrate", orchestrate),
        *((f"specialist_{name}", specialist_node(name)) for name in SPECIALISTS),
        ("aggregate", aggregate),
        ("conclude", conclude),
        ("ask_user", ask_user),
        ("read_answer", read_answer),
        ("propose_fix", propose_fix),
        ("await_approval", await_approval),
        ("execute_fix", execute_fix),
        ("report", report),
    ]
    for name, node in nodes:
        builder.add_node(name, node, input_schema=DiagnosisState)
    builder.add_edge(START, "intake")
    builder.add_conditional_edges("intake", route_by_mode)
    builder.add_conditional_edges("react_step", route_after_react)
    builder.add_edge("plan", "execute")
    builder.add_edge("execute", "conclude")
    for name in SPECIALISTS:
        builder.add_edge("orchestrate", f"specialist_{name}")
    builder.add_edge([f"specialist_{name}" for name in SPECIALISTS], "aggregate")
    builder.add_edge("aggregate", "conclude")
    builder.add_conditional_edges("conclude", route_after_conclusion)
    builder.add_edge("ask_user", "read_answer")
    builder.add_edge("read_answer", "report")
    builder.add_edge("propose_fix", "await_approval")
    builder.add_edge("await_approval", "execute_fix")
    builder.add_conditional_edges("execute_fix", route_after_execution)
    builder.add_edge("report", END)
    return builder


def initial_state(session: Any, definition: dict[str, Any]) -> dict[str, Any]:
    return {"session_id": str(session.pk), "language": session.language, "consumed_seq": 0}


@contextmanager
def session_bundle(session_id: Any) -> Iterator[Bundle]:
    """The bundle stored with the session (checked again: it is read from disk)."""
    bundle = open_bundle(bundle_dir(session_id))
    try:
        yield bundle
    finally:
        bundle.close()


def _tctx(ctx: AgentContext, run: AgentRun) -> ToolContext:
    return ToolContext(ctx.session_id, ctx.graph, run, ctx.producer, definition=ctx.definition)


def _system(ctx: AgentContext) -> System:
    return ctx.graph if isinstance(ctx.graph, System) else demo_shop()


def _playbook(ctx: AgentContext) -> Playbook:
    return Playbook.model_validate(ctx.definition["playbook"])


# --- intake ------------------------------------------------------------------------------


@recorded("intake")
def intake(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    requested = (
        Event.objects.filter(session_id=ctx.session_id, type="diagnosis.requested")
        .values_list("payload", flat=True)
        .first()
    ) or {}
    # Where the metrics come from: the bundle's file or a configured Prometheus.
    metrics = requested.get("metrics") or {}

    def read() -> dict[str, Any]:
        with session_bundle(ctx.session_id) as bundle:
            incident = bundle.incident
            sources = bundle.sources
            live = metrics.get("source") == "prometheus"
            if live:
                sources = {**sources, "metrics": True}
            return {
                "incident": {
                    "id": incident.id,
                    "title": incident.title,
                    "description": incident.description,
                    "reported_at": incident.reported_at.isoformat(),
                    "problem_type": incident.problem_type,
                    "services": list(incident.services),
                    "preferred_mode": incident.preferred_mode or "",
                },
                "sources": sources,
                "log_lines": bundle.log_lines,
                "metric_rows": bundle.metric_rows,
                "deploys": len(bundle.deploys),
                "config_changes": len(bundle.config_changes),
                "metrics_from": metrics,
                "summary": _sources_words(sources, bundle.log_lines, bundle.metric_rows)
                + (
                    f"; metrics from Prometheus {metrics.get('name')} ({metrics.get('base_url')})"
                    if live
                    else ""
                ),
            }

    result, error = run_recorded(
        _tctx(ctx, run), {"call_id": "ev-bundle", "tool": "read_bundle", "args": {}}, read
    )
    if error:
        raise RuntimeError(f"the session's bundle cannot be read: {error}")
    # The reporter's opening words are the bundle's description: read with it, so only a
    # later message answers a question.
    opening = (
        Event.objects.filter(session_id=ctx.session_id, type="user.message")
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    result = {**result, "problem_type": requested.get("problem_type", "")}
    # The run mode: the reporter's preferred one (the request's, else the bundle's), else
    # the routing matrix's for the stated problem type, else the pack's default.
    stated = result["problem_type"] or result["incident"]["problem_type"] or ""
    preferred = requested.get("preferred_mode", "")
    mode, source = choose_mode(
        preferred, result["incident"]["preferred_mode"], stated, _playbook(ctx).modes
    )
    append_step_event(
        ctx.session_id,
        MODE_CHOSEN,
        {
            "mode": mode,
            "source": source,
            "problem_type": stated,
            "preferred": preferred or result["incident"]["preferred_mode"],
        },
        producer=ctx.producer,
        run=run,
    )
    _set_mode(ctx.root_run, mode)
    evidence = [
        {"id": "ev-bundle", "tool": "read_bundle", "summary": result["summary"], "error": ""}
    ]
    return {
        "bundle": result,
        "consumed_seq": opening or 0,
        "mode": mode,
        "evidence": {"calls": evidence},
        "_summary": result["summary"],
    }


def _sources_words(sources: dict[str, bool], log_lines: int, metric_rows: int) -> str:
    held = [name for name, present in sources.items() if present]
    lacking = [name for name, present in sources.items() if not present]
    words = f"{log_lines} log lines, {metric_rows} metric samples; sources: {', '.join(held)}"
    return words + (f"; lacking: {', '.join(lacking)}" if lacking else "")


# --- the run modes ---------------------------------------------------------------------------
# Every mode makes the same calls (packs.diagnosis.investigation) and hands the same
# conclusion to `conclude`: ReAct one call a step, chosen from what is known; plan-execute
# a plan shown before it runs; hierarchical four specialists in parallel, each a child
# run of the orchestrator with its own steps.


def _investigation(ctx: AgentContext, state: DiagnosisState) -> Investigation:
    return Investigation(
        ctx.session_id, _system(ctx), _playbook(ctx), state["bundle"].get("problem_type") or ""
    )


def _gather(
    inv: Investigation, ctx: AgentContext, run: AgentRun, call: dict[str, Any]
) -> dict[str, Any]:
    """One evidence call, recorded under `run`; the past cases it found are also one
    `diagnosis.similar_cases` event, written with it (keyed by the step: once)."""
    item, response = inv.run(_tctx(ctx, run), call)
    if call["tool"] == "similar_cases" and "cases" in response:
        append_step_event(
            ctx.session_id,
            SIMILAR,
            {"cases": response["cases"]},
            producer=ctx.producer,
            run=run,
        )
    return item


def _set_mode(run: AgentRun, mode: str) -> None:
    """A run's mode: a node run not yet written takes it with its insert."""
    run.mode = mode
    AgentRun.objects.filter(pk=run.pk).update(mode=mode)


def route_by_mode(state: DiagnosisState) -> Literal["react_step", "plan", "orchestrate"]:
    mode = state.get("mode") or "react"
    return (
        "plan"
        if mode == "plan_execute"
        else "orchestrate"
        if mode == "hierarchical"
        else ("react_step")
    )


def _next_call(inv: Investigation, evidence: list[dict[str, Any]]) -> dict[str, Any] | None:
    """ReAct's choice: the next source the bundle holds that is not read yet; then what
    the reading of the sources read so far leads to (a candidate's topology, the code the
    blamed deploy changed); None when nothing is left to read."""
    made = {e["id"] for e in evidence}
    for call in inv.base_calls():
        if call["call_id"] not in made:
            return call
    for call in inv.follow_ups(inv.reading(evidence)):
        if call["call_id"] not in made:
            return call
    return None


@recorded("react_step")
def react_step(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """Reason (choose the next call from what is known) -> act (call it) -> observe (did
    it add evidence?) -> decide (go on, conclude, or switch to plan-execute after the
    pack's number of steps in a row that added nothing)."""
    inv = _investigation(ctx, state)
    evidence = list(state["evidence"]["calls"])
    call = _next_call(inv, evidence)
    update: dict[str, Any] = {}
    words = ""
    if call is not None:
        item = _gather(inv, ctx, run, call)
        evidence.append(item)
        idle = 0 if item["new"] else state.get("idle", 0) + 1
        update["idle"] = idle
        words = f"{item['tool']}: " + (
            _("new evidence") if item["new"] else _("nothing new (%(n)s in a row)") % {"n": idle}
        )
        if _next_call(inv, evidence) is not None:
            limit = _playbook(ctx).modes.react_idle_steps
            if idle >= limit:
                idle_calls = [e["id"] for e in evidence[-limit:]]
                append_step_event(
                    ctx.session_id,
                    MODE_SWITCHED,
                    {
                        "from": "react",
                        "to": "plan_execute",
                        "reason": "no_new_evidence",
                        "steps": idle,
                        "calls": idle_calls,
                    },
                    producer=ctx.producer,
                    run=run,
                )
                update["mode"] = "plan_execute"
            return {**update, "evidence": {"calls": evidence}, "_summary": words}
    # Nothing left to read: the reading of what was read is the conclusion.
    return {
        **update,
        "evidence": {"calls": evidence},
        "conclusion": inv.conclusion(evidence),
        "_summary": (words + "; " if words else "") + _("enough evidence: conclude"),
    }


def route_after_react(state: DiagnosisState) -> Literal["react_step", "plan", "conclude"]:
    if state.get("conclusion"):
        return "conclude"
    return "plan" if state.get("mode") == "plan_execute" else "react_step"


@recorded("plan")
def plan(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """Plan-execute's plan, shown before it runs (its group commits with it): the reads
    not made yet, with their arguments, then what their reading leads to. After a switch
    from ReAct, the calls left."""
    inv = _investigation(ctx, state)
    evidence = list(state["evidence"]["calls"])
    made = {e["id"] for e in evidence}
    calls = [c for c in inv.base_calls() if c["call_id"] not in made]
    then: list[str] = list(FOLLOW_UPS)
    if not calls:  # every source read (a switch from ReAct): what they led to
        calls = [c for c in inv.follow_ups(inv.reading(evidence)) if c["call_id"] not in made]
        then = []
    if run.mode != "plan_execute":
        _set_mode(run, "plan_execute")
    append_step_event(
        ctx.session_id,
        PLAN,
        {
            "mode": "plan_execute",
            "calls": [{"id": c["call_id"], "tool": c["tool"], "args": c["args"]} for c in calls],
            "then": then,
        },
        producer=ctx.producer,
        run=run,
    )
    return {
        "plan": calls,
        "_commit": True,
        "_summary": _("%(n)s calls planned") % {"n": len(calls)},
    }


@recorded("execute")
def execute(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The plan's calls in order, then what their reading leads to, then one conclusion."""
    _set_mode(run, "plan_execute")
    inv = _investigation(ctx, state)
    evidence = list(state["evidence"]["calls"])
    for call in state.get("plan") or []:
        evidence.append(_gather(inv, ctx, run, call))
    made = {e["id"] for e in evidence}
    for call in inv.follow_ups(inv.reading(evidence)):
        if call["call_id"] not in made:
            evidence.append(_gather(inv, ctx, run, call))
    return {
        "evidence": {"calls": evidence},
        "conclusion": inv.conclusion(evidence),
        "_summary": _("%(n)s evidence calls") % {"n": len(evidence)},
    }


# --- hierarchical: an orchestrator and its specialists ----------------------------------------


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
        calls = [base[t] for t in ("deploys", "config_changes") if t in base]
        calls += [c for c in follow if c["tool"] == "code"]
        held = sources["deploys"] or sources["config_changes"]
        return calls, "" if held else _("the bundle has no deploys.yaml or config_changes.yaml")
    return [c for c in follow if c["tool"] in ("topology", "similar_cases")], ""


@recorded("orchestrate", fans_out=True)
def orchestrate(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The orchestrator splits the work: its plan names the specialists and their tools;
    the group commits so the specialists, on threads of their own, find it."""
    _set_mode(run, "hierarchical")
    inv = _investigation(ctx, state)
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
    calls: list[dict[str, Any]]  # the evidence items so far
    failed: str  # why it could not work
    done: bool


class _SpecialistFailed(Exception):
    """Ends a failed specialist's block: its run is marked failed (recording.child_run)."""


@recorded("look")
def specialist_look(state: SpecialistState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """A specialist's ReAct step: its next call not made yet, made; done when none is left."""
    inv = Investigation(
        ctx.session_id, _system(ctx), _playbook(ctx), state.get("problem_type") or ""
    )
    calls, cannot = specialist_calls(inv, state["specialist"])
    if cannot:
        return {"failed": cannot, "done": True, "_summary": cannot}
    made = {e["id"] for e in state.get("calls") or []}
    left = [c for c in calls if c["call_id"] not in made]
    if not left:
        return {"done": True, "_summary": _("nothing left to read")}
    item = _gather(inv, ctx, run, left[0])
    return {
        "calls": [*(state.get("calls") or []), item],
        "done": len(left) == 1,
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


def _specialist_graph() -> Any:
    builder = StateGraph(SpecialistState, context_schema=AgentContext)
    builder.add_node("look", specialist_look, input_schema=SpecialistState)  # type: ignore[misc]
    builder.add_node("report", specialist_report, input_schema=SpecialistState)  # type: ignore[misc]
    builder.add_edge(START, "look")
    builder.add_conditional_edges(
        "look", lambda s: "report" if s.get("done") else "look", ["look", "report"]
    )
    builder.add_edge("report", END)
    return builder.compile()


SPECIALIST_GRAPH = _specialist_graph()


def specialist_node(name: str) -> Any:
    """A parallel branch: the specialist `name` as a child run of the orchestrator (its
    own mode, status, times, tokens), its steps recorded under it (its own graph)."""

    def branch(state: DiagnosisState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
        ctx = runtime.context
        orchestrator = AgentRun(pk=state["orchestrator"], session_id=ctx.session_id)
        orchestrator._state.adding = False
        under = replace(ctx, parent_run=orchestrator)
        agent = f"specialist_{name}"
        report: dict[str, Any] = {"name": name, "status": "completed", "reason": ""}
        try:
            with child_run(under, agent, task_key(ctx, agent)) as child:
                assert child.parent_run is not None
                report["run"] = child.parent_run.pk
                result = SPECIALIST_GRAPH.invoke(
                    {
                        "session_id": state["session_id"],
                        "specialist": name,
                        "problem_type": state["bundle"].get("problem_type") or "",
                        "calls": [],
                    },
                    context=child,
                )
                report["evidence"] = result.get("calls") or []
                if result.get("failed"):
                    report.update(status="failed", reason=result["failed"])
                    raise _SpecialistFailed(result["failed"])
        except _SpecialistFailed:
            pass  # its run is marked failed; the orchestrator counts it
        return {"specialists": [report]}

    branch.__name__ = f"specialist_{name}"
    return branch


@recorded("aggregate")
def aggregate(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The orchestrator aggregates its specialists' evidence, in their fixed order, and
    concludes. When more than the pack's share of them failed, it degrades to the minimal
    path: the metrics and the changes only (a failed read made again once), and says so."""
    _set_mode(run, "hierarchical")
    inv = _investigation(ctx, state)
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
    threshold = _playbook(ctx).modes.specialist_failure_threshold
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
                evidence.append(_gather(inv, ctx, run, inv.retry_call(tool)))
        words += "; " + _("degraded to the minimal path")
    else:
        evidence += gathered
    return {
        "evidence": {"calls": evidence},
        "conclusion": inv.conclusion(evidence),
        "_summary": words,
    }


# --- conclusion ------------------------------------------------------------------------------


@recorded("conclude")
def conclude(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The playbook's findings and its conclusion as `finding.recorded` events, each
    citing the evidence calls it rests on."""
    found: dict[str, Any] = state["conclusion"]
    # The past cases are shown beside the conclusion; the playbook does not read them.
    cited = [
        e["id"]
        for e in state["evidence"]["calls"]
        if not e.get("error") and e["tool"] != "similar_cases"
    ]
    for candidate in found["candidates"]:
        append_step_event(
            ctx.session_id,
            "finding.recorded",
            {"kind": "hypothesis", **candidate},
            producer=ctx.producer,
            run=run,
        )
    append_step_event(
        ctx.session_id,
        "finding.recorded",
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
    if found["hypothesis"] == "unknown":
        lang = "zh" if state.get("language") == "zh" else "en"
        text = ASK[lang].format(missing=", ".join(found["missing"]) or "-")
        append_event_once(
            ctx.session_id,
            "agent.question",
            QUESTION_KEY,
            {"field": "description", "label": "", "text": text},
            producer=ctx.producer,
            run=run,
        )
        update["question"] = {"field": "description", "text": text, "key": QUESTION_KEY}
    return update


def route_after_conclusion(state: DiagnosisState) -> Literal["ask_user", "propose_fix", "report"]:
    found: dict[str, Any] = state["conclusion"]
    if found["hypothesis"] == "unknown":
        return "ask_user"
    return "propose_fix" if found.get("action") else "report"


@recorded("read_answer")
def read_answer(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The reporter's answer to the evidence question: kept in the log (it is the
    user.message) and read into the report; it adds no evidence the playbook could use."""
    answers = list(
        Event.objects.filter(
            session_id=ctx.session_id, type="user.message", seq__gt=state.get("consumed_seq", 0)
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
    problems = fix_problems(action["tool"], action["args"], risk_class, found, _system(ctx))
    if problems:
        # The playbook never proposes such a fix; a definition edited into one is refused.
        append_step_event(
            ctx.session_id,
            "agent.note",
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
    propose_action(_tctx(ctx, run), call, fresh=not made)
    ctx.actions = None
    return {"_commit": True, "_summary": f"proposed {action['tool']} ({risk_class})"}


@recorded("execute_fix")
def execute_fix(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """An approved fix goes out through the outbox (its row was written with the
    decision); a message sent while the approval waited is read, not acted on."""
    update: dict[str, Any] = {"_commit": True}
    latest = (
        Event.objects.filter(
            session_id=ctx.session_id, type="user.message", seq__gt=state.get("consumed_seq", 0)
        )
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    if latest is not None:
        update["consumed_seq"] = latest
    tctx = _tctx(ctx, run)
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


def route_after_execution(state: DiagnosisState) -> Literal["await_approval", "report"]:
    waiting = ToolCall.objects.filter(
        session_id=state["session_id"],
        is_action=True,
        status=ToolCallStatus.AWAITING_APPROVAL,
    ).exists()
    return "await_approval" if waiting else "report"


# --- report ----------------------------------------------------------------------------------


@recorded("report", last=True)
def report(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    found: dict[str, Any] = state["conclusion"]
    lang = "zh" if state.get("language") == "zh" else "en"
    playbook = _playbook(ctx)
    incident = state["bundle"]["incident"]
    labels: dict[str, str] = {
        str(k): v for k, v in playbook.problem_types.get(found["problem_type"], {}).items()
    }
    extra = {
        "incident": {**incident, "title": incident.get("title") or incident["description"][:80]},
        "diagnosis": {
            **found,
            "summary": found["summary"].get(lang, ""),
            "problem_type_label": labels.get(lang, found["problem_type"]),
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
