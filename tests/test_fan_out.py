"""Parallel branches record like a chain's steps (tests/fan_out_graph.py): LangGraph runs
the tasks of a step with several on threads of their own, and each records with its own
identity (its task's path), in its own transaction on its own connection. Both branches
are recorded gap-free, once each; running the graph again (resumed after an interrupt,
from the start after a crash between steps, or after a kill -9 mid-branch) writes
nothing twice. A branch may be a specialist: a child run, recorded like the root."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from diagnosis.agent.state import AgentContext
from diagnosis.chain import verify_chain
from diagnosis.models import AgentRun, Event, LLMCall, Session, ToolCall
from scenarios_admin.models import Scenario
from tests import fan_out_graph as fan
from tests.servers import PYTHON, ROOT, service_env

pytestmark = pytest.mark.services

STEPS = ["fan_out", "branch_a", "look", "conclude", "join", "finish"]


@pytest.fixture
def session(builtin: None, make_user: Callable[..., User]) -> Iterator[Session]:
    scenario = Scenario.objects.get(slug="oil_spill")
    version = scenario.latest_version()
    assert version is not None
    fan.THREADS.clear()
    fan.CRASH_AT.clear()
    yield Session.objects.create(
        scenario=scenario,
        scenario_version=version,
        title="fan-out test",
        created_by=make_user("olga", "operator"),
    )
    fan.CRASH_AT.clear()


def notes(session: Session) -> list[str]:
    rows = Event.objects.filter(session=session, type="agent.note").order_by("seq")
    return [e.payload["text"] for e in rows]


def assert_recorded_once(session: Session, steps: list[str]) -> None:
    events = list(Event.objects.filter(session=session).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # gap-free
    keys = [e.key for e in events if e.key]
    assert len(keys) == len(set(keys))
    started = [e.payload["node"] for e in events if e.type == "agent.node_started"]
    assert sorted(started) == sorted(steps)  # every step once
    completed = [e.payload["node"] for e in events if e.type == "agent.node_completed"]
    assert sorted(completed) == sorted(steps)
    assert not [e for e in events if e.type == "agent.node_failed"]
    calls = ToolCall.objects.filter(session=session)
    assert sorted(calls.values_list("call_id", flat=True)) == ["a-look", "b-look"]
    assert LLMCall.objects.filter(session=session).count() == 2
    assert len(Event.objects.filter(session=session, type="llm.call")) == 2
    assert AgentRun.objects.filter(session=session, agent_name="specialist_b").count() == 1
    assert verify_chain(session.pk).ok


def test_parallel_branches_record_each_once_on_threads_of_their_own(session: Session) -> None:
    graph = fan.fan_graph(InMemorySaver())
    assert "__interrupt__" in fan.run(graph, session, {"seen": []})
    job = threading.get_ident()
    assert fan.THREADS["fan_out"] == fan.THREADS["join"] == job
    assert job != fan.THREADS["branch_a"] != fan.THREADS["branch_b"] != job
    assert fan.THREADS["look"] == fan.THREADS["branch_b"]  # the specialist's steps: its own
    said = notes(session)
    assert said[0] == "fan out" and sorted(said[1:3]) == ["a", "b concludes"]
    assert said[3:] == ["joined"]
    assert_recorded_once(session, STEPS[:-1])

    fan.resume(graph, session, "yes")
    assert notes(session)[-1] == "finish"
    assert_recorded_once(session, STEPS)  # the branches did not run again


def test_the_specialist_is_a_child_run_with_its_status_times_and_tokens(
    session: Session,
) -> None:
    fan.run(fan.fan_graph(InMemorySaver()), session, {"seen": []})
    root = AgentRun.objects.get(session=session, agent_name="root")
    specialist = AgentRun.objects.get(session=session, agent_name="specialist_b")
    assert specialist.parent_id == root.pk
    assert specialist.status == "completed"
    assert specialist.ended_at is not None and specialist.started_at <= specialist.ended_at
    used = specialist.output_summary
    assert (used["tokens_in"], used["tokens_out"], Decimal(used["cost"])) == (7, 1, Decimal("0.01"))
    steps = AgentRun.objects.filter(parent=specialist).order_by("started_at", "id")
    assert [r.agent_name for r in steps] == ["look", "conclude"]
    assert {r.status for r in steps} == {"completed"}
    direct = AgentRun.objects.filter(parent=root).values_list("agent_name", flat=True)
    assert sorted(direct) == ["branch_a", "fan_out", "join", "specialist_b"]
    look = steps[0]
    assert LLMCall.objects.get(session=session, tokens_in=7).agent_run_id == look.pk


@pytest.mark.parametrize("crash_at", ["join", "conclude"])
def test_a_run_again_after_a_crash_between_steps_writes_nothing_twice(
    session: Session, crash_at: str
) -> None:
    """Killed before `crash_at` ran (after the join's branches, or inside the specialist
    while the other branch went on): no checkpoint was saved (they are saved when the
    graph exits), so the next run starts from the beginning again, under the same task
    keys, and finds what the first one committed."""
    fan.CRASH_AT.add(crash_at)
    with pytest.raises(fan.Crash):
        fan.run(fan.fan_graph(InMemorySaver()), session, {"seen": []})
    assert "fan out" in notes(session)  # the steps before the crash committed
    fan.CRASH_AT.clear()
    graph = fan.fan_graph(InMemorySaver())  # the crashed process's checkpoints died with it
    fan.run(graph, session, {"seen": []})
    fan.resume(graph, session, "yes")
    assert notes(session)[0] == "fan out" and notes(session)[-1] == "finish"
    assert_recorded_once(session, STEPS)
    assert AgentRun.objects.get(session=session, agent_name="specialist_b").status == "completed"


def test_a_kill_9_mid_branch_loses_that_branch_step_and_doubles_nothing(
    session: Session, db_url: str, redis_url: str, tmp_path: Path
) -> None:
    """A process running the graph is killed (SIGKILL) while branch_a's step has written
    its rows and queued its events, its transaction open, and the specialist's branch
    goes on beside it. What committed stays, once; what was open is gone entirely; the
    next run completes both branches and writes nothing twice."""
    held = tmp_path / "held"
    code = (
        "import django; django.setup(); import sys; "
        "from tests.fan_out_graph import main; main(sys.argv[1])"
    )
    env = service_env(db_url, redis_url, FAN_OUT_HOLD="branch_a", FAN_OUT_HELD=str(held))
    process = subprocess.Popen(
        [PYTHON, "-c", code, str(session.pk)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (held.exists() and "b concludes" in notes(session)):
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "the branches never got there"
            time.sleep(0.1)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    # The specialist's steps committed; branch_a's step (rows and events) did not.
    assert "b concludes" in notes(session) and "a" not in notes(session)
    assert not ToolCall.objects.filter(session=session, call_id="a-look").exists()

    graph = fan.fan_graph(InMemorySaver())
    fan.run(graph, session, {"seen": []})
    fan.resume(graph, session, "yes")
    assert_recorded_once(session, STEPS)


def test_a_branch_may_not_start_while_the_steps_before_it_are_uncommitted(
    session: Session,
) -> None:
    """The node the branches follow commits its group (fans_out): without it the
    branches' commits would land before the steps that led to them."""
    builder = StateGraph(fan.FanState, context_schema=AgentContext)
    builder.add_node("first", fan.step("first", lambda c, r: fan.note(c, r, "first")))
    builder.add_node("left", fan.step("left", lambda c, r: fan.note(c, r, "left")))
    builder.add_node("right", fan.step("right", lambda c, r: fan.note(c, r, "right")))
    builder.add_edge(START, "first")
    builder.add_edge("first", "left")
    builder.add_edge("first", "right")
    with pytest.raises(RuntimeError, match="fans_out=True"):
        fan.run(builder.compile(checkpointer=InMemorySaver()), session, {"seen": []})
    assert notes(session) == ["first"]  # committed after the refusal, as a job's end does


def test_each_task_is_keyed_by_its_path(session: Session) -> None:
    fan.run(fan.fan_graph(InMemorySaver()), session, {"seen": []})
    started = {
        e.payload["node"]: e.key
        for e in Event.objects.filter(session=session, type="agent.node_started")
    }
    assert started["fan_out"] == "task:start:1:fan_out/agent.node_started/0"
    # The two branches of step 2, each by its node; the specialist's steps under the key
    # of the task that runs it.
    assert started["branch_a"] == "task:start:2:branch_a/agent.node_started/0"
    assert started["look"] == "task:task:start:2:branch_b:1:look/agent.node_started/0"
    assert started["conclude"] == "task:task:start:2:branch_b:2:conclude/agent.node_started/0"
    assert started["join"] == "task:start:3:join/agent.node_started/0"
