"""The incident agent: input parser -> reasoning -> tool executor (with the compliance
check) -> output generator, with the ask-the-user and approval waits as interrupts. The
compliance validator runs as a step of its own after the reasoning step's finish, after
a tool step that handed actions to the outbox, and where a checkpoint saved by an older
graph (one whose tool step always went on to it) says it is next.

Nodes return partial state updates. A node that interrupts re-runs from its first line
on resume, so the waiting nodes do nothing but interrupt; everything with an effect is
keyed (events by key, tool calls by idempotency key) and is safe to repeat.
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from diagnosis.agent.nodes.waiting import ask_user, await_approval, route_after_wait
from diagnosis.agent.state import AgentContext
from packs.airport.agent.nodes.execution import tool_executor
from packs.airport.agent.nodes.input import input_parser
from packs.airport.agent.nodes.output import output_generator
from packs.airport.agent.nodes.reasoning import reasoning, route_after_reasoning
from packs.airport.agent.nodes.validation import (
    compliance_validator,
    route_after_tools,
    route_after_validation,
)
from packs.airport.agent.state import ApronState


def build_graph() -> StateGraph[ApronState, AgentContext, ApronState, ApronState]:
    builder = StateGraph(ApronState, context_schema=AgentContext)
    builder.add_node("input_parser", input_parser)
    builder.add_node("reasoning", reasoning)
    builder.add_node("ask_user", ask_user)
    builder.add_node("tool_executor", tool_executor)
    builder.add_node("await_approval", await_approval)
    builder.add_node("compliance_validator", compliance_validator)
    builder.add_node("output_generator", output_generator)
    builder.add_edge(START, "input_parser")
    builder.add_edge("input_parser", "reasoning")
    builder.add_conditional_edges("reasoning", route_after_reasoning)
    builder.add_edge("ask_user", "input_parser")
    builder.add_conditional_edges("tool_executor", route_after_tools)
    builder.add_conditional_edges("await_approval", route_after_wait)
    builder.add_conditional_edges("compliance_validator", route_after_validation)
    builder.add_edge("output_generator", END)
    return builder
