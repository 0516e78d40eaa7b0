"""The apron agent's graph changed shape: its tool step runs the compliance check itself
when it handed nothing to the outbox, where the compliance validator used to be the next
graph step after every tool step. Sessions saved under the older shape must carry on
after the upgrade: a checkpoint that names the validator as the next step (a worker
stopped between the two, a failed session retried) resumes through it, and a step group
an older worker committed is re-run by a newer one under the same event keys."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any, Literal

import pytest
from django.contrib.auth.models import User
from langgraph.graph import END, START, StateGraph

import diagnosis.jobs.job as job_module
from diagnosis import shutdown
from diagnosis.agent.nodes.waiting import ask_user, await_approval, route_after_wait
from diagnosis.agent.recording import recorded
from diagnosis.agent.state import AgentContext
from diagnosis.jobs.checkpoints import agent_graph
from diagnosis.jobs.job import advance_session
from diagnosis.models import Event, Session, ToolCall, ToolCallStatus
from packs.airport.agent.nodes.execution import execute_calls
from packs.airport.agent.nodes.input import input_parser
from packs.airport.agent.nodes.output import output_generator
from packs.airport.agent.nodes.reasoning import reasoning
from packs.airport.agent.nodes.validation import compliance_validator, route_after_validation
from packs.airport.agent.state import ApronState
from tests.log_helpers import assert_projections_match
from tests.web_helpers import make_session

pytestmark = pytest.mark.services

# The tool step as it was: the calls only, the check left to the next step.
old_tool_executor = recorded("tool_executor")(execute_calls)


def old_route_after_reasoning(
    state: ApronState,
) -> Literal["ask_user", "tool_executor", "await_approval", "compliance_validator"]:
    step = state["plan"]["step"]
    if step == "ask":
        return "ask_user"
    if step == "call":
        return "tool_executor"
    if step == "await":
        return "await_approval"
    return "compliance_validator"


def old_graph() -> StateGraph[ApronState, AgentContext, ApronState, ApronState]:
    """packs/airport/agent/graph.py before the tool step ran the compliance check."""
    builder = StateGraph(ApronState, context_schema=AgentContext)
    builder.add_node("input_parser", input_parser)
    builder.add_node("reasoning", reasoning)
    builder.add_node("ask_user", ask_user)
    builder.add_node("tool_executor", old_tool_executor)
    builder.add_node("await_approval", await_approval)
    builder.add_node("compliance_validator", compliance_validator)
    builder.add_node("output_generator", output_generator)
    builder.add_edge(START, "input_parser")
    builder.add_edge("input_parser", "reasoning")
    builder.add_conditional_edges("reasoning", old_route_after_reasoning)
    builder.add_edge("ask_user", "input_parser")
    builder.add_edge("tool_executor", "compliance_validator")
    builder.add_conditional_edges("await_approval", route_after_wait)
    builder.add_conditional_edges("compliance_validator", route_after_validation)
    builder.add_edge("output_generator", END)
    return builder


def run_old_graph(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The jobs run the older graph, on the same checkpointer, until undone."""
    compiled = old_graph().compile(checkpointer=agent_graph().checkpointer)
    monkeypatch.setattr(job_module, "agent_graph", lambda kind=None: compiled)
    return compiled


def keyed(session: Session) -> dict[str, tuple[str, Any]]:
    """The session's step-keyed events: key -> (type, payload without run ids)."""
    return {
        e.key: (e.type, {k: v for k, v in e.payload.items() if k != "run"})
        for e in Event.objects.filter(session=session, key__startswith="task:")
    }


def awaiting(session: Session) -> list[str]:
    return sorted(
        ToolCall.objects.filter(
            session=session, is_action=True, status=ToolCallStatus.AWAITING_APPROVAL
        ).values_list("tool_name", flat=True)
    )


def test_a_session_stopped_before_the_old_validator_step_resumes_through_it(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    user = make_user("olga", "operator")
    reference = make_session(user)  # the new graph, start to the approvals wait
    assert reference.status == "waiting_user"

    # An older worker is asked to stop (a deploy's SIGTERM) just as its next step is the
    # validator's: it commits the tool step and saves the checkpoint that names it.
    old = run_old_graph(monkeypatch)

    def stop_before_the_validator() -> bool:
        return sys._getframe(1).f_locals.get("name") == "compliance_validator"

    monkeypatch.setattr(shutdown, "stopping", stop_before_the_validator)
    session = make_session(user)
    config = {"configurable": {"thread_id": str(session.pk)}}
    assert old.get_state(config).next == ("compliance_validator",)
    assert session.status == "running"
    assert not Event.objects.filter(session=session, payload__node="compliance_validator")

    # The upgrade: a newer worker's job resumes the session.
    monkeypatch.undo()
    shutdown.reset()
    assert agent_graph().get_state(config).next == ("compliance_validator",)
    advance_session(str(session.pk))

    session.refresh_from_db()
    assert session.status == "waiting_user", session.status
    assert awaiting(session) == awaiting(reference)
    types = list(Event.objects.filter(session=session).values_list("type", flat=True))
    assert "agent.node_failed" not in types
    # The check ran once where it was next, and as the new graph runs it after that.
    validated = Event.objects.filter(
        session=session, type="agent.node_started", payload__node="compliance_validator"
    )
    assert validated.exists()
    transitions = [
        (e.payload["from"], e.payload["to"])
        for e in Event.objects.filter(session=session, type="fsm.transition").order_by("seq")
    ]
    expected = [
        (e.payload["from"], e.payload["to"])
        for e in Event.objects.filter(session=reference, type="fsm.transition").order_by("seq")
    ]
    assert transitions == expected
    assert_projections_match(session)


def test_the_new_graph_keys_its_steps_as_the_old_one_did(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step group an older worker committed, killed before its checkpoint, is re-run
    by a newer one from the checkpoint before it: each event it writes again must have
    the key the older worker's has, or it would be written twice. Both sessions run in
    one job from the start (no checkpoint yet: every key's origin is "start"), so their
    keys compare as they are."""
    user = make_user("olga", "operator")
    run_old_graph(monkeypatch)
    before = make_session(user)
    monkeypatch.undo()
    after = make_session(user)
    assert before.status == after.status == "waiting_user"

    old_keys, new_keys = keyed(before), keyed(after)
    assert new_keys and all(re.match(r"task:start:\d+:", key) for key in new_keys)
    # Every keyed event the new graph wrote, the old one wrote under the same key; what
    # it did not write again is the validator's own start and end inside the tool step.
    assert {k: old_keys.get(k, ("missing", None))[0] for k in new_keys} == {
        k: t for k, (t, _) in new_keys.items()
    }
    left = {k: t for k, (t, _) in old_keys.items() if k not in new_keys}
    assert left and all(
        t in ("agent.node_started", "agent.node_completed") and ":compliance_validator/" in k
        for k, t in left.items()
    ), left
    assert any(":compliance_validator/fsm." in k for k in new_keys)  # merged, keyed as before
