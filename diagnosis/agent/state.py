from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, TypedDict

from diagnosis.agent.providers import Provider
from diagnosis.events import StepGroup
from diagnosis.models import AgentRun, ToolCall


class AgentState(TypedDict, total=False):
    """What the core's nodes and recording read of a session's graph state. A pack's
    graph declares its own keys beside these (a TypedDict extending this one), so a
    session carries only its own pack's."""

    session_id: str
    language: str
    consumed_seq: int  # last user.message seq the input parser has read
    fields: dict[str, Any]  # the facts read from the reporter's words (DomainPack.reading)
    question: dict[str, Any] | None  # what the agent asks the operator, waiting
    reported: bool
    # Operator input arrived while the agent waited for approvals (a correction).
    new_input: bool
    # Steps an older graph ran on their own that this one runs inside the step before
    # (recording.merged_step): added to LangGraph's step number in the steps' keys, so
    # a step keeps its key across the upgrade.
    steps_merged: int


@dataclass
class AgentContext:
    session_id: Any
    definition: dict[str, Any]
    graph: Any  # the world the pack's agent acts on (DomainPack.world)
    providers: list[Provider]
    root_run: AgentRun
    producer: str
    scenario_name: dict[str, str] = field(default_factory=dict)
    # The checkpoint this invocation of the graph resumed from ("" for the first): with
    # checkpoints written only when the graph exits, a re-run after a crash
    # starts from it again, so it and the step number name a step across runs.
    origin: str = ""
    # The steps between two waits write as one transaction: opened by the
    # first step, committed before the run can exit.
    group: StepGroup | None = None
    # The session's action calls as this group's steps see them (read once per group,
    # again after a step changed them; see planning.action_calls_of).
    actions: list[ToolCall] | None = None
    # A human wait's group wrote the move to waiting_user: the job does not.
    waiting_written: bool = False
    # The run the steps record under: a child run's (recording.child_run), else the root.
    parent_run: AgentRun | None = None
    # The job's thread: a step on another one is a parallel branch (recording).
    thread: int = field(default_factory=threading.get_ident)
    # A child agent's own job (diagnosis.jobs.child_jobs): its graph has no checkpoint
    # and runs again from its start after a wait, so a wait ends the job (no interrupt)
    # and its model calls are keyed by the step's task key.
    child_job: bool = False
