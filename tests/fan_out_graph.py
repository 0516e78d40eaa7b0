"""A small graph with parallel branches, for tests/test_fan_out.py (and its kill -9
test, which runs `main` in a process of its own and kills it mid-branch).

A step that fans out; two parallel branches: `branch_a` records its tool call, a model
call and an event directly, `branch_b` is a specialist (a child run whose own graph's
two steps record under it); a join; a wait for a person; the last step."""

from __future__ import annotations

import operator
import os
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from diagnosis.agent.providers import Attempt
from diagnosis.agent.recording import call_recorder, child_run, recorded, task_key
from diagnosis.agent.state import AgentContext
from diagnosis.agent.tools import ToolContext, run_deterministic
from diagnosis.agent.usage import Usage
from diagnosis.events import append_step_event
from diagnosis.models import AgentRun, Session


class FanState(TypedDict, total=False):
    seen: Annotated[list[str], operator.add]
    answer: str


class Crash(BaseException):
    """A kill between two steps, as the process sees it: nothing after it runs."""


# The thread each step ran on: the branches must run on threads of their own.
THREADS: dict[str, int] = {}
# The steps that crash before they run.
CRASH_AT: set[str] = set()
# A step that stops mid-way (its transaction open) until the process is killed, and the
# file it touches then (the kill -9 test).
HOLD_AT = os.environ.get("FAN_OUT_HOLD", "")
HELD = Path(os.environ.get("FAN_OUT_HELD", "/nonexistent/held"))


def note(ctx: AgentContext, run: AgentRun, text: str) -> None:
    append_step_event(ctx.session_id, "agent.note", {"text": text}, producer=ctx.producer, run=run)


def tool(ctx: AgentContext, run: AgentRun, call_id: str) -> None:
    tctx = ToolContext(ctx.session_id, ctx.graph, run, ctx.producer, definition=ctx.definition)
    call = {"call_id": call_id, "tool": "assess_risk", "args": {}}
    run_deterministic(tctx, call, lambda: {"by": call_id})


def model_call(ctx: AgentContext, run: AgentRun, tokens: int) -> None:
    usage = Usage(tokens_in=tokens, tokens_out=1, cost=Decimal("0.01"))
    call_recorder(ctx, run)(Attempt("fake", "m", "reason", "ok", 5, usage=usage))


def step(name: str, work: Callable[[AgentContext, AgentRun], None], **flags: bool) -> Any:
    def fn(state: FanState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
        if name in CRASH_AT:
            raise Crash(name)
        THREADS[name] = threading.get_ident()
        work(ctx, run)
        return {"seen": [name], "_summary": name}

    fn.__name__ = name
    return recorded(name, **flags)(fn)


def looked(ctx: AgentContext, run: AgentRun) -> None:
    tool(ctx, run, "b-look")
    model_call(ctx, run, 7)


def specialist_graph() -> Any:
    builder = StateGraph(FanState, context_schema=AgentContext)
    builder.add_node("look", step("look", looked))
    builder.add_node("conclude", step("conclude", lambda c, r: note(c, r, "b concludes")))
    builder.add_edge(START, "look")
    builder.add_edge("look", "conclude")
    builder.add_edge("conclude", END)
    return builder.compile()


SPECIALIST = specialist_graph()


def branch_b(state: FanState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """A specialist: a child run whose own steps (a graph of their own) record under it."""
    ctx = runtime.context
    THREADS["branch_b"] = threading.get_ident()
    with child_run(ctx, "specialist_b", task_key(ctx, "branch_b")) as child:
        result = SPECIALIST.invoke({"seen": []}, context=child)
    return {"seen": ["branch_b", *result["seen"]]}


def branch_a(ctx: AgentContext, run: AgentRun) -> None:
    tool(ctx, run, "a-look")
    note(ctx, run, "a")
    if HOLD_AT == "branch_a":
        HELD.touch()
        time.sleep(600)  # killed here, its rows written and its events queued
    # Last: the usage it counts locks the session row until the step commits.
    model_call(ctx, run, 3)


def wait(state: FanState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    return {"answer": interrupt({"kind": "question"})}


def fan_graph(saver: InMemorySaver) -> Any:
    builder = StateGraph(FanState, context_schema=AgentContext)
    builder.add_node("fan_out", step("fan_out", lambda c, r: note(c, r, "fan out"), fans_out=True))
    builder.add_node("branch_a", step("branch_a", branch_a))
    builder.add_node("branch_b", branch_b)
    builder.add_node("join", step("join", lambda c, r: note(c, r, "joined")))
    builder.add_node("wait", wait)
    builder.add_node("finish", step("finish", lambda c, r: note(c, r, "finish"), last=True))
    builder.add_edge(START, "fan_out")
    builder.add_edge("fan_out", "branch_a")
    builder.add_edge("fan_out", "branch_b")
    builder.add_edge(["branch_a", "branch_b"], "join")
    builder.add_edge("join", "wait")
    builder.add_edge("wait", "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=saver)


def context(session: Session) -> AgentContext:
    """A job's context: its root run, on this thread."""
    root = AgentRun.objects.create(session=session, agent_name="root")
    definition = session.scenario_version.definition
    return AgentContext(session.pk, definition, None, [], root, "test")


def run(graph: Any, session: Session, value: Any, ctx: AgentContext | None = None) -> Any:
    """Until the graph ends or waits, as a job runs it (checkpointed when it exits)."""
    config = {"configurable": {"thread_id": str(session.pk)}}
    ctx = ctx or context(session)
    try:
        return graph.invoke(value, config, context=ctx, durability="exit")
    finally:
        if ctx.group is not None:
            ctx.group.commit()  # as the job does: nothing is left open


def resume(graph: Any, session: Session, answer: str) -> Any:
    """As a job resumes: from the checkpoint saved at the interrupt, its id the origin."""
    config = {"configurable": {"thread_id": str(session.pk)}}
    ctx = context(session)
    ctx.origin = str(graph.get_state(config).config["configurable"]["checkpoint_id"])
    return run(graph, session, Command(resume=answer), ctx)


def main(session_id: str) -> None:
    """A process that runs the graph from the start to its wait (the kill -9 test's)."""
    run(fan_graph(InMemorySaver()), Session.objects.get(pk=session_id), {"seen": []})
    print("waiting", flush=True)
