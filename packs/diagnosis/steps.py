"""What a diagnosis session's steps share: the graph's state (its checkpoint), the bundle
stored with the session, the step's world, playbook and investigation, and the evidence
call site (`gather`): every mode's evidence tools are called through it."""

from __future__ import annotations

import operator
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypedDict

from diagnosis.agent.state import AgentContext
from diagnosis.agent.tools import ToolContext
from diagnosis.events import append_step_event
from diagnosis.models import AgentRun
from packs.diagnosis.bundle import Bundle, open_bundle
from packs.diagnosis.investigation import Investigation
from packs.diagnosis.names import SIMILAR
from packs.diagnosis.playbook_data import Playbook
from packs.diagnosis.storage import bundle_dir
from packs.diagnosis.system import System, demo_shop


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
    budget_wait: str  # the step that waits for the model budget to be raised
    budget_resume: str  # the step to run again after that wait
    reported: bool


@contextmanager
def session_bundle(session_id: Any) -> Iterator[Bundle]:
    """The bundle stored with the session (checked again: it is read from disk)."""
    bundle = open_bundle(bundle_dir(session_id))
    try:
        yield bundle
    finally:
        bundle.close()


def tool_context(ctx: AgentContext, run: AgentRun) -> ToolContext:
    return ToolContext(ctx.session_id, ctx.graph, run, ctx.producer, definition=ctx.definition)


def system_of(ctx: AgentContext) -> System:
    return ctx.graph if isinstance(ctx.graph, System) else demo_shop()


def playbook_of(ctx: AgentContext) -> Playbook:
    return Playbook.model_validate(ctx.definition["playbook"])


def investigation_of(ctx: AgentContext, state: DiagnosisState) -> Investigation:
    return Investigation(
        ctx.session_id, system_of(ctx), playbook_of(ctx), state["bundle"].get("problem_type") or ""
    )


def gather(
    inv: Investigation, ctx: AgentContext, run: AgentRun, call: dict[str, Any]
) -> dict[str, Any]:
    """One evidence call, recorded under `run`; the past cases it found are also one
    `diagnosis.similar_cases` event, written with it (keyed by the step: once)."""
    item, response = inv.run(tool_context(ctx, run), call)
    if call["tool"] == "similar_cases" and "cases" in response:
        append_step_event(
            ctx.session_id,
            SIMILAR,
            {"cases": response["cases"]},
            producer=ctx.producer,
            run=run,
        )
    return item


def set_mode(run: AgentRun, mode: str) -> None:
    """A run's mode: a node run not yet written takes it with its insert."""
    run.mode = mode
    AgentRun.objects.filter(pk=run.pk).update(mode=mode)
