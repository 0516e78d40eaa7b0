"""The human waits: a question for the operator and the approvals, as interrupts."""

from __future__ import annotations

from typing import Any, Literal

from django.db.models import Q
from langgraph.errors import GraphInterrupt
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from aero.compiled import Arg, Compiled
from diagnosis.agent.recording import commit_steps
from diagnosis.agent.state import AgentContext, AgentState
from diagnosis.eventlog.names import USER_MESSAGE
from diagnosis.models import Event, SessionStatus, ToolCall, ToolCallStatus
from scenarios_admin.definition import BUDGET_TOOL

# The actions awaiting a decision, and a request to continue past the model budget,
# which waits like one: read by every job that stops at its approvals, compiled once per
# connection.
_awaiting = Compiled(
    ToolCall,
    lambda: (
        ToolCall.objects.filter(
            Q(is_action=True) | Q(tool_name=BUDGET_TOOL),
            session_id=Arg(0, ToolCall._meta.get_field("session")),
            status=ToolCallStatus.AWAITING_APPROVAL,
        )
        .order_by("position", "id")
        .values_list("pk", flat=True)
    ),
)


def wait_for_user(ctx: AgentContext, value: dict[str, Any]) -> None:
    """Interrupt for a human (a question, approvals). When the graph really stops here
    (no resume value), the steps so far commit before the interrupt's checkpoint, with
    the session's move to waiting_user as their group's last event: the job
    then needs no transaction of its own for it, nor a read of the state it stopped in.
    Resumed, the steps go on in their group."""
    try:
        interrupt(value)
    except GraphInterrupt:
        group = ctx.group
        if group is not None and group.end_with_status(
            SessionStatus.RUNNING, SessionStatus.WAITING_USER, ctx.producer
        ):
            ctx.waiting_written = True
        commit_steps(ctx)
        raise
    commit_steps(ctx)


def ask_user(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    question = state.get("question") or {}
    wait_for_user(
        runtime.context,
        {"kind": "question", "field": question.get("field"), "key": question.get("key")},
    )
    return {}


def await_approval(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    # What waits for a decision: one query (in the steps' transaction, if open: it
    # sees their proposals).
    waiting = list(_awaiting.rows(runtime.context.session_id))
    if waiting:
        wait_for_user(runtime.context, {"kind": "approval", "tool_calls": waiting})
    else:
        commit_steps(runtime.context)
    # A correction sent while waiting goes through the input parser first.
    unread = Event.objects.filter(
        session_id=runtime.context.session_id,
        type=USER_MESSAGE,
        seq__gt=state.get("consumed_seq", 0),
    ).exists()
    return {"new_input": unread}


def route_after_wait(state: AgentState) -> Literal["input_parser", "reasoning"]:
    return "input_parser" if state.get("new_input") else "reasoning"
