"""How a node's step is recorded: its run, its events and rows in the step group's
transaction, its failure, the keys that make a re-run write nothing twice, and the
model calls it makes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from decimal import Decimal
from typing import Any, Protocol

from django.db import connection, transaction
from django.db.models import Q, Sum
from django.utils import timezone
from langgraph.config import get_config
from langgraph.errors import GraphBubbleUp
from langgraph.runtime import Runtime

from aero.text import MAX_MODEL_TEXT, cut_generated
from diagnosis import shutdown
from diagnosis.agent import waits
from diagnosis.agent.providers import Attempt, OpenAICompatibleProvider
from diagnosis.agent.state import AgentContext, AgentState
from diagnosis.eventlog import names
from diagnosis.eventlog.names import (
    AGENT_NODE_COMPLETED,
    AGENT_NODE_FAILED,
    AGENT_NODE_STARTED,
    LLM_CALL,
    LLM_FALLBACK,
    LLM_SKIPPED,
)
from diagnosis.events import (
    EventBatch,
    LeaseLost,
    StepGroup,
    add_usage,
    append_event,
    append_keyed,
    append_step_event,
    current_batch,
    event_batch,
    step_scope,
)
from diagnosis.models import AgentRun, LLMCall


class NodeFn(Protocol):
    def __call__(self, state: Any, runtime: Runtime[AgentContext]) -> dict[str, Any]: ...


class SessionCanceled(Exception):
    pass


def recorded(
    name: str, *, last: bool = False, rows: bool = True, fans_out: bool = False
) -> Callable[[Callable[..., dict[str, Any]]], NodeFn]:
    """Run a node as a child AgentRun with agent.node_* events, and stop if canceled.

    The steps between two waits are one transaction (a StepGroup; one per step
    before): each node's rows and its events (queued, written when the group
    commits, under one lock) commit together or not at all; a crash mid-group leaves
    nothing half-written and a failed step is logged on its own after the steps before
    it commit. The events are keyed by the step's task (StepScope): if the group
    committed but its checkpoint did not, the re-run writes nothing twice. `last`: the
    graph ends after this node, so the group commits when it returns. `rows=False`: the
    node writes no row but its run (it only reads, and queues events) when no model
    reasons for the session: it joins its group without a savepoint (a write would be
    refused). `fans_out`: parallel branches follow this node, so its group commits when
    it returns (see `_branch_context`)."""

    def decorator(fn: Callable[..., dict[str, Any]]) -> NodeFn:
        # No functools.wraps: LangGraph reads the signature to inject `runtime`. The state
        # is the pack's (a TypedDict extending AgentState): LangGraph would give a node
        # annotated with the core's keys only those.
        def wrapper(state: Any, runtime: Runtime[AgentContext]) -> dict[str, Any]:
            if on_job_thread(runtime.context):
                return _record(fn, name, state, runtime, runtime.context, last or fans_out, rows)
            ctx = _branch_context(runtime.context, name)
            try:
                return _record(fn, name, state, runtime, ctx, True, rows)
            finally:
                # LangGraph's pool thread ends with the graph's run: so does its connection.
                connection.close()

        wrapper.__name__ = fn.__name__
        return wrapper

    return decorator


def on_job_thread(ctx: AgentContext) -> bool:
    """Whether this step runs on the job's own thread. LangGraph runs a step of one task
    inline, and the tasks of a step with several (parallel branches) each on a thread of
    its own."""
    return threading.get_ident() == ctx.thread


def _branch_context(shared: AgentContext, name: str) -> AgentContext:
    """A parallel branch's step records with a context of its own: its own group, on its
    thread's connection, committed when the step returns (the next step may run on
    another thread, and no transaction is shared across threads), and its own view of
    the action calls. The job's group must have committed before the branches began:
    the branches' commits would come before the steps that led to them, which they could
    not even read."""
    if shared.group is not None and shared.group.is_open:
        raise RuntimeError(
            f"{name} runs in parallel while the steps before it are uncommitted: record the "
            "node the branches follow with recorded(..., fans_out=True)"
        )
    return replace(
        shared,
        group=StepGroup(shared.session_id),
        actions=None,
        waiting_written=False,
        thread=threading.get_ident(),
    )


def _record(
    fn: Callable[..., dict[str, Any]],
    name: str,
    state: AgentState,
    runtime: Runtime[AgentContext],
    ctx: AgentContext,
    last: bool,
    rows: bool,
) -> dict[str, Any]:
    """A node's step in `ctx`'s group (see `recorded`); `last`: the group commits after it."""
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
            task_key(ctx, name, state),
            _wait_key(runtime, ctx, name, state),
            lean=not rows and group.is_open and not reasons(ctx),
        )
    except waits.ModelWait as wait:
        # The step rolled back, the steps before it commit; it re-runs from its
        # first line once the runner has the reply. The interrupt carries the
        # request; the job records its row after the checkpoint (not with this commit).
        group.commit()
        if ctx.child_job:
            raise  # a child's job ends at the wait and runs the child again after it
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
    # A model call of the step belongs to the agent the step is of (a specialist's run,
    # the job's): the step's own run is rolled back when the call ends it as a wait.
    owner = ctx.parent_run or ctx.root_run
    with (
        waits.wait_scope(ctx.session_id, wait_key, owner.pk if owner else None),
        step_scope(task_key) as scope,
    ):
        try:
            with group.step(savepoint=not lean) as batch:
                run = _start_node(ctx, batch, scope.key(AGENT_NODE_STARTED), name, state)
                with writes_refused(name) if lean else nullcontext():
                    update = fn(state, ctx, run)
                summary = update.pop("_summary", "")
                group.finish_run(run, summary)  # written with the group's commit
                append_step_event(
                    ctx.session_id,
                    AGENT_NODE_COMPLETED,
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
    every step, so each step's events must be written before the next one
    reads them, and a model call may take seconds. Grouping is for the deterministic
    steps that follow each other with nothing to wait for."""
    return any(isinstance(p, OpenAICompatibleProvider) for p in ctx.providers)


def commits_after(ctx: AgentContext, name: str, update: dict[str, Any] | None = None) -> bool:
    """Whether the group commits after this step of a session a model reasons for.

    Model calls inside the step (blocking mode, AERO_LLM_WAITS off) take seconds: every
    step commits, so the session's page shows each one as it ends. With model calls as
    waits no step blocks, and only the reasoning step commits at once: the conversation
    and the budget are rebuilt from the log, and the next reasoning step must
    find this one's `agent.note` there, written before the calls it led to (the
    conversation orders the model's turns and the policy's own calls by time). The steps
    after it (the tools, the compliance check, the next reasoning step up to its model
    wait) are one group, like a session without a model's. A reasoning step
    whose plan is a human wait (approvals, a question) leaves the commit to that wait,
    the very next step: nothing comes between them, and the wait's commit carries the
    move to waiting_user."""
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
            # A lean step's run, never written: written now, as failed.
            run.status, run.ended_at = "failed", timezone.now()
            run.save(force_insert=True)
        elif run is not None:
            AgentRun.objects.filter(pk=run.pk).update(status="failed", ended_at=timezone.now())
        else:
            run = AgentRun.objects.create(
                session_id=ctx.session_id,
                parent=ctx.parent_run or ctx.root_run,
                agent_name=name,
                status="failed",
                ended_at=timezone.now(),
                input_snapshot={"fsm": state.get("fsm", "")},
            )
        append_event(
            ctx.session_id,
            AGENT_NODE_FAILED,
            {"node": name, "run": run.pk, "error": f"{type(exc).__name__}: {exc}"},
            producer=ctx.producer,
            run=run,
        )


def task_key(
    ctx: AgentContext, name: str, state: AgentState | None = None, *, ahead: int = 0
) -> str:
    """The same for a re-run of the task, new for any other. Not LangGraph's task id:
    checkpoints are saved only when the graph exits, so after a crash mid-run the steps
    after the first get new task ids (their checkpoints were never saved). What does not
    change: the checkpoint the run started from (in a child context, the enclosing
    task's key), the step number (counted from the thread's start) and the task's path
    in the step: its node, and for a node sent several times in one step (Send) its
    index. Parallel branches of one step have keys of their own.

    The step number counts the steps an older graph ran on their own and this one runs
    inside another (the state's `steps_merged`, see `merged_step`): a step group that a
    worker of the older graph committed, killed before its checkpoint, is re-run by a
    newer one under the same keys. `ahead`: the key of the step that many after this one
    (a merged step's)."""
    metadata = get_config()["metadata"]
    step = metadata["langgraph_step"] + int((state or {}).get("steps_merged") or 0) + ahead
    key = f"task:{ctx.origin or 'start'}:{step}:{name}"
    path: tuple[Any, ...] = tuple(metadata.get("langgraph_path") or ())
    if len(path) > 1 and isinstance(path[1], int):  # (push, index): a Send's task
        key += f":{path[1]}"
    return key


def _wait_key(
    runtime: Runtime[AgentContext], ctx: AgentContext, name: str, state: AgentState
) -> str:
    """The key of a node's model calls: it must survive the interrupt a model wait ends
    the job with, and `task_key` does not (the resumed run starts from the checkpoint
    saved at that interrupt: a new origin). LangGraph's task id does: the interrupted
    task is pending in that checkpoint and keeps its id when it re-runs on resume."""
    if ctx.child_job:
        return task_key(ctx, name, state)  # no checkpoint: its task ids are new at every run
    info = runtime.execution_info
    if info is not None and info.task_id:
        return f"task:{info.task_id}"
    return task_key(ctx, name, state)


@contextmanager
def merged_step(ctx: AgentContext, name: str, state: AgentState) -> Iterator[dict[str, Any]]:
    """Inside a node's step, the work of the step `name` that an older graph ran on its
    own right after it (the apron agent's compliance check after its tool step): its
    events keyed as that step keyed them, so a step group an older worker committed and
    a newer one re-runs writes nothing twice. Yields the update that counts it in the
    state's `steps_merged`, for the node to return: the steps after it keep their keys
    (see `task_key`)."""
    with step_scope(task_key(ctx, name, state, ahead=1)):
        yield {"steps_merged": int(state.get("steps_merged") or 0) + 1}


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
        "parent": ctx.parent_run or ctx.root_run,
        "agent_name": name,
        "input_snapshot": {"fsm": state.get("fsm", "")},
    }
    # Written with the group's commit, already completed; SQLite: now.
    run = step_group(ctx).new_run(**fields) or AgentRun.objects.create(**fields)
    append_keyed(
        ctx.session_id,
        AGENT_NODE_STARTED,
        key,
        {"node": name, "run": run.pk},
        producer=ctx.producer,
        run=run,
    )
    return run


@contextmanager
def child_run(ctx: AgentContext, name: str, key: str) -> Iterator[AgentContext]:
    """A child agent run (a specialist's) under the steps' current run, recorded like the
    root: its own row, running while the block runs, then completed or failed with its
    end time and what its steps' model calls cost. Yields the context whose steps record
    under it, their keys nested under `key` (the enclosing task's: `task_key`). Found
    again by `key` when the block re-runs (a crash, a retry): never a second row. An
    interrupt or a wait leaves it running: it goes on when it runs again."""
    child = _open_child_run(ctx, name, key)
    try:
        yield child
    except (GraphBubbleUp, waits.ModelWait):
        raise  # it waits: it goes on when it is run again
    except BaseException:
        _end_child_run(child, "failed")
        raise
    else:
        _end_child_run(child, "completed")
    finally:
        if not on_job_thread(ctx):
            connection.close()  # a branch's: its thread ends with the graph's run


def _open_child_run(ctx: AgentContext, name: str, key: str) -> AgentContext:
    """The child's row and its `agent.run_started` event, in one transaction (the event
    batched: one lock, one insert); keyed by the block's key, so a re-run finds both and
    writes neither again. A row made now has no event yet: nothing to look up."""
    with transaction.atomic(), _batched(ctx.session_id):
        run = AgentRun.objects.filter(
            session_id=ctx.session_id, agent_name=name, input_snapshot__key=key
        ).first()
        made = run is None
        if run is None:
            run = AgentRun.objects.create(
                session_id=ctx.session_id,
                parent=ctx.parent_run or ctx.root_run,
                agent_name=name,
                input_snapshot={"key": key},
            )
        # A run that ended stays as its `agent.run_ended` says while the block runs
        # again (its steps are keyed and write nothing twice): no change without an event.
        started = {"run": run.pk, "agent": name, "parent": run.parent_id, "mode": run.mode}
        event_key = f"{key}/run_started"
        if made:
            append_event(
                ctx.session_id,
                names.AGENT_RUN_STARTED,
                started,
                producer=ctx.producer,
                run=run,
                key=event_key,
            )
        else:
            append_keyed(
                ctx.session_id,
                names.AGENT_RUN_STARTED,
                event_key,
                started,
                producer=ctx.producer,
                run=run,
            )
    # One group for the child's steps and the parent's on the job's thread.
    step_group(ctx)
    return replace(ctx, parent_run=run, origin=key, actions=None)


def _batched(session_id: Any) -> Any:
    """A batch for the child's event, unless one queues the session's events already (a
    branch run inline on the job's thread, inside its group): there it keeps its place."""
    return nullcontext() if current_batch(session_id) is not None else event_batch(session_id)


def _end_child_run(child: AgentContext, status: str) -> None:
    """The child's end on its row and as `agent.run_ended` (status, times, what its
    steps' model calls cost), in one transaction (the event batched); a re-run of the
    block ending the same way writes the event once."""
    run = child.parent_run
    assert run is not None
    if run.status == status and run.ended_at is not None:
        return  # ended so before (a re-run of the block): its row and event stand
    used = LLMCall.objects.filter(Q(agent_run=run) | Q(agent_run__parent=run)).aggregate(
        tokens_in=Sum("tokens_in", default=0),
        tokens_out=Sum("tokens_out", default=0),
        cost=Sum("cost", default=Decimal(0)),
    )
    ended_at = timezone.now()
    with transaction.atomic(), _batched(child.session_id):
        AgentRun.objects.filter(pk=run.pk).update(
            status=status,
            ended_at=ended_at,
            output_summary={**used, "cost": str(used["cost"])},
        )
        append_keyed(
            child.session_id,
            names.AGENT_RUN_ENDED,
            f"{child.origin}/run_ended/{status}",
            {
                "run": run.pk,
                "agent": run.agent_name,
                "status": status,
                # the row as the block found or made it: not read again
                "started_at": run.started_at.isoformat(),
                "ended_at": ended_at.isoformat(),
                "tokens_in": used["tokens_in"],
                "tokens_out": used["tokens_out"],
                "cost": str(used["cost"]),
            },
            producer=child.producer,
            run=run,
        )


def call_recorder(ctx: AgentContext, run: AgentRun) -> Callable[[Attempt], None]:
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
        if usage.estimated:
            payload["estimated"] = True  # the provider sent no usage: AERO's estimate
        if attempt.error_class:
            payload["error_class"] = attempt.error_class
        if attempt.breaker:
            payload["breaker"] = attempt.breaker
        if usage.text:
            # The reply's text, as the runner records a streamed one: replay shows it.
            payload["text"], cut_from = cut_generated(usage.text, MAX_MODEL_TEXT)
            if cut_from is not None:
                payload["cut_from_chars"] = cut_from
        with transaction.atomic(savepoint=False):  # inside the step
            _, new = append_step_event(
                ctx.session_id, LLM_CALL, payload, producer=ctx.producer, run=run
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
                tokens_estimated=usage.estimated,
                latency_ms=attempt.latency_ms,
                error=attempt.error,
                error_class=attempt.error_class,
            )
            if usage.tokens_in or usage.tokens_out or usage.cost:
                add_usage(ctx.session_id, usage.tokens_in, usage.tokens_out, usage.cost)
                # That UPDATE holds the session row until the commit: the group ends
                # with this step, so a slow model call in the next one does not keep
                # decisions, cancels and the heartbeat waiting.
                step_group(ctx).end_after_step = True

    return record


def fallback_recorder(ctx: AgentContext, run: AgentRun) -> Callable[[str, str, str], None]:
    def on_fallback(failed: str, next_provider: str, error: str) -> None:
        append_step_event(
            ctx.session_id,
            LLM_FALLBACK,
            {"from": failed, "to": next_provider, "error": error},
            producer=ctx.producer,
            run=run,
        )

    return on_fallback


def skip_recorder(ctx: AgentContext, run: AgentRun) -> Callable[[dict[str, Any]], None]:
    """A provider the chain skipped (its circuit breaker open): `llm.skipped`."""

    def on_skip(payload: dict[str, Any]) -> None:
        append_step_event(ctx.session_id, LLM_SKIPPED, payload, producer=ctx.producer, run=run)

    return on_skip
