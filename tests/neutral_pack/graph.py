"""The neutral pack's agent: look the host up, note what was found, propose a restart
through the core's approvals, execute it through the outbox once decided, report. Built
only from the core's recorded steps, waits, approvals and outbox, so a whole session of a
pack the core was not written for runs through the real jobs (tests/test_neutral_session).
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypedDict

from langgraph.graph import END, START, StateGraph

from diagnosis.agent.nodes.proposals import propose_action
from diagnosis.agent.nodes.waiting import await_approval
from diagnosis.agent.recording import recorded
from diagnosis.agent.state import AgentContext
from diagnosis.agent.tools import ToolContext, run_action, run_enrichment
from diagnosis.eventlog.names import FINDING_RECORDED, USER_MESSAGE
from diagnosis.events import append_step_event
from diagnosis.models import AgentRun, Event, ToolCall, ToolCallStatus
from diagnosis.reporting import write_report

HOST = re.compile(r"\b[a-z]+-\d+\b")


class NeutralState(TypedDict, total=False):
    session_id: str
    language: str
    consumed_seq: int
    new_input: bool
    host: str
    up: bool
    reported: bool


def _tools(ctx: AgentContext, run: AgentRun) -> ToolContext:
    return ToolContext(ctx.session_id, ctx.graph, run, ctx.producer, definition=ctx.definition)


@recorded("check_host")
def check_host(state: NeutralState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    # The opening message is read here: the approval wait resumes on a later one only.
    seq, payload = Event.objects.filter(session_id=ctx.session_id, type=USER_MESSAGE).order_by(
        "seq"
    ).values_list("seq", "payload").first() or (0, {})
    found = HOST.search(str(payload.get("text", "")))
    host = found.group(0) if found else "h-unknown"
    call = {"call_id": "lookup-1", "tool": "lookup_host", "args": {"host": host}}
    answer = run_enrichment(_tools(ctx, run), [call]).get("host") or {}
    up = bool(answer.get("up"))
    append_step_event(
        ctx.session_id,
        FINDING_RECORDED,
        {"kind": "host_note", "text": f"{host} is {'up' if up else 'down'}"},
        producer=ctx.producer,
        run=run,
    )
    return {"host": host, "up": up, "consumed_seq": seq, "_summary": f"{host} looked up"}


@recorded("propose_restart")
def propose_restart(state: NeutralState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    call = {
        "call_id": "restart-1",
        "tool": "restart_host",
        "args": {"host": state["host"]},
        "risk_class": "R2",
        "is_action": True,
        "position": 1,
    }
    made = ToolCall.objects.filter(session_id=ctx.session_id, call_id="restart-1").exists()
    propose_action(_tools(ctx, run), call, fresh=not made)
    ctx.actions = None
    return {"_commit": True, "_summary": "restart proposed"}


@recorded("execute")
def execute(state: NeutralState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    tctx = _tools(ctx, run)
    for tool_call in ToolCall.objects.filter(
        session_id=ctx.session_id,
        is_action=True,
        status__in=(ToolCallStatus.APPROVED, ToolCallStatus.EXECUTING, ToolCallStatus.RUNNING),
    ):
        run_action(tctx, tool_call.pk)
    ctx.actions = None
    return {"_commit": True, "_summary": "decisions carried out"}


@recorded("report", last=True)
def report(state: NeutralState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    restart = ToolCall.objects.filter(session_id=ctx.session_id, call_id="restart-1").first()
    extra = {"host": state["host"], "up": state["up"], "restart": restart and restart.status}
    write_report(
        ctx.session_id, ctx.definition, dict(state), producer=ctx.producer, run=run, extra=extra
    )
    return {"reported": True, "_summary": "report written"}


def route_after_check(state: NeutralState) -> Literal["propose_restart", "report"]:
    return "report" if state.get("up") else "propose_restart"


def build_graph() -> StateGraph[NeutralState, AgentContext, NeutralState, NeutralState]:
    builder = StateGraph(NeutralState, context_schema=AgentContext)
    nodes: list[tuple[str, Any]] = [
        ("check_host", check_host),
        ("propose_restart", propose_restart),
        ("await_approval", await_approval),
        ("execute", execute),
        ("report", report),
    ]
    for name, node in nodes:
        builder.add_node(name, node, input_schema=NeutralState)
    builder.add_edge(START, "check_host")
    builder.add_conditional_edges("check_host", route_after_check)
    builder.add_edge("propose_restart", "await_approval")
    builder.add_edge("await_approval", "execute")
    builder.add_edge("execute", "report")
    builder.add_edge("report", END)
    return builder


def initial_state(session: Any, definition: dict[str, Any]) -> dict[str, Any]:
    return {"session_id": str(session.pk), "language": session.language, "consumed_seq": 0}


DEFINITION: dict[str, Any] = {
    "kind": "neutral",
    "slug": "host_check",
    "name": {"zh": "主机检查", "en": "Host check"},
    # The envelope every kind shares: this pack asks for no fields.
    "field_order": [],
    "fields": {},
    "report_template": {
        "en": "# Host check\n\n{{ host }} was {% if up %}up{% else %}down{% endif %}; "
        "restart: {{ restart }}.\n",
        "zh": "# 主机检查\n\n{{ host }}：{% if up %}在线{% else %}离线{% endif %}；"
        "重启：{{ restart }}。\n",
    },
}
