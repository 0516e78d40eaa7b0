"""The outbox: how an action's external effect happens exactly once.

1. In the transaction that decides the action (an approver's decision; the agent's step
   for an R0 action) the ToolCall turns `executing`, an Outbox row is written and a
   `tool.call_queued` event logged: the intent is durable before anything leaves.
2. After that commit the executor sends the request to the external system with the
   call's idempotency key (diagnosis/external.py), outside any transaction.
3. The result is recorded once: the ToolCall, the Outbox row and the event in one
   transaction, under the row locks, only while the row is still pending.
   A transient failure is retried (AERO_TOOL_RETRIES, 2, linear AERO_TOOL_BACKOFF s:
   1 s then 2 s, tech plan §5.4), each retry logged; when they run out the call ends
   `failed` with a `tool.call_failed` event saying so, and the report lists it.

A crash between the effect and the recording leaves the row pending: the job re-runs
the step (the reconciler re-enqueues it), the executor sends the same key again, the
external system answers with its stored response without repeating the effect, and the
result is recorded then."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from aero import metrics
from aero.compiled import Arg, Compiled, CompiledUpdate, insert_rows, save_fields
from diagnosis import external
from diagnosis.eventlog.names import TOOL_CALL_QUEUED, TOOL_CALL_RETRYING
from diagnosis.events import append_event, event_batch, lock_session
from diagnosis.execution import execution_problems, refuse_execution
from diagnosis.models import AgentRun, Outbox, OutboxStatus, ToolCall, ToolCallStatus
from diagnosis.toolcalls import (
    ToolContext,
    ToolFailure,
    call_finished,
    call_started,
    request_of,
    result_of,
)

logger = logging.getLogger("diagnosis.outbox")

# Where the executor sleeps between attempts (a seam for tests, which count the delays).
sleep = time.sleep


@dataclass(frozen=True)
class Effect:
    """One request to send: which row, under which key, to whom, with what."""

    outbox_id: int
    tool_call_id: int
    session_id: Any
    key: str
    system: str
    operation: str
    body: dict[str, Any]


def enqueue_effect(
    tool_call: ToolCall, *, producer: str, run: AgentRun | None = None, fresh: bool = False
) -> Outbox | None:
    """Hand an approved (or R0) action to the outbox, in the caller's transaction (the
    caller holds the call row's lock): the call turns `executing`, its row and its
    `tool.call_queued` event commit with the decision. Returns the pending row (None when
    an earlier row already ended: a completed effect is never queued again). `fresh`:
    the call was awaiting its decision until now, so it has no row yet."""
    existing = None if fresh else Outbox.objects.filter(tool_call=tool_call).first()
    if existing is not None:
        return existing if existing.status == OutboxStatus.PENDING else None
    # The INSERT and the UPDATE with their SQL built once per connection (Django's
    # create() and save() compiled both anew each time, on every R0 action's path).
    (outbox,) = insert_rows(
        Outbox,
        [
            Outbox(
                tool_call=tool_call,
                session_id=tool_call.session_id,
                idempotency_key=tool_call.idempotency_key,
            )
        ],
    )
    tool_call.status = ToolCallStatus.EXECUTING
    save_fields(tool_call, ["status"])
    append_event(
        tool_call.session_id,
        TOOL_CALL_QUEUED,
        {
            "tool_call": tool_call.pk,
            "call_id": tool_call.call_id,
            "tool_name": tool_call.tool_name,
            "args": tool_call.request_payload,
            "risk_level": tool_call.risk_class,
            "outbox": outbox.pk,
            "idempotency_key": outbox.idempotency_key,
        },
        producer=producer,
        run=run,
    )
    return outbox


def prepare(
    ctx: ToolContext, outbox: Outbox, tool_call: ToolCall, *, checked: bool = False
) -> Effect | None:
    """The first attempt of this run, in the caller's transaction (rows locked): the
    policy checked again where the action executes (rows may have changed since the
    decision; `checked`: the caller just did), the request built, the attempt
    logged. None when the call ended here (refused, or a request no system could
    accept)."""

    problems = [] if checked else execution_problems(tool_call)
    if problems:
        refuse_execution(tool_call, problems, producer=ctx.producer, run=ctx.run)
        _close(outbox, OutboxStatus.REFUSED, tool_call)
        return None
    try:
        system, operation, body = request_of(ctx, tool_call)
    except ToolFailure as exc:  # no retry can make this request acceptable
        _record_failure(ctx, outbox, tool_call, time.monotonic(), str(exc))
        return None
    call_started(ctx, tool_call)
    return Effect(
        outbox.pk,
        tool_call.pk,
        tool_call.session_id,
        outbox.idempotency_key,
        system,
        operation,
        body,
    )


def execute_after_commit(ctx: ToolContext, effect: Effect) -> None:
    """Send the request once the caller's transaction commits (never inside it)."""
    transaction.on_commit(lambda: execute(ctx, effect))


def execute(ctx: ToolContext, effect: Effect) -> str:
    """Send a prepared request, retrying transient failures with the same key, and
    record the result once; returns the row's final status. Never raises for a failed
    effect: the failure is recorded."""

    retries = settings.AERO_TOOL_RETRIES
    attempt = 1
    while True:
        started = time.monotonic()
        try:
            remote = external.request(effect.system, effect.operation, effect.key, effect.body)
        except Exception as exc:  # unreachable, 5xx, timeout: the same key may be re-sent
            error = str(exc) or type(exc).__name__
            with transaction.atomic(), event_batch(effect.session_id):
                outbox, tool_call = _lock(effect.session_id, effect.outbox_id)
                if outbox.status != OutboxStatus.PENDING:
                    return outbox.status
                if attempt > retries:
                    metrics.outbox_attempt("failed")
                    message = f"gave up after {attempt} attempts: {error}"
                    return _record_failure(ctx, outbox, tool_call, started, message)
                delay = settings.AERO_TOOL_BACKOFF * attempt
                record_retry(
                    outbox, tool_call, attempt, error, delay, producer=ctx.producer, run=ctx.run
                )
            metrics.outbox_attempt("retry")
            sleep(delay)
            attempt += 1
            with transaction.atomic(), event_batch(effect.session_id):
                outbox, tool_call = _lock(effect.session_id, effect.outbox_id)
                if outbox.status != OutboxStatus.PENDING:
                    return outbox.status
                call_started(ctx, tool_call)
            continue
        metrics.outbox_attempt("ok")
        return record_success(ctx, effect, remote, started)


# Once per action executed: compiled once per connection.
_claim_done = CompiledUpdate(
    Outbox,
    lambda: Outbox.objects.filter(pk=Arg(0), status=OutboxStatus.PENDING),
    {
        "status": OutboxStatus.DONE,
        "last_error": "",
        "completed_at": Arg(1, Outbox._meta.get_field("completed_at")),
    },
)
_tool_call = Compiled(ToolCall, lambda: ToolCall.objects.filter(pk=Arg(0)))


def record_success(ctx: ToolContext, effect: Effect, remote: dict[str, Any], started: float) -> str:
    """The external system accepted the request: the call completes, with its event and
    the rows it puts in force, in one transaction; once."""

    # The session row first (docs/lock-order.md): the job and the decisions take it
    # before a call's row too. Then claimed by a conditional UPDATE (its row lock lasts
    # until the commit): of two executors of one effect only one records it.
    with (
        transaction.atomic(),
        event_batch(effect.session_id, locked=lock_session(effect.session_id)),
    ):
        at = timezone.now()  # the row's completion time is its call's
        claimed = _claim_done.run(effect.outbox_id, at)
        if not claimed:
            return str(Outbox.objects.values_list("status", flat=True).get(pk=effect.outbox_id))
        tool_call = _tool_call.get(effect.tool_call_id)
        outbox = Outbox(
            pk=effect.outbox_id,
            tool_call=tool_call,
            session_id=effect.session_id,
            idempotency_key=effect.key,
        )
        try:
            response = result_of(ctx, tool_call, remote)
        except ToolFailure as exc:
            return _record_failure(ctx, outbox, tool_call, started, str(exc))
        call_finished(ctx, tool_call, started, response=response, at=at)
    return OutboxStatus.DONE


def _lock(session_id: Any, outbox_id: int) -> tuple[Outbox, ToolCall]:
    """Lock the session row, then the outbox row (every executor of this effect goes
    through it; docs/lock-order.md) and read its call with it."""
    lock_session(session_id)
    outbox = (
        Outbox.objects.select_for_update(of=("self",)).select_related("tool_call").get(pk=outbox_id)
    )
    return outbox, outbox.tool_call


def record_retry(
    outbox: Outbox,
    tool_call: ToolCall,
    attempt: int,
    error: str,
    delay: float,
    *,
    producer: str,
    run: AgentRun | None = None,
) -> None:
    """A failed attempt that will be retried: on the row and in the log (the caller holds
    the row's lock). Shared by the agent's actions and the approvers' lifts."""
    outbox.last_error = error
    outbox.save(update_fields=["last_error"])
    append_event(
        tool_call.session_id,
        TOOL_CALL_RETRYING,
        {
            "tool_call": tool_call.pk,
            "call_id": tool_call.call_id,
            "tool_name": tool_call.tool_name,
            "attempt": attempt,
            "error": error,
            "retry_in": delay,
        },
        producer=producer,
        run=run,
    )
    logger.warning(
        "%s (%s): attempt %d failed (%s); retrying in %g s",
        tool_call.tool_name,
        outbox.idempotency_key,
        attempt,
        error,
        delay,
    )


def _record_failure(
    ctx: ToolContext, outbox: Outbox, tool_call: ToolCall, started: float, error: str
) -> str:
    """The call ends failed (its event says why); the caller holds the row locks."""

    call_finished(ctx, tool_call, started, error=error)
    _close(outbox, OutboxStatus.FAILED, tool_call)
    logger.error("%s (%s) failed: %s", tool_call.tool_name, outbox.idempotency_key, error)
    return outbox.status


def _close(outbox: Outbox, status: str, tool_call: ToolCall) -> None:
    """The row ends as its call did (the same error and time, as the fold has it)."""
    outbox.status = status
    outbox.last_error = tool_call.error
    outbox.completed_at = tool_call.completed_at or timezone.now()
    outbox.save(update_fields=["status", "last_error", "completed_at"])
