from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, TypedDict

from diagnosis.agent.providers import Provider
from diagnosis.events import StepGroup
from diagnosis.models import AgentRun, ToolCall


class AgentState(TypedDict, total=False):
    session_id: str
    language: str
    consumed_seq: int  # last user.message seq the input parser has read
    fields: dict[str, Any]
    evidence: dict[str, str]
    unconfirmed: dict[str, dict[str, Any]]  # field -> {value, evidence} awaiting confirmation
    # field -> values put to the operator and not confirmed: not put again on no new words.
    declined: dict[str, list[Any]]
    asked: list[str]  # fields asked about, in order (a field may repeat)
    question: dict[str, Any] | None
    # The last messages only corrected facts: the next question is no "not recognised".
    only_corrections: bool
    # The last answer said the operator does not know (extraction.UNSURE): the question
    # comes again with why it matters, not as an answer not understood.
    unsure: bool
    # Required fields the operator was told why they are needed (after "I don't know"):
    # told once; asked again, the question is short and points at the correction form.
    explained: list[str]
    enrichment: dict[str, Any] | None
    risk: dict[str, Any] | None
    impact: dict[str, Any] | None
    actions_planned: bool
    plan: dict[str, Any]
    refusals: list[dict[str, Any]]
    corrections: list[str]
    fsm: str
    reported: bool
    # Operator input arrived while the agent waited for approvals (a correction).
    new_input: bool
    # Corrections after the risk was assessed: the rules re-run and the proposals are
    # made again as revision n; `replanning` holds what it was before.
    revision: int
    replanning: dict[str, Any] | None


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
