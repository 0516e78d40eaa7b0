"""The incident agent: input parser -> reasoning -> tool executor -> compliance validator
-> output generator, with the ask-the-user and approval waits as interrupts.

Nodes return partial state updates. A node that interrupts re-runs from its first line
on resume, so the waiting nodes do nothing but interrupt; everything with an effect is
keyed (events by key, tool calls by idempotency key) and is safe to repeat.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Literal, Protocol

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from langgraph.config import get_config
from langgraph.errors import GraphInterrupt
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from aero.compiled import AnyOf, Arg, Compiled, insert_rows
from aero.text import MAX_MODEL_TEXT, cut_generated
from diagnosis import shutdown
from diagnosis.agent import budget, fsm, grounding, policy, prompts, summaries, waits
from diagnosis.agent.extraction import Extraction, is_unsure
from diagnosis.agent.providers import (
    Attempt,
    OpenAICompatibleProvider,
    Provider,
    Usage,
    call_with_fallback,
)
from diagnosis.agent.state import AgentContext, AgentState
from diagnosis.agent.tools import (
    ENRICHMENT_SOURCES,
    ToolContext,
    get_or_create_call,
    new_call,
    run_action,
    run_deterministic,
    run_enrichment,
)
from diagnosis.events import (
    EventBatch,
    LeaseLost,
    StepGroup,
    add_usage,
    append_event,
    append_event_once,
    append_keyed,
    append_step_event,
    as_logged,
    step_scope,
)
from diagnosis.execution import log_approval_required, open_approval
from diagnosis.models import (
    WITHDRAWN_ASKED_AGAIN,
    WITHDRAWN_NOT_CALLED_FOR,
    AgentRun,
    Event,
    LLMCall,
    Restriction,
    Session,
    SessionStatus,
    ToolCall,
    ToolCallStatus,
)
from diagnosis.reporting import md_cell, write_report
from diagnosis.signals import approval_withdrawn, approvals_required
from scenarios_admin.definition import BUDGET_TOOL, restriction_of, value_order


class NodeFn(Protocol):
    def __call__(self, state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]: ...


class SessionCanceled(Exception):
    pass


def recorded(
    name: str, *, last: bool = False, rows: bool = True
) -> Callable[[Callable[..., dict[str, Any]]], NodeFn]:
    """Run a node as a child AgentRun with agent.node_* events, and stop if canceled.

    The steps between two waits are one transaction (a StepGroup, ADR 145; one per step
    before, ADR 55): each node's rows and its events (queued, written when the group
    commits, under one lock) commit together or not at all; a crash mid-group leaves
    nothing half-written and a failed step is logged on its own after the steps before
    it commit. The events are keyed by the step's task (StepScope): if the group
    committed but its checkpoint did not, the re-run writes nothing twice. `last`: the
    graph ends after this node, so the group commits when it returns. `rows=False`: the
    node writes no row but its run (it only reads, and queues events) when no model
    reasons for the session: it joins its group without a savepoint (a write would be
    refused)."""

    def decorator(fn: Callable[..., dict[str, Any]]) -> NodeFn:
        # No functools.wraps: LangGraph reads the signature to inject `runtime`.
        def wrapper(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
            ctx = runtime.context
            group = step_group(ctx)
            if shutdown.stopping():
                group.commit()  # the steps before this one: their checkpoint follows
                raise shutdown.WorkerStopping()  # before the step: the next job runs it
            # A canceled session has no lease any more: the group's write is refused
            # under the row lock (LeaseLost) and the job ends as canceled. No query here.
            try:
                update = _run_step(
                    fn,
                    name,
                    state,
                    ctx,
                    _task_key(runtime, name),
                    _wait_key(runtime, name),
                    lean=not rows and group.is_open and not reasons(ctx),
                )
            except waits.ModelWait as wait:
                # The step rolled back, the steps before it commit; it re-runs from its
                # first line once the runner has the reply (ADR 95). The interrupt
                # carries the request; the job records its row after the checkpoint
                # (ADR 172: not with this commit).
                group.commit()
                waits.interrupt_for(wait)
                raise  # not reached: interrupt_for raises the interrupt
            if (
                update.pop("_commit", False)
                or last
                or group.end_after_step
                or commits_after(ctx, name, update)
            ):
                # The graph ends after this node (its checkpoint follows), or the step
                # handed effects to the outbox, which go out once it commits; a session
                # a model reasons for commits after its model's steps (`commits_after`).
                group.commit()
            return update

        wrapper.__name__ = fn.__name__
        return wrapper

    return decorator


def _run_step(
    fn: Callable[..., dict[str, Any]],
    name: str,
    state: AgentState,
    ctx: AgentContext,
    task_key: str,
    wait_key: str,
    *,
    lean: bool = False,
) -> dict[str, Any]:
    """One node's step: its rows and events in one transaction (see `recorded`).
    `lean`: a step without a savepoint, that may write no row but its run."""
    group = step_group(ctx)
    run: AgentRun | None = None
    with waits.wait_scope(ctx.session_id, wait_key), step_scope(task_key) as scope:
        try:
            with group.step(savepoint=not lean) as batch:
                run = _start_node(ctx, batch, scope.key("agent.node_started"), name, state)
                with writes_refused(name) if lean else nullcontext():
                    update = fn(state, ctx, run)
                summary = update.pop("_summary", "")
                group.finish_run(run, summary)  # written with the group's commit
                append_step_event(
                    ctx.session_id,
                    "agent.node_completed",
                    {"node": name, "run": run.pk, "summary": summary},
                    producer=ctx.producer,
                    run=run,
                )
        except Exception as exc:
            ctx.actions = None  # the step's own changes to them rolled back
            if isinstance(exc, (SessionCanceled, LeaseLost)):
                group.rollback(lost=True)  # a lost lease writes nothing, not its failure
                raise
            try:
                group.commit()  # the steps before this one did their work: keep it
            except Exception:
                # Lost with them (a lean step's database error spoils the transaction):
                # their checkpoint is refused and the retry runs them all again.
                _record_failure(ctx, name, state, exc)
                raise
            if type(exc).__name__ == "GraphInterrupt":
                raise
            # A lean step's run row was kept with the group: it is the failed run.
            _record_failure(ctx, name, state, exc, run if lean else None)
            raise
    return update


@contextmanager
def writes_refused(name: str) -> Iterator[None]:
    """A lean step has no savepoint to roll a row back to: any write is a bug, refused
    (the step fails and says so) rather than left in the group after a failure."""

    def refuse(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip()[:6].upper() in ("INSERT", "UPDATE", "DELETE"):
            raise RuntimeError(f"{name} wrote a row: it must be recorded with rows=True")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(refuse):
        yield


def reasons(ctx: AgentContext) -> bool:
    """Whether a real model picks this session's steps (diagnosis.agent.react). Its
    steps are not grouped: the conversation and the budget are rebuilt from the log at
    every step (ADR 99), so each step's events must be written before the next one
    reads them, and a model call may take seconds. Grouping is for the deterministic
    steps that follow each other with nothing to wait for (ADR 145)."""
    return any(isinstance(p, OpenAICompatibleProvider) for p in ctx.providers)


def commits_after(ctx: AgentContext, name: str, update: dict[str, Any] | None = None) -> bool:
    """Whether the group commits after this step of a session a model reasons for.

    Model calls inside the step (blocking mode, AERO_LLM_WAITS off) take seconds: every
    step commits, so the session's page shows each one as it ends. With model calls as
    waits no step blocks, and only the reasoning step commits at once: the conversation
    and the budget are rebuilt from the log (ADR 99), and the next reasoning step must
    find this one's `agent.note` there, written before the calls it led to (the
    conversation orders the model's turns and the policy's own calls by time). The steps
    after it (the tools, the compliance check, the next reasoning step up to its model
    wait) are one group, like a session without a model's (ADR 169). A reasoning step
    whose plan is a human wait (approvals, a question) leaves the commit to that wait,
    the very next step: nothing comes between them, and the wait's commit carries the
    move to waiting_user (ADR 174)."""
    if not reasons(ctx):
        return False
    if not waits.waits_enabled():
        return True
    if name != "reasoning":
        return False
    step = ((update or {}).get("plan") or {}).get("step")
    return step not in ("await", "ask")


def step_group(ctx: AgentContext) -> StepGroup:
    if ctx.group is None:
        ctx.group = StepGroup(ctx.session_id)
    return ctx.group


def commit_steps(ctx: AgentContext) -> None:
    """Before a wait: the steps so far commit, before the checkpoint of the interrupt.
    The action calls are read again after the wait (a decision may have landed)."""
    if ctx.group is not None:
        ctx.group.commit()
    ctx.actions = None


def _record_failure(
    ctx: AgentContext, name: str, state: AgentState, exc: Exception, run: AgentRun | None = None
) -> None:
    """The step rolled back; its failure is a fact of its own (not keyed: a second
    failure of the step is a new one). `run`: the failed step's run row, committed with
    its group (a lean step): marked failed rather than a second row made."""
    with transaction.atomic():
        step_group(ctx).write_status()  # the job's move to running comes first
        if run is not None and run._state.adding:
            # A lean step's run, never written (ADR 156): written now, as failed.
            run.status, run.ended_at = "failed", timezone.now()
            run.save(force_insert=True)
        elif run is not None:
            AgentRun.objects.filter(pk=run.pk).update(status="failed", ended_at=timezone.now())
        else:
            run = AgentRun.objects.create(
                session_id=ctx.session_id,
                parent=ctx.root_run,
                agent_name=name,
                status="failed",
                ended_at=timezone.now(),
                input_snapshot={"fsm": state.get("fsm", "")},
            )
        append_event(
            ctx.session_id,
            "agent.node_failed",
            {"node": name, "run": run.pk, "error": f"{type(exc).__name__}: {exc}"},
            producer=ctx.producer,
            run=run,
        )


def _task_key(runtime: Runtime[AgentContext], name: str) -> str:
    """The same for a re-run of the step, new for any later step. Not LangGraph's task id:
    checkpoints are saved only when the graph exits (ADR 85), so after a crash mid-run
    the steps after the first get new task ids (their checkpoints were never saved).
    The checkpoint the run started from, the step number (counted from the thread's
    start) and the node do not change: the graph is a chain, one node per step."""
    step = get_config()["metadata"]["langgraph_step"]
    return f"task:{runtime.context.origin or 'start'}:{step}:{name}"


def _wait_key(runtime: Runtime[AgentContext], name: str) -> str:
    """The key of a node's model calls: it must survive the interrupt a model wait ends
    the job with, and `_task_key` does not (the resumed run starts from the checkpoint
    saved at that interrupt: a new origin). LangGraph's task id does: the interrupted
    task is pending in that checkpoint and keeps its id when it re-runs on resume."""
    info = runtime.execution_info
    if info is not None and info.task_id:
        return f"task:{info.task_id}"
    return _task_key(runtime, name)


def _start_node(
    ctx: AgentContext, batch: EventBatch, key: str, name: str, state: AgentState
) -> AgentRun:
    started = batch.find(key)
    if started is not None and started.run_id is not None:
        # The step committed before (its checkpoint did not): carry on with its run.
        AgentRun.objects.filter(pk=started.run_id).update(status="running", ended_at=None)
        run = AgentRun(pk=started.run_id, session_id=ctx.session_id, agent_name=name)
        run._state.adding = False  # its row exists: a failure updates it
        return run
    fields = {
        "session_id": ctx.session_id,
        "parent": ctx.root_run,
        "agent_name": name,
        "input_snapshot": {"fsm": state.get("fsm", "")},
    }
    # Written with the group's commit, already completed (ADR 156); SQLite: now.
    run = step_group(ctx).new_run(**fields) or AgentRun.objects.create(**fields)
    append_keyed(
        ctx.session_id,
        "agent.node_started",
        key,
        {"node": name, "run": run.pk},
        producer=ctx.producer,
        run=run,
    )
    return run


# --- input parser ---------------------------------------------------------------------


# The operator's messages after the last one read: compiled once per connection (ADR 179).
_messages_after = Compiled(
    Event,
    lambda: Event.objects.filter(
        session_id=Arg(0, Event._meta.get_field("session")),
        type="user.message",
        seq__gt=Arg(1, Event._meta.get_field("seq")),
    ).order_by("seq"),
)


@recorded("input_parser")
def input_parser(state: AgentState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    definition = ctx.definition
    fields = dict(state.get("fields") or {})
    evidence = dict(state.get("evidence") or {})
    consumed = state.get("consumed_seq", 0)
    asked = (state.get("question") or {}).get("field")
    messages = _messages_after.rows(ctx.session_id, consumed)
    pending = dict(state.get("unconfirmed") or {})
    changed: dict[str, Any] = {}
    unconfirmed: dict[str, Any] = {}
    # The field whose pending value the operator is answering about: a yes settles it.
    confirming = asked if asked in pending else None
    only_corrections = False
    unsure = False
    for message in messages:
        text = message.payload.get("text", "")
        correction = message.payload.get("correction")
        if correction and correction.get("field") in definition["fields"]:
            # The operator corrected a fact: taken as said, no extraction, no question.
            name = correction["field"]
            fields[name] = correction["value"]
            evidence[name] = f"corrected by {message.payload.get('author', 'the operator')}"
            changed[name] = correction["value"]
            pending.pop(name, None)
            consumed = message.seq
            only_corrections = True
            unsure = False  # a correction says nothing about not knowing
            continue
        only_corrections = False

        def extract(provider: Provider, text: str = text) -> tuple[dict[str, Extraction], Usage]:
            return provider.extract(definition, text, ctx.graph, asked)

        # Keyed by the message, not by the call's place in this step: the session's
        # creation records the opening message's request under the same key (ADR 170).
        with waits.call_key(waits.extraction_key(ctx.session_id, message.seq)):
            found = call_with_fallback(
                ctx.providers, "extract", extract, _recorder(ctx, run), _fallback_recorder(ctx, run)
            )
        for name, extraction in grounding.settle(definition, found, pending, asked, text):
            known = fields.get(name)
            if (
                extraction.confirmed
                and name != confirming
                and known is not None
                and evidence.get(name) != "default"
                and extraction.value != known
            ):
                # Another value for a known field (a second tab, a slip): the operator
                # confirms the change first; nothing is taken or dropped unseen.
                pending[name] = {
                    "value": extraction.value,
                    "evidence": extraction.evidence,
                    "replaces": known,
                }
                unconfirmed[name] = pending[name]
            elif extraction.confirmed:
                fields[name] = extraction.value
                evidence[name] = extraction.evidence
                changed[name] = extraction.value
                pending.pop(name, None)
            elif fields.get(name) is None:
                # Read without evidence of its own: the operator confirms it first.
                pending[name] = {"value": extraction.value, "evidence": extraction.evidence}
                unconfirmed[name] = pending[name]
        consumed = message.seq
        unsure = bool(asked) and asked not in changed and is_unsure(text)
    for name, spec in definition["fields"].items():
        if fields.get(name) is None and spec.get("default") is not None:
            fields[name] = spec["default"]
            evidence[name] = "default"
            changed[name] = spec["default"]
    missing = policy.missing_p1(definition, fields)
    replan = replan_after_correction(state, definition, changed, evidence)
    append_step_event(
        ctx.session_id,
        "fields.extracted",
        {
            "changed": changed,
            "evidence": {k: evidence[k] for k in changed},
            "missing": missing,
            "unconfirmed": unconfirmed,  # read in these messages, to be confirmed
            "pending": pending,  # every value awaiting the operator's confirmation
            "through_seq": consumed,
        },
        producer=ctx.producer,
        run=run,
    )
    summary = summaries.fields_recognised(len(changed), missing)
    return {
        "fields": fields,
        "evidence": evidence,
        "consumed_seq": consumed,
        "question": None,
        "unconfirmed": pending,
        "only_corrections": only_corrections,
        "unsure": unsure,
        "new_input": False,
        **replan,
        "_summary": summary,
    }


def replan_after_correction(
    state: AgentState, definition: dict[str, Any], changed: dict[str, Any], evidence: dict[str, str]
) -> dict[str, Any]:
    """A fact corrected after the risk was assessed (ADR-138): the risk, the impact and
    the proposals no longer stand. They are cleared so the planner runs the rules again
    (and the lookups, when the flight or the position changed); the proposals made next
    are revision n, and what was open before is withdrawn then (tool_executor)."""
    risk = state.get("risk")
    corrected = {
        name: value
        for name, value in changed.items()
        if evidence.get(name, "").startswith("corrected by")
        and (state.get("fields") or {}).get(name) != value
    }
    if not risk or not corrected:
        return {}
    lookups_from = {definition["impact"]["start"]} | {
        n for n, spec in definition["fields"].items() if spec["type"] == "flight_no"
    }
    update: dict[str, Any] = {
        "risk": None,
        "impact": None,
        "actions_planned": False,
        "revision": int(state.get("revision") or 0) + 1,
        "replanning": {"previous_risk": risk, "corrected": corrected},
    }
    if lookups_from & set(corrected):
        update["enrichment"] = None
    return update


def _recorder(ctx: AgentContext, run: AgentRun) -> Callable[[Attempt], None]:
    def record(attempt: Attempt) -> None:
        usage = attempt.usage
        payload: dict[str, Any] = {
            "provider": attempt.provider,
            "model": attempt.model,
            "purpose": attempt.purpose,
            "status": attempt.status,
            "tokens_in": usage.tokens_in,
            "tokens_out": usage.tokens_out,
            "cost": str(usage.cost),
            "latency_ms": attempt.latency_ms,
            "error": attempt.error,
            "attempt": attempt.attempt,
        }
        if usage.text:
            # The reply's text, as the runner records a streamed one: replay shows it.
            payload["text"], cut_from = cut_generated(usage.text, MAX_MODEL_TEXT)
            if cut_from is not None:
                payload["cut_from_chars"] = cut_from
        with transaction.atomic(savepoint=False):  # inside the step (ADR 86)
            _, new = append_step_event(
                ctx.session_id, "llm.call", payload, producer=ctx.producer, run=run
            )
            if not new:
                return  # recorded and counted by the first run of this step
            LLMCall.objects.create(
                session_id=ctx.session_id,
                agent_run=run,
                provider=attempt.provider,
                model=attempt.model,
                purpose=attempt.purpose,
                status=attempt.status,
                tokens_in=usage.tokens_in,
                tokens_out=usage.tokens_out,
                cost=usage.cost,
                latency_ms=attempt.latency_ms,
                error=attempt.error,
            )
            if usage.tokens_in or usage.tokens_out or usage.cost:
                add_usage(ctx.session_id, usage.tokens_in, usage.tokens_out, usage.cost)
                # That UPDATE holds the session row until the commit: the group ends
                # with this step, so a slow model call in the next one does not keep
                # decisions, cancels and the heartbeat waiting.
                step_group(ctx).end_after_step = True

    return record


def _fallback_recorder(ctx: AgentContext, run: AgentRun) -> Callable[[str, str, str], None]:
    def on_fallback(failed: str, next_provider: str, error: str) -> None:
        append_step_event(
            ctx.session_id,
            "llm.fallback",
            {"from": failed, "to": next_provider, "error": error},
            producer=ctx.producer,
            run=run,
        )

    return on_fallback


# --- reasoning ------------------------------------------------------------------------


UNFINISHED_EXECUTION = (ToolCallStatus.APPROVED, ToolCallStatus.EXECUTING, ToolCallStatus.RUNNING)


# Read by most steps: compiled once per connection (ADR 179).
_action_calls = Compiled(
    ToolCall,
    lambda: ToolCall.objects.filter(
        session_id=Arg(0, ToolCall._meta.get_field("session")), is_action=True
    ).order_by("position", "id"),
)


def action_calls(session_id: Any) -> list[ToolCall]:
    return list(_action_calls.rows(session_id))


def action_calls_of(ctx: AgentContext) -> list[ToolCall]:
    """The session's action calls, read once per step group (ADR 145), not once per step:
    the group's own steps are the only ones that change them (tool_executor forgets them
    when it did), and a decision landing meanwhile is seen when the group ends at a wait
    (await_approval reads the calls itself and forgets these): a stale list can only
    make the agent wait where it could have gone on, never act on a call undecided."""
    if ctx.actions is None:
        ctx.actions = action_calls(ctx.session_id)
    return ctx.actions


def facts_of(
    state: AgentState, ctx: AgentContext, actions: list[ToolCall] | None = None
) -> fsm.Facts:
    actions = action_calls_of(ctx) if actions is None else actions
    settled = state.get("actions_planned", False) and all(
        a.status
        in (
            ToolCallStatus.COMPLETED,
            ToolCallStatus.FAILED,
            ToolCallStatus.REJECTED,
            ToolCallStatus.TIMEOUT,
            ToolCallStatus.REFUSED,  # by the policy at execution time
            ToolCallStatus.CANCELED,  # withdrawn after a correction (ADR-138)
        )
        for a in actions
    )
    return fsm.Facts(
        p1_complete=not policy.missing_p1(ctx.definition, state.get("fields") or {}),
        risk_assessed=bool(state.get("risk")),
        impact_analyzed=bool(state.get("impact")),
        actions_settled=settled,
        reported=bool(state.get("reported")),
    )


def offline_plan(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    """The deterministic planner: the next step from what is known. Always compliant."""
    definition = ctx.definition
    fields = state.get("fields") or {}
    conflicts = [n for n, p in (state.get("unconfirmed") or {}).items() if "replaces" in p]
    if conflicts:  # a changed value waits for the operator's yes or no first
        return {"step": "ask", "field": conflicts[0]}
    missing = policy.missing_p1(definition, fields)
    if missing:
        return {"step": "ask", "field": missing[0]}
    optional = policy.unasked_p2(definition, fields, list(state.get("asked") or []))
    if optional and not state.get("risk"):  # once, before the rules run without it
        return {"step": "ask", "field": optional[0]}
    suffix = revision_suffix(state)
    if state.get("enrichment") is None:
        return {
            "step": "call",
            "calls": [
                {**c, "call_id": c["call_id"] + suffix}
                for c in enrichment_calls(definition, fields)
            ],
        }
    if not state.get("risk"):
        return {
            "step": "call",
            "calls": [{"call_id": "assess_risk" + suffix, "tool": "assess_risk", "args": {}}],
        }
    if not state.get("impact"):
        return {
            "step": "call",
            "calls": [{"call_id": "analyze_impact" + suffix, "tool": "analyze_impact", "args": {}}],
        }
    if not state.get("actions_planned"):
        proposals = policy.required_actions(
            definition, fields, ctx.graph, state["risk"] or {}, state["impact"] or {}
        )
        for position, proposal in enumerate(proposals):
            proposal["position"] = position
            proposal["mode"] = "propose"
        return {"step": "call", "calls": proposals}
    actions = action_calls_of(ctx)
    # Approved, or handed to the outbox and not recorded yet (a crash in between): run.
    approved = [a for a in actions if a.status in UNFINISHED_EXECUTION]
    if approved:
        return {
            "step": "call",
            "calls": [
                {
                    "call_id": a.call_id,
                    "tool": a.tool_name,
                    "args": a.request_payload,
                    "risk_class": a.risk_class,
                    "is_action": True,
                    "mode": "execute",
                }
                for a in approved
            ],
        }
    if any(a.status == ToolCallStatus.AWAITING_APPROVAL for a in actions):
        return {"step": "await"}
    return {"step": "finish"}


def revision_suffix(state: AgentState) -> str:
    """After a correction the lookups and analyses run again as revision n: a call id of
    their own, so no earlier (recorded) result is reused (ADR-138). The policy's plan and
    the model's checked calls (react.decide) both use it."""
    revision = int(state.get("revision") or 0)
    return f"#r{revision}" if revision else ""


def enrichment_calls(definition: dict[str, Any], fields: dict[str, Any]) -> list[dict[str, Any]]:
    # field_order, not dict order: PostgreSQL's jsonb does not keep key order.
    by_type: dict[str, str] = {}
    for name in definition["field_order"]:
        by_type.setdefault(definition["fields"][name]["type"], name)
    calls = []
    flight_field = by_type.get("flight_no")
    if flight_field and fields.get(flight_field):
        for tool in ("lookup_aircraft_info", "lookup_flight_plan"):
            calls.append(
                {"call_id": tool, "tool": tool, "args": {"flight_no": fields[flight_field]}}
            )
    start = definition["impact"]["start"]
    if fields.get(start):
        calls.append(
            {
                "call_id": "lookup_stand_location",
                "tool": "lookup_stand_location",
                "args": {"position": fields[start]},
            }
        )
    return calls


def default_plan(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    """With a real provider the model picks the calls (diagnosis.agent.react), checked by
    the policy; the step that runs is always the policy's (safety-critical sequencing is
    policy, not model output). Offline: the deterministic planner alone."""
    from diagnosis.agent.react import react_plan

    return react_plan(state, ctx, offline_plan)


# Tests replace this to script an agent that misbehaves.
PLANNER: dict[str, Callable[[AgentState, AgentContext], dict[str, Any]]] = {"plan": default_plan}


@recorded("reasoning", rows=False)
def reasoning(state: AgentState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    note_unexecuted_actions(ctx, run)
    plan = PLANNER["plan"](state, ctx)
    update: dict[str, Any] = {"plan": plan, "refusals": []}
    if plan["step"] == "ask":
        field = plan["field"]
        asked = list(state.get("asked") or [])
        spec = ctx.definition["fields"][field]
        lang = state.get("language", "en")
        text = spec["ask"][lang]
        candidate = (state.get("unconfirmed") or {}).get(field)
        if candidate is not None and "replaces" in candidate:
            text = prompts.conflict(
                spec, candidate["value"], candidate["replaces"], candidate["evidence"], lang
            )
        elif candidate is not None:
            text = prompts.confirmation(spec, candidate["value"], candidate["evidence"], lang)
        elif field in asked and state.get("unsure"):
            text = _unsure_hint(spec, lang) + text
        elif field in asked and not state.get("only_corrections"):
            text = _retry_hint(spec, lang) + text
        asked.append(field)
        question = {"field": field, "text": text, "key": f"q{len(asked)}"}
        append_event_once(
            ctx.session_id,
            "agent.question",
            question["key"],
            {"field": field, "label": spec["label"][lang], "text": text},
            producer=ctx.producer,
            run=run,
        )
        update.update(asked=asked, question=question)
        update["_summary"] = summaries.asks_for(field)
    elif plan["step"] == "call":
        update["_summary"] = summaries.calls(c["tool"] for c in plan["calls"])
    else:
        update["_summary"] = plan["step"]
    return update


def note_unexecuted_actions(ctx: AgentContext, run: AgentRun) -> None:
    """A rejected or timed-out action goes back to the agent with its reason: it carries
    on without it (the report records it) and says so on the timeline, once."""
    for call in action_calls_of(ctx):
        if call.status not in (ToolCallStatus.REJECTED, ToolCallStatus.TIMEOUT):
            continue
        outcome = "rejected" if call.status == ToolCallStatus.REJECTED else "timed out"
        append_event_once(
            ctx.session_id,
            "agent.note",
            f"unexecuted:{call.pk}",
            {
                "tool_call": call.pk,
                "tool_name": call.tool_name,
                "args": call.request_payload,
                "outcome": outcome,
                "reason": call.decision_reason,
                "text": f"Continuing without {call.tool_name} ({outcome}: "
                f"{call.decision_reason or 'no reason given'}); the report records it"
                + ("; a manual to-do was opened." if outcome == "timed out" else "."),
            },
            producer=ctx.producer,
            run=run,
        )


def _options(spec: dict[str, Any], lang: str) -> str:
    values = spec.get("values") or {}
    return " / ".join(values[k].get("label", {}).get(lang, k) for k in value_order(spec))


def _retry_hint(spec: dict[str, Any], lang: str) -> str:
    names = _options(spec, lang)
    if lang == "zh":
        return "未能识别您的回答。" + (f"可选：{names}。" if names else "")
    return "I could not recognise that answer. " + (f"Options: {names}. " if names else "")


def _unsure_hint(spec: dict[str, Any], lang: str) -> str:
    """The operator does not know yet: a required fact decides the risk, so it is asked
    again, with what to do (an unknown never matches a rule: guessing is not an option)."""
    names = _options(spec, lang)
    if lang == "zh":
        return "风险评估需要这一项：请向机组或现场人员确认后告诉我。" + (
            f"可选：{names}。" if names else ""
        )
    return "The risk cannot be assessed without this: please check with the crew or the " + (
        f"staff on site, then tell me. Options: {names}. " if names else "staff on site. "
    )


def route_after_reasoning(
    state: AgentState,
) -> Literal["ask_user", "tool_executor", "await_approval", "compliance_validator"]:
    step = state["plan"]["step"]
    if step == "ask":
        return "ask_user"
    if step == "call":
        return "tool_executor"
    if step == "await":
        return "await_approval"
    return "compliance_validator"  # finish, or stop (the budget ran out and was refused)


# --- waits (interrupts) ---------------------------------------------------------------


def wait_for_user(ctx: AgentContext, value: dict[str, Any]) -> None:
    """Interrupt for a human (a question, approvals). When the graph really stops here
    (no resume value), the steps so far commit before the interrupt's checkpoint, with
    the session's move to waiting_user as their group's last event (ADR 174): the job
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
    # The actions awaiting a decision, and a request to continue past the model budget,
    # which waits like one (ADR 143): one query (in the steps' transaction, if open: it
    # sees their proposals).
    waiting = list(
        ToolCall.objects.filter(
            Q(is_action=True) | Q(tool_name=BUDGET_TOOL),
            session_id=runtime.context.session_id,
            status=ToolCallStatus.AWAITING_APPROVAL,
        )
        .order_by("position", "id")
        .values_list("pk", flat=True)
    )
    if waiting:
        wait_for_user(runtime.context, {"kind": "approval", "tool_calls": waiting})
    else:
        commit_steps(runtime.context)
    # A correction sent while waiting goes through the input parser first (ADR-138).
    unread = Event.objects.filter(
        session_id=runtime.context.session_id,
        type="user.message",
        seq__gt=state.get("consumed_seq", 0),
    ).exists()
    return {"new_input": unread}


def route_after_wait(state: AgentState) -> Literal["input_parser", "reasoning"]:
    return "input_parser" if state.get("new_input") else "reasoning"


# --- tool executor --------------------------------------------------------------------


@recorded("tool_executor")
def tool_executor(state: AgentState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    definition = ctx.definition
    tctx = ToolContext(ctx.session_id, ctx.graph, run, ctx.producer, definition=definition)
    calls = state["plan"].get("calls", [])
    update: dict[str, Any] = {}
    refusals: list[dict[str, Any]] = []
    actions = action_calls_of(ctx)
    facts = facts_of(state, ctx, actions)

    lookups = [c for c in calls if c["tool"] in ENRICHMENT_SOURCES]
    if lookups:
        enrichment = run_enrichment(tctx, lookups)
        earlier = state.get("enrichment")
        if earlier:  # the model looked some sources up in an earlier step: keep them
            enrichment = {
                **earlier,
                **enrichment,
                "degraded": [*earlier.get("degraded", []), *enrichment["degraded"]],
            }
        update["enrichment"] = enrichment
        append_step_event(
            ctx.session_id,
            "timeline.appended",
            {
                "kind": "enrichment",
                "degraded": enrichment["degraded"],
                "sources": sorted(k for k in enrichment if k != "degraded"),
                "enrichment": enrichment,
            },
            producer=ctx.producer,
            run=run,
        )

    fields = state.get("fields") or {}
    proposing = [c for c in calls if c.get("mode") == "propose"]
    if proposing and state.get("replanning"):
        calls = [c for c in calls if c.get("mode") != "propose"] + revise_proposals(
            ctx, run, proposing, int(state.get("revision") or 0), actions
        )
        update["replanning"] = None
    made = {a.call_id for a in actions}
    board = board_for([c for c in calls if c.get("mode") == "propose"])
    opened = open_proposals(tctx, calls, facts, made, board)
    for call in calls:
        tool = call["tool"]
        if tool in ENRICHMENT_SOURCES:
            continue
        violation = fsm.check_step(definition, facts, tool)
        if violation:
            refusals.append({"call_id": call["call_id"], "tool": tool, "violation": violation})
            continue
        if tool == "assess_risk":
            risk = run_deterministic(
                tctx,
                {**call, "args": {"fields": fields}},
                lambda: policy.assess_risk(
                    definition, policy.with_defaults(definition, fields), ctx.graph
                ),
            )
            update["risk"] = risk
            replanning = state.get("replanning") or {}
            before = replanning.get("previous_risk")
            append_step_event(
                ctx.session_id,
                "risk.assessed",
                risk
                if not before
                else {
                    **risk,
                    # Re-run after a correction: what it was, and what was corrected.
                    "reassessed_from": {k: before.get(k) for k in ("rule", "level", "score")},
                    "corrected": replanning.get("corrected", {}),
                },
                producer=ctx.producer,
                run=run,
            )
            facts = fsm.Facts(facts.p1_complete, True, False, False, False)
        elif tool == "analyze_impact":
            level: str = (update.get("risk") or state.get("risk") or {})["level"]

            def analyze(level: str = level) -> dict[str, Any]:
                return policy.analyze_impact(definition, fields, ctx.graph, level)

            impact = run_deterministic(
                tctx,
                {
                    **call,
                    "args": {"start": fields.get(definition["impact"]["start"]), "level": level},
                },
                analyze,
            )
            update["impact"] = impact
            append_step_event(
                ctx.session_id,
                "impact.analyzed",
                impact,
                producer=ctx.producer,
                run=run,
            )
            facts = fsm.Facts(facts.p1_complete, True, True, False, False)
        elif call.get("mode") == "execute":
            tool_call = ToolCall.objects.get(session_id=ctx.session_id, call_id=call["call_id"])
            run_action(tctx, tool_call.pk)
        elif call["call_id"] in opened:
            proposed(tctx, *opened[call["call_id"]])
        elif not note_if_in_force(ctx, run, call, made, board):
            propose_action(tctx, call, fresh=call["call_id"] not in made)
    if any(c["tool"] not in NOT_ACTIONS for c in calls):
        ctx.actions = None  # proposed, executed or withdrawn here: read them again
        # An action handed to the outbox goes out when its transaction commits, and
        # the next steps must see its result: the group ends with this step.
        update["_commit"] = True
    if proposing and not refusals:
        update["actions_planned"] = True
    update["refusals"] = refusals
    update["_summary"] = summaries.calls_handled(len(calls) - len(refusals), len(refusals))
    return update


NOT_ACTIONS = frozenset({*ENRICHMENT_SOURCES, "assess_risk", "analyze_impact"})

DONE_OR_UNDER_WAY = (
    ToolCallStatus.APPROVED,
    ToolCallStatus.EXECUTING,
    ToolCallStatus.RUNNING,
    ToolCallStatus.COMPLETED,
)


def base_call_id(call_id: str) -> str:
    return call_id.split("#r", 1)[0]


def revise_proposals(
    ctx: AgentContext,
    run: AgentRun,
    proposals: list[dict[str, Any]],
    revision: int,
    actions: list[ToolCall],
) -> list[dict[str, Any]]:
    """The proposals after a correction (ADR-138). Approvals still open were requested
    under the earlier facts (their state digest no longer holds): each is withdrawn with
    an `approval.canceled` event (`withdrawn`), saying whether the corrected facts still
    call for it (then it is asked again, as revision n: a new call id and approval) or not.
    An action already approved or done is proposed again only when the corrected facts
    change its arguments (ATC told "fuel, HIGH" hears "oil, MEDIUM"; the crew sent to
    stand 105 is sent to 107): the same arguments are never sent twice. Keyed, so a re-run
    step withdraws and proposes nothing twice."""
    wanted = {p["call_id"] for p in proposals}
    done = done_with_args(ctx.session_id, actions)
    for call in actions:
        if call.status != ToolCallStatus.AWAITING_APPROVAL:
            continue
        still = base_call_id(call.call_id) in wanted
        reason = WITHDRAWN_ASKED_AGAIN if still else WITHDRAWN_NOT_CALLED_FOR
        at = timezone.now()
        with transaction.atomic(savepoint=False):  # inside the step (ADR 86)
            ToolCall.objects.filter(pk=call.pk).update(
                status=ToolCallStatus.CANCELED, decided_at=at, decision_reason=reason
            )
            approval_withdrawn.send(sender=ToolCall, tool_call=call, reason=reason, at=at)
            append_event_once(
                ctx.session_id,
                "approval.canceled",
                f"withdrawn:{call.pk}",
                {
                    "tool_call": call.pk,
                    "call_id": call.call_id,
                    "tool_name": call.tool_name,
                    "args": call.request_payload,
                    "risk_level": call.risk_class,
                    "by": "system",
                    "at": at.isoformat(),
                    "reason": reason,
                    "withdrawn": "asked_again" if still else "not_called_for",
                },
                producer=ctx.producer,
                run=run,
            )
    revised = []
    for p in proposals:
        call_id = f"{p['call_id']}#r{revision}"
        before = done.get(p["call_id"])
        if before is not None:
            if before == (p.get("args") or {}):
                continue
            append_event_once(
                ctx.session_id,
                "agent.note",
                f"again:{call_id}",
                {
                    "kind": "proposed_again",
                    "tool_name": p["tool"],
                    "risk_level": p.get("risk_class", "R0"),
                    "call_id": call_id,
                    "before": before,
                    "args": p.get("args") or {},
                    # The log stays language-neutral: pages word this note per viewer.
                    "text": f"{p['tool']} proposed again: the corrected facts change its arguments",
                },
                producer=ctx.producer,
                run=run,
            )
        revised.append({**p, "call_id": call_id})
    return revised


def done_with_args(session_id: Any, actions: list[ToolCall]) -> dict[str, dict[str, Any]]:
    """Per base call id, the arguments its latest approved or done call was proposed with:
    before any approver's edit (`approval.args_edited`), so an edit is not mistaken for a
    change of the facts. Read after a correction only."""
    latest: dict[str, ToolCall] = {}
    for call in actions:
        if call.status in DONE_OR_UNDER_WAY:
            base = base_call_id(call.call_id)
            if base not in latest or call.pk > latest[base].pk:
                latest[base] = call
    proposed = {call.pk: dict(call.request_payload) for call in latest.values()}
    if proposed:
        edits = Event.objects.filter(
            session_id=session_id,
            type="approval.args_edited",
            payload__tool_call__in=list(proposed),
        ).order_by("-seq")
        for payload in edits.values_list("payload", flat=True):
            # Newest first: the oldest edit's "before" (the proposal's own) is set last.
            proposed[payload["tool_call"]] = dict(payload["before"])
    return {base: proposed[call.pk] for base, call in latest.items()}


def board_for(calls: list[dict[str, Any]]) -> dict[tuple[str, str], Restriction]:
    """The closures in force that these proposals would put in force again (one query,
    none when no proposal closes anything), the oldest holder of each."""
    effects = [restriction_of(c["tool"], c.get("args") or {}) for c in calls]
    wanted = {e for e in effects if e is not None}
    if not wanted:
        return {}
    held: dict[tuple[str, str], Restriction] = {}
    for restriction in _in_force_on.rows(sorted({target for _, target in wanted})):
        held[(restriction.kind, restriction.target)] = restriction
    return held


# Read at every proposal step: compiled once per connection (ADR 179); the targets go as
# one array, so the SQL is the same whatever their number (ADR 186).
_in_force_on = Compiled(
    Restriction,
    lambda: Restriction.objects.filter(AnyOf("target", 0), lifted_at__isnull=True).order_by(
        "-created_at"
    ),
)


def note_if_in_force(
    ctx: AgentContext,
    run: AgentRun,
    call: dict[str, Any],
    made: set[str],
    board: dict[tuple[str, str], Restriction],
) -> bool:
    """A closure already on the board (put there by any session) is not proposed again:
    the agent says so once, naming the session that holds it. Decided at proposal time;
    a call this session already made (`made`: a re-run) is left to `propose_action`."""
    effect = restriction_of(call["tool"], call.get("args") or {})
    if effect is None or call["call_id"] in made:
        return False
    held = board.get(effect)
    if held is None:
        return False
    append_event_once(
        ctx.session_id,
        "agent.note",
        f"in_force:{call['call_id']}",
        {
            "kind": "already_in_force",
            "tool_name": call["tool"],
            "args": call.get("args") or {},
            "restriction": {"kind": effect[0], "target": effect[1]},
            "held_by": str(held.session_id),
            # The log stays language-neutral: pages word this note per viewer.
            "text": f"{call['tool']} not proposed: {effect[0]} {effect[1]} is already "
            f"closed by session {held.session_id}",
        },
        producer=ctx.producer,
        run=run,
    )
    return True


def propose_action(tctx: ToolContext, call: dict[str, Any], *, fresh: bool = False) -> None:
    """Propose an action: an R0 action is handed to the outbox at once (the proposal and
    its outbox row commit together; the effect follows the commit); R1-R3 wait for
    approval. No savepoint: it runs in the step's transaction (ADR 86)."""
    # An R1-R3 call is inserted awaiting approval (one INSERT, no UPDATE after it).
    waits_for_people = call.get("risk_class", "R0") != "R0"
    status = ToolCallStatus.AWAITING_APPROVAL if waits_for_people else ToolCallStatus.PROPOSED
    with transaction.atomic(savepoint=False):
        tool_call, created = get_or_create_call(tctx, call, status, fresh=fresh)
        if tool_call.status in (ToolCallStatus.EXECUTING, ToolCallStatus.RUNNING):
            run_action(tctx, tool_call.pk)  # handed to the outbox before a crash: finish it
            return
        if created and tool_call.status == ToolCallStatus.AWAITING_APPROVAL:
            # Its approval is digested against the session as the log will read once
            # this group commits (the risk and impact it logged are not written yet).
            tool_call.session = logged_session(tctx)
            open_approval(tool_call, producer=tctx.producer, run=tctx.run, fresh=True)
            return
        if tool_call.status != ToolCallStatus.PROPOSED:
            return  # proposed before this re-run: already decided or executed
        if tool_call.risk_class == "R0":
            run_action(tctx, tool_call.pk)
        else:
            # Proposed before this change of status-at-insert (an older re-run).
            tool_call.status = ToolCallStatus.AWAITING_APPROVAL
            tool_call.save(update_fields=["status"])
            open_approval(tool_call, producer=tctx.producer, run=tctx.run)


def open_proposals(
    tctx: ToolContext,
    calls: list[dict[str, Any]],
    facts: fsm.Facts,
    made: set[str],
    board: dict[tuple[str, str], Restriction],
) -> dict[str, tuple[ToolCall, dict[str, Any]]]:
    """A step that only proposes (the planner's proposals) inserts all its new calls in
    one statement and their approvals in one more, instead of two per call (ADR 145).
    Returns, by call id, each new call and what its approval was opened with; the step
    then logs them in the calls' order (`proposed`). Calls refused by the compliance
    check, already in force or made before (a re-run) are left to the step's loop."""
    if not calls or any(c.get("mode") != "propose" for c in calls):
        return {}
    new = [
        c
        for c in calls
        if c["call_id"] not in made
        and not fsm.check_step(tctx.definition, facts, c["tool"])
        and _held(c, board) is None
    ]
    if not new:
        return {}
    rows = insert_rows(
        ToolCall,
        [
            new_call(
                tctx,
                c,
                ToolCallStatus.PROPOSED
                if c.get("risk_class", "R0") == "R0"
                else ToolCallStatus.AWAITING_APPROVAL,
            )
            for c in new
        ],
    )
    waiting = [r for r in rows if r.status == ToolCallStatus.AWAITING_APPROVAL]
    approvals: dict[int, dict[str, Any]] = {}
    if waiting:
        # Digested against the session as the log will read once this group commits.
        session = logged_session(tctx)
        for _, response in approvals_required.send(
            sender=ToolCall, tool_calls=waiting, session=session
        ):
            if isinstance(response, dict):
                approvals.update(response)
    return {r.call_id: (r, approvals.get(r.pk, {})) for r in rows}


def proposed(tctx: ToolContext, tool_call: ToolCall, opened: dict[str, Any]) -> None:
    """Log a call `open_proposals` inserted: an R0 one is handed to the outbox at once;
    one awaiting approval gets its `approval.required` event."""
    if tool_call.status == ToolCallStatus.PROPOSED:
        run_action(tctx, tool_call.pk)
    else:
        log_approval_required(tool_call, opened, producer=tctx.producer, run=tctx.run)


def _held(call: dict[str, Any], board: dict[tuple[str, str], Restriction]) -> Restriction | None:
    effect = restriction_of(call["tool"], call.get("args") or {})
    return board.get(effect) if effect is not None else None


_session = Compiled(Session, lambda: Session.objects.filter(pk=Arg(0, Session._meta.pk)))


def session_row(session_id: Any) -> Session:
    """The session's row (compiled once per connection, ADR 179)."""
    return _session.get(session_id)


def logged_session(tctx: ToolContext) -> Session:
    """The session (read once per step) with the events queued in this group folded into
    its snapshot: what the approvals' state digest must be taken from (ADR 145)."""
    if tctx.session is None:
        tctx.session = session_row(tctx.session_id)
    return as_logged(copy.copy(tctx.session))


# --- compliance validator -------------------------------------------------------------


@recorded("compliance_validator", rows=False)
def compliance_validator(state: AgentState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    corrections = list(state.get("corrections") or [])
    for refusal in state.get("refusals") or []:
        corrections.append(refusal["violation"])
        append_step_event(ctx.session_id, "fsm.violation", refusal, producer=ctx.producer, run=run)
    facts = facts_of(state, ctx)
    finishing = state["plan"]["step"] == "finish"
    if state["plan"]["step"] == "stop":
        # The budget ran out and continuing was refused: the agent ends here and
        # reports what was done (nothing is awaiting: the model is only asked before
        # the actions are proposed or after they are settled).
        outcome, by, reason = budget.stop_reason(state["plan"]["request"])
        append_event_once(
            ctx.session_id,
            "budget.stopped",
            f"budget:{state['plan']['request']}:stopped",
            {"tool_call": state["plan"]["request"], "outcome": outcome, "by": by, "reason": reason},
            producer=ctx.producer,
            run=run,
        )
        plan = dict(state["plan"])
        plan["approved_finish"] = True
        return {"plan": plan, "refusals": [], "_summary": "stopped: budget refused"}
    if finishing and not facts.actions_settled:
        violation = {
            "tool": "write_report",
            "violation": fsm.check_step(ctx.definition, facts, "write_report")
            or "report requested with required actions undecided",
        }
        corrections.append(violation["violation"])
        append_step_event(
            ctx.session_id, "fsm.violation", violation, producer=ctx.producer, run=run
        )
        finishing = False
    current = fsm.state_name(ctx.definition, fsm.state_index(facts))
    previous = state.get("fsm") or fsm.state_name(ctx.definition, 0)
    if current != previous:
        append_step_event(
            ctx.session_id,
            "fsm.transition",
            {"from": previous, "to": current},
            producer=ctx.producer,
            run=run,
        )
    plan = dict(state["plan"])
    plan["approved_finish"] = finishing
    return {
        "fsm": current,
        "corrections": corrections,
        "refusals": [],
        "plan": plan,
        "_summary": summaries.compliance_state(current),
    }


def route_after_validation(state: AgentState) -> Literal["output_generator", "reasoning"]:
    return "output_generator" if state["plan"].get("approved_finish") else "reasoning"


# --- output generator -----------------------------------------------------------------


@recorded("output_generator", last=True)
def output_generator(state: AgentState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    if state["plan"]["step"] == "stop":
        outcome, by, reason = budget.stop_reason(state["plan"]["request"])
        lang = "zh" if state.get("language") == "zh" else "en"
        preface = prompts.BUDGET_STOPPED_PREFACE[lang].format(
            by=md_cell(by), reason=md_cell(reason or outcome)
        )
        write_report(
            ctx.session_id,
            ctx.definition,
            dict(state),
            producer=ctx.producer,
            run=run,
            preface=preface,
        )
        return {"reported": True, "_summary": "report written (budget refused)"}
    facts = facts_of(state, ctx)
    violation = fsm.check_step(ctx.definition, facts, "write_report")
    if violation:
        raise RuntimeError(violation)  # the validator routes here only when settled
    write_report(ctx.session_id, ctx.definition, dict(state), producer=ctx.producer, run=run)
    done = fsm.state_name(ctx.definition, fsm.state_index(fsm.Facts(True, True, True, True, True)))
    append_step_event(
        ctx.session_id,
        "fsm.transition",
        {"from": state.get("fsm"), "to": done},
        producer=ctx.producer,
        run=run,
    )
    return {"reported": True, "fsm": done, "_summary": summaries.REPORT_WRITTEN}


def build_graph() -> StateGraph[AgentState, AgentContext, AgentState, AgentState]:
    builder = StateGraph(AgentState, context_schema=AgentContext)
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
    builder.add_edge("tool_executor", "compliance_validator")
    builder.add_conditional_edges("await_approval", route_after_wait)
    builder.add_conditional_edges("compliance_validator", route_after_validation)
    builder.add_edge("output_generator", END)
    return builder
