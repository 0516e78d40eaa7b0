"""The job: advance one session until the graph ends or interrupts, then return; it never
waits for a human. It holds the session's lease (diagnosis.jobs.lease) and every write it
makes is fenced by it; a decision or an answer enqueues another job that resumes the
graph (diagnosis.jobs.enqueue)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists
from django.utils import timezone
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.types import INTERRUPT
from langgraph.errors import GraphRecursionError
from langgraph.types import Command

from aero import metrics
from aero.compiled import AnyOf, Arg, Compiled
from aero.packs import installed_packs
from diagnosis import shutdown
from diagnosis.agent import waits
from diagnosis.agent.clients import warm_up
from diagnosis.agent.providers import configured_providers
from diagnosis.agent.recording import SessionCanceled, step_group
from diagnosis.agent.slow_tools import REQUEST_WAIT_KINDS
from diagnosis.agent.state import AgentContext
from diagnosis.eventlog.names import USER_MESSAGE
from diagnosis.events import (
    LeaseLost,
    active_fence,
    fenced,
    known_keys,
    set_status,
    tracing,
    unfenced,
)
from diagnosis.jobs.checkpoints import agent_graph, exit_writes
from diagnosis.jobs.child_jobs import record_wait
from diagnosis.jobs.graph_executor import on_this_thread
from diagnosis.jobs.lease import (
    ROOT_AGENT,
    Heartbeat,
    RootEnd,
    release_lease,
    root_snapshot,
    take_lease,
)
from diagnosis.jobs.model_requests import request_answered
from diagnosis.jobs.world import definition_of, initial_state, world_of
from diagnosis.models import (
    ENDED_STATUSES,
    AgentRun,
    Event,
    Session,
    SessionStatus,
    ToolCall,
    ToolCallStatus,
)

logger = logging.getLogger("diagnosis.jobs")


PRODUCER = "agent"
RECURSION_LIMIT = 200
# What a job returns when the session waits for the model: the session stays
# "running" (the agent is thinking) and holds no lease; the runner enqueues it.
WAITING_MODEL = "waiting_model"


def warm_up_worker() -> None:
    """What a worker's first job would otherwise pay, paid before the worker says it is
    up: the model clients, the agent graph compiled with its
    checkpointer connection (the saver's migration check under its advisory lock, and
    the wait for a worker starting beside it), and the active airport graph: otherwise
    a worker's first job costs several times a later one, with every session queued
    behind it. A database not ready yet (a worker
    started before the migrations) warms nothing more: the first job builds them."""
    warm_up()
    try:
        for pack in installed_packs():
            if pack.graph is not None:
                agent_graph(pack.kind)
                world_of(pack.kind)
    except Exception:  # psycopg's own errors too (the checkpointer's connection)
        logger.warning("warm-up: the agent or its world is not ready yet", exc_info=True)


@metrics.timed_job
def advance_session(session_id: str) -> str:
    """Advance the session as far as the inputs in the database allow. Idempotent: a
    duplicate or late job finds nothing to do. Returns the status it left, "busy" when
    another job holds the lease, "lease_lost" when this job lost it midway (it stopped
    and wrote nothing after), "stopped" when its worker is shutting down."""
    while True:
        if shutdown.stopping():
            return "stopped"  # the reconciler gives the session to a running worker
        taken = take_lease(session_id, root=root_snapshot())
        if taken is None:
            return "busy"  # another job holds it; it re-checks inputs before it lets go
        token, leased = taken
        finished: list[RootEnd] = []  # the root run, ended with the lease
        try:
            with (
                Heartbeat(session_id, token),
                fenced(session_id, token) as fence,
                known_keys(session_id),
                waits.answered_requests(),
            ):
                fence.row = leased  # the row as the lease left it: the first group's to write
                status, waiting = _advance_locked(session_id, token, leased, finished)
        except LeaseLost as exc:
            logger.warning("session %s: stopped, another job took over (%s)", session_id, exc)
            return "lease_lost"
        except shutdown.WorkerStopping:
            logger.info("session %s: worker stopping, lease released", session_id)
            return "stopped"
        finally:
            release_lease(session_id, token, finished[0] if finished else None)
        # An answer or decision that arrived while we held the lease found us busy:
        # its job returned "busy", so this job takes the new input.
        if status not in (SessionStatus.WAITING_USER, WAITING_MODEL):
            return status
        if not resumable(session_id, waiting):
            return status


def resumable(session_id: Any, waiting: Any = None) -> bool:
    """Whether an input the job's wait is for arrived while the job held the lease (its
    job found the lease live and did not enqueue). `waiting`: the state the job stopped
    in (`_advance_locked` read it under the lease; nothing else advanced the graph), so
    no second read of the checkpoint. For a model wait, whether its reply is stored: one
    query. If the state moved on meanwhile (another job), the loop's next job
    reads the checkpoint again and finds nothing to do."""
    if isinstance(waiting, dict) and waiting.get("kind") in REQUEST_WAIT_KINDS:
        return request_answered(waiting)
    if waiting is None:
        session = Session.objects.get(pk=session_id)
        if session.is_ended:
            return False
        waiting = agent_graph(definition_of(session)["kind"]).get_state(_config(session_id))
    return resume_value(session_id, waiting) is not None


def _config(session_id: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": str(session_id)}, "recursion_limit": RECURSION_LIMIT}


# Read by every job that ends at its approvals (and each job a decision starts):
# compiled once per connection.
_decided_or_corrected = Compiled(
    Session,
    lambda: (
        Session.objects.filter(pk=Arg(0, Session._meta.pk))
        .annotate(
            decided=Exists(
                ToolCall.objects.filter(AnyOf("pk", 1)).exclude(
                    status=ToolCallStatus.AWAITING_APPROVAL
                )
            ),
            corrected=Exists(
                Event.objects.filter(
                    session_id=Arg(0, Event._meta.get_field("session")),
                    type=USER_MESSAGE,
                    seq__gt=Arg(2, Event._meta.get_field("seq")),
                )
            ),
        )
        .values_list("decided", "corrected")[:1]
    ),
)


def resume_value(session_id: Any, snapshot: Any) -> Any:
    """What to resume an interrupted graph with, or None while it must keep waiting."""
    if not snapshot.interrupts:
        return None
    waiting = snapshot.interrupts[0].value
    if waiting["kind"] == "question":
        consumed = snapshot.values.get("consumed_seq", 0)
        has_answer = Event.objects.filter(
            session_id=session_id, type=USER_MESSAGE, seq__gt=consumed
        ).exists()
        return {"answered": True} if has_answer else None
    if waiting["kind"] == "approval":
        # A decision, or a fact corrected while the approvals wait: one query.
        consumed = snapshot.values.get("consumed_seq", 0)
        found = _decided_or_corrected.first(session_id, list(waiting["tool_calls"]), consumed)
        if found and found[0]:
            return {"decided": True}
        return {"corrected": True} if found and found[1] else None
    if waiting["kind"] in REQUEST_WAIT_KINDS:  # a model call or a slow tool: its row
        return {"model": waiting["key"]} if request_answered(waiting, session_id) else None
    return None


def _advance_locked(
    session_id: str,
    token: uuid.UUID,
    leased: Session | None = None,
    finished: list[RootEnd] | None = None,
) -> tuple[str, Any]:
    """The job under the lease. Returns the status it left and, at a wait, what it waits
    for (the model wait's interrupt value, or the state snapshot of a human wait).
    `finished`: takes the root run's end, for the caller to write with the lease's
    release; without it, the end is written here."""
    # `leased`: the row as taking the lease returned it (nothing else moves it but a
    # cancel, which the fence notices).
    session = leased or Session.objects.get(pk=session_id)
    if session.is_ended:
        return session.status, None
    definition = definition_of(session)
    root_id = getattr(session, "root_id", None)
    if root_id is not None:
        # The root run was inserted and the world's and the provider configs' stamps
        # read with the lease: nothing else to read when neither changed.
        root = AgentRun(pk=root_id, session=session, agent_name=ROOT_AGENT)
        root._state.adding = False
        world = world_of(definition["kind"], getattr(session, "world_stamp", None))
        providers = configured_providers(getattr(session, "providers_stamp", None))
    else:
        # What the job reads to start, and its root run: one transaction.
        with transaction.atomic():
            root = AgentRun.objects.create(
                session=session,
                agent_name=ROOT_AGENT,
                mode=(session.snapshot or {}).get("run_mode", {}).get("mode") or "react",
                input_snapshot={"status": session.status, **root_snapshot(token)},
            )
            world, providers = world_of(definition["kind"]), configured_providers()
    with tracing():
        graph = agent_graph(definition["kind"])
        config = _config(session_id)
        context = AgentContext(
            session_id=session.pk,
            definition=definition,
            graph=world,
            providers=providers,
            root_run=root,
            producer=PRODUCER,
        )
        outcome, waiting = _drive(session, graph, config, context, token)
        end = {
            "status": "completed" if outcome != SessionStatus.FAILED else "failed",
            "ended_at": timezone.now(),
            "output_summary": {"status": outcome},
        }
        ended: RootEnd = (root.pk, None if outcome in ENDED_STATUSES else token, end)
        if finished is not None:
            finished.append(ended)
        else:
            runs = AgentRun.objects.filter(pk=root.pk)
            if outcome not in ENDED_STATUSES:
                runs = runs.filter(session__lease_token=token)
            runs.update(**end)
        with unfenced():  # the session may have ended: its lease is cleared
            if outcome == SessionStatus.COMPLETED:
                graph.checkpointer.delete_thread(str(session_id))  # the log is the history
            # A waiting session's older checkpoints are not pruned here: a prune's
            # statements would be on the path of every session queued behind it; the
            # maintenance loop prunes the threads that have waited a while
            # (prune_waiting_checkpoints).
        return outcome, waiting


def _drive(
    session: Session, graph: Any, config: RunnableConfig, context: AgentContext, token: uuid.UUID
) -> tuple[str, Any]:
    """Run the graph until it ends or waits. Returns the status and, at a wait, what it
    waits for (see _advance_locked)."""
    attempts = 0
    # The status as this job knows it: only this job (the lease holder) moves it, but
    # for its end (a cancel, noticed by the fence), so an unchanged status is not asked
    # for again under a row lock (a model wait leaves the session running).
    status = session.status
    snapshot: Any = first_state(graph, config)
    while True:
        if not snapshot.values:
            graph_input: Any = initial_state(session, context.definition)
        elif snapshot.interrupts:
            waiting = snapshot.interrupts[0].value
            value = resume_value(session.pk, snapshot)
            if value is None and waiting["kind"] in REQUEST_WAIT_KINDS:
                # Its request row may be missing (a job killed between its checkpoint and
                # the row): recorded here, once by key. An answered request has its row
                # (the usual resume: nothing to record). The job ends and frees
                # its worker; the runner makes the call.
                record_wait(session.pk, waiting)
                return WAITING_MODEL, waiting
            if value is None:
                set_status(session.pk, SessionStatus.WAITING_USER, producer=PRODUCER, strict=False)
                return SessionStatus.WAITING_USER, snapshot
            graph_input = Command(resume=value)
        elif snapshot.next or snapshot.tasks:
            # A crashed run: continue from the last checkpoint. `next` leaves out tasks
            # whose writes were saved before the crash (the next checkpoint was not), so
            # a run killed between the two has an empty `next` but pending `tasks`: it
            # is not finished (the fault suite caught such a session "completed" with
            # its approved actions never executed).
            graph_input = None
        else:
            set_status(session.pk, SessionStatus.COMPLETED, producer=PRODUCER, strict=False)
            return SessionStatus.COMPLETED, None
        if status != SessionStatus.RUNNING:
            # Written as the first event of the first step group, not on its own.
            step_group(context).defer_status(status, SessionStatus.RUNNING, PRODUCER)
            status = SessionStatus.RUNNING
        context.origin = str(snapshot.config["configurable"].get("checkpoint_id") or "")
        try:
            # Checkpointed when the graph exits (an interrupt, the end, an error), not
            # after every step: the events are the history, and a step's keys do not
            # depend on its checkpoint.
            fence = active_fence()
            if fence is not None:
                fence.steps_lost = False  # this run's checkpoint may be saved again
            context.waiting_written = False
            try:
                # Its checkpoint writes on this thread too (no thread pool), the exit's
                # checkpoint and pending writes in one transaction.
                with on_this_thread(), exit_writes(graph.checkpointer):
                    result = graph.invoke(graph_input, config, context=context, durability="exit")
            finally:
                # Steps commit before anything that ends the run; an error
                # LangGraph raises between two steps (the recursion limit) leaves their
                # group open: what they did happened, and their checkpoint was saved.
                if context.group is not None:
                    context.group.commit()
        except SessionCanceled:
            return SessionStatus.CANCELED, None
        except LeaseLost:
            # Canceling a session clears its lease: the step that noticed (its write was
            # refused) and the exit checkpoint wrote nothing. Otherwise another job took
            # over: not the step's failure, this job stops.
            if Session.objects.filter(pk=session.pk, status=SessionStatus.CANCELED).exists():
                return SessionStatus.CANCELED, None
            raise
        except shutdown.WorkerStopping:
            raise  # not the step's failure: this job stops, the next one carries on
        except GraphRecursionError as exc:
            _fail(session.pk, f"the agent made no progress: {exc}")
            return SessionStatus.FAILED, None
        except Exception as exc:
            if context.group is not None:
                context.group.write_status()  # before the retry's move, as it was
            attempts += 1
            reason = f"{type(exc).__name__}: {exc}"
            logger.exception("session %s: agent step failed (attempt %s)", session.pk, attempts)
            if attempts >= settings.AERO_JOB_ATTEMPTS:
                _fail(session.pk, reason)
                return SessionStatus.FAILED, None
            set_status(
                session.pk, SessionStatus.RETRYING, producer=PRODUCER, reason=reason, strict=False
            )
            status = SessionStatus.RETRYING
            # Linear backoff, then resume from the last checkpoint.
            time.sleep(min(4.0, settings.AERO_JOB_BACKOFF * attempts))
            snapshot = graph.get_state(config)
            continue
        if context.group is not None:
            context.group.write_status()  # no step group carried it
        model_wait = _model_interrupt(result)
        if model_wait is not None:
            # The graph stopped at a model call: its request is in the invoke's
            # own result, so the state is not read again; the job records the request
            # once the checkpoint that waits for it is saved and ends. A reply
            # stored meanwhile is seen by advance_session's re-check.
            record_wait(session.pk, model_wait)
            return WAITING_MODEL, model_wait
        if context.waiting_written and _interrupt_value(result) is not None:
            # A human wait: its group wrote the move to waiting_user. What it
            # waits for is in the invoke's result: the state is not read again, and an
            # input that came meanwhile is seen by advance_session's re-check.
            return SessionStatus.WAITING_USER, Stopped(result)
        snapshot = graph.get_state(config)


def first_state(graph: Any, config: RunnableConfig) -> Any:
    """The state a job starts from. A new session's (no checkpoint yet), or a run waiting
    for the model or a slow tool, as almost every job that resumes is: read from the
    checkpoint tuple, its wait from the pending writes, without a state snapshot
    (LangGraph's `get_state` prepares every next task for execution, ~0.3 ms a job, and
    the run prepares them again). Otherwise the snapshot. The checkpoint is read once
    either way: the saver keeps the read for the run."""
    saver = graph.checkpointer
    if not hasattr(saver, "keep"):
        return graph.get_state(config)  # SQLite: no read kept for the run
    saved = saver.get_tuple(config)
    state = SavedState.of(saved, config)
    if state is not None:
        return state
    snapshot = graph.get_state(config)  # hands over the kept read: no second query
    saver.keep(config, saved)  # for the run's own read, as before
    return snapshot


class SavedState:
    """What `_drive` reads of a state snapshot (values, interrupts, next, tasks, config)
    for a thread with no checkpoint or a run interrupted at a request wait."""

    def __init__(self, values: Any, interrupts: tuple[Any, ...], config: Any) -> None:
        self.values = values
        self.interrupts = interrupts
        self.config = config
        self.next: tuple[str, ...] = ()
        self.tasks: tuple[Any, ...] = ()

    @classmethod
    def of(cls, saved: Any, config: Any) -> SavedState | None:
        """The state if `saved` is none, or its pending writes say exactly this: one
        task interrupted, at a request wait, nothing else written (no output, error,
        answer or input); else None (the caller asks LangGraph). A task's interrupt is
        pending while it has no output write (langgraph.pregel._task_status)."""
        if saved is None:
            return cls({}, (), config)
        values = saved.checkpoint.get("channel_values")
        writes = saved.pending_writes or []
        if not values or len(writes) != 1 or writes[0][1] != INTERRUPT:
            return None
        interrupts = writes[0][2]
        if not isinstance(interrupts, Sequence):
            interrupts = [interrupts]
        if len(interrupts) != 1:
            return None
        value = getattr(interrupts[0], "value", None)
        if not isinstance(value, dict) or value.get("kind") not in REQUEST_WAIT_KINDS:
            return None
        return cls(values, (interrupts[0],), saved.config)


def _interrupt_value(result: Any) -> dict[str, Any] | None:
    """What the graph run stopped at, from invoke()'s result (its values carry
    `__interrupt__` when the run was interrupted), or None."""
    if not isinstance(result, dict):
        return None
    interrupts = result.get("__interrupt__") or ()
    if not interrupts:
        return None
    value = getattr(interrupts[0], "value", None)
    return value if isinstance(value, dict) else None


def _model_interrupt(result: Any) -> dict[str, Any] | None:
    """The model (or slow tool) wait the graph run stopped at, or None."""
    value = _interrupt_value(result)
    return value if value is not None and value.get("kind") in REQUEST_WAIT_KINDS else None


class Stopped:
    """The state a run stopped in, from invoke()'s result: what `resume_value` reads of
    a state snapshot (the interrupts and the values), without reading the checkpoint."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.interrupts = tuple(result["__interrupt__"])
        self.values = {k: v for k, v in result.items() if k != "__interrupt__"}


def _fail(session_id: Any, reason: str) -> None:
    set_status(session_id, SessionStatus.FAILED, producer=PRODUCER, reason=reason, strict=False)
