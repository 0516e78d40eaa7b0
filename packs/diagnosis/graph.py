"""A diagnosis session's graph: intake (and the run mode) -> evidence, gathered the way
the session's mode gathers it -> conclusion -> fix proposed -> approval -> fix executed
-> report, with an ask-the-reporter wait when the evidence names no root cause, and
after the conclusion the approval of any skill whose manifest raised its risk class
(packs.diagnosis.skill_gate) before it runs.

The run modes (DIAGNOSIS.md §4, docs/diagnosis-pack.md): ReAct, one evidence call a
step chosen from what is known, moving to plan-execute after the pack's number of steps
in a row that added nothing; plan-execute, a plan of calls shown before it runs; and
hierarchical, an orchestrator whose four specialists run as child agents (jobs of
their own, in parallel), degrading to the minimal path when too many fail. Every mode
makes the same calls (packs.diagnosis.investigation) and concludes with the playbook's
reading of what they read, so all three conclude alike from the same bundle.

Every step is recorded by the core (diagnosis.agent.recording): each evidence tool is an
R0 ToolCall with its start and result events, the conclusion is `finding.recorded`
events, the fix goes through the core's approval queue and outbox. The conclusion is
the offline playbook's (packs.diagnosis.playbook), pinned in the session's scenario
version; with a model configured, the model chooses the calls and words the conclusion
(packs.diagnosis.model_choice), and the playbook's findings bound what it may conclude.

The steps live by concern: packs.diagnosis.steps (the state and the evidence call site,
`gather`), intake, react_plan (ReAct and plan-execute), specialists (hierarchical) and
closing (conclusion, fix, report).
"""

from __future__ import annotations

from typing import Any, Literal

from langgraph.graph import END, START, StateGraph

from diagnosis.agent.nodes.waiting import ask_user, await_approval
from diagnosis.agent.state import AgentContext
from diagnosis.models import ToolCall, ToolCallStatus
from packs.diagnosis.budget_pause import await_budget, route_after_budget
from packs.diagnosis.closing import (
    conclude,
    execute_fix,
    propose_fix,
    read_answer,
    report,
)
from packs.diagnosis.intake import intake
from packs.diagnosis.react_plan import execute, plan, react_step
from packs.diagnosis.skill_gate import await_skills, has_gated_skills, propose_skills, run_skills
from packs.diagnosis.specialists import aggregate, await_specialists, orchestrate
from packs.diagnosis.steps import DiagnosisState


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
        ("specialists", await_specialists),
        ("aggregate", aggregate),
        ("conclude", conclude),
        ("await_budget", await_budget),
        ("propose_skills", propose_skills),
        ("await_skills", await_skills),
        ("run_skills", run_skills),
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
    builder.add_conditional_edges("plan", _unless_budget("execute"), ["execute", "await_budget"])
    builder.add_edge("execute", "conclude")
    builder.add_conditional_edges(
        "orchestrate", _unless_budget("specialists"), ["specialists", "await_budget"]
    )
    builder.add_conditional_edges(
        "await_budget", route_after_budget, ["react_step", "plan", "orchestrate", "conclude"]
    )
    builder.add_edge("specialists", "aggregate")
    builder.add_edge("aggregate", "conclude")
    builder.add_conditional_edges("conclude", route_after_conclude)
    builder.add_edge("propose_skills", "await_skills")
    builder.add_edge("await_skills", "run_skills")
    builder.add_conditional_edges("run_skills", route_after_conclusion)
    builder.add_edge("ask_user", "read_answer")
    builder.add_edge("read_answer", "report")
    builder.add_edge("propose_fix", "await_approval")
    builder.add_edge("await_approval", "execute_fix")
    builder.add_conditional_edges("execute_fix", route_after_execution)
    builder.add_edge("report", END)
    return builder


def route_by_mode(state: DiagnosisState) -> Literal["react_step", "plan", "orchestrate"]:
    mode = state.get("mode") or "react"
    return (
        "plan"
        if mode == "plan_execute"
        else "orchestrate"
        if mode == "hierarchical"
        else ("react_step")
    )


def _unless_budget(then: str) -> Any:
    """The edge after a step that may wait for the model budget (budget_pause)."""

    def route(state: DiagnosisState) -> str:
        return "await_budget" if state.get("budget_wait") else then

    return route


def route_after_react(
    state: DiagnosisState,
) -> Literal["react_step", "plan", "conclude", "await_budget"]:
    if state.get("budget_wait"):
        return "await_budget"
    if state.get("conclusion"):
        return "conclude"
    return "plan" if state.get("mode") == "plan_execute" else "react_step"


def route_after_conclude(
    state: DiagnosisState,
) -> Literal["propose_skills", "ask_user", "propose_fix", "report", "await_budget"]:
    if state.get("budget_wait"):
        return "await_budget"
    # Skills of risk R1+ applying to the problem type wait for approval first.
    return "propose_skills" if has_gated_skills(state) else route_after_conclusion(state)


def route_after_conclusion(state: DiagnosisState) -> Literal["ask_user", "propose_fix", "report"]:
    found: dict[str, Any] = state["conclusion"]
    if found["hypothesis"] == "unknown":
        return "ask_user"
    return "propose_fix" if found.get("action") else "report"


def route_after_execution(state: DiagnosisState) -> Literal["await_approval", "report"]:
    waiting = ToolCall.objects.filter(
        session_id=state["session_id"],
        is_action=True,
        status=ToolCallStatus.AWAITING_APPROVAL,
    ).exists()
    return "await_approval" if waiting else "report"
