"""The outbox: how an action's external effect happens exactly once (ADR 110).

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
from functools import partial
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from aero import metrics
from diagnosis import external
from diagnosis.events import append_event
from diagnosis.execution import execution_problems, refuse_execution
from diagnosis.models import AgentRun, Outbox, OutboxStatus, ToolCall, ToolCallStatus

if TYPE_CHECKING:
    from diagnosis.agent.tools import ToolContext

logger = logging.getLogger("diagnosis.outbox")

# Where the executor sleeps between attempts (a seam for tests, which count the delays).
sleep = time.sleep


def enqueue_effect(
    tool_call: ToolCall, *, producer: str, run: AgentRun | None = None
) -> Outbox | None:
    """Hand an approved (or R0) action to the outbox, in the caller's transaction (the
    caller holds the call row's lock). The policy is checked here first: a refused call
    ends `refused` and gets no row. Returns the pending row, or None when refused."""
    problems = execution_problems(tool_call)
    if problems:
        refuse_execution(tool_call, problems, producer=producer, run=run)
        return None
    outbox, created = Outbox.objects.get_or_create(
        tool_call=tool_call,
        defaults={"session_id": tool_call.session_id, "idempotency_key": tool_call.idempotency_key},
    )
    if not created:
        return outbox if outbox.status == OutboxStatus.PENDING else None
    tool_call.status = ToolCallStatus.EXECUTING
    tool_call.save(update_fields=["status"])
    append_event(
        tool_call.session_id,
        "tool.call_queued",
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


def execute_after_commit(ctx: ToolContext, outbox_id: int) -> None:
    """Run the executor once the caller's transaction commits (never inside it)."""
    transaction.on_commit(partial(execute, ctx, outbox_id))


def execute(ctx: ToolContext, outbox_id: int) -> str:
    """Perform the effect of a pending outbox row and record its result once; returns the
    row's final status. Never raises for a failed effect: the failure is recorded."""
    from diagnosis.agent.tools import ToolFailure, action_request

    retries = settings.AERO_TOOL_RETRIES
    for attempt in range(1, retries + 2):
        with transaction.atomic():
            outbox, tool_call = _lock(outbox_id)
            if outbox.status != OutboxStatus.PENDING:
                return outbox.status  # recorded before (a re-run): never again
            if attempt == 1:
                # Checked again where it executes: rows may have changed since the
                # decision (ADR 40).
                problems = execution_problems(tool_call)
                if problems:
                    refuse_execution(tool_call, problems, producer=ctx.producer, run=ctx.run)
                    _close(outbox, OutboxStatus.REFUSED, tool_call)
                    return outbox.status
            try:
                system, operation, body = action_request(ctx, tool_call)
            except ToolFailure as exc:  # the request itself is wrong: no retry helps
                return _record_failure(ctx, outbox, tool_call, time.monotonic(), str(exc))
            _attempt_started(ctx, outbox, tool_call)
        started = time.monotonic()
        try:
            remote = external.request(system, operation, outbox.idempotency_key, body)
        except Exception as exc:  # unreachable, 5xx, timeout: the same key may be re-sent
            error = str(exc) or type(exc).__name__
            if attempt > retries:
                metrics.outbox_attempt("failed")
                with transaction.atomic():
                    outbox, tool_call = _lock(outbox_id)
                    if outbox.status != OutboxStatus.PENDING:
                        return outbox.status
                    return _record_failure(
                        ctx,
                        outbox,
                        tool_call,
                        started,
                        f"gave up after {attempt} attempts: {error}",
                    )
            metrics.outbox_attempt("retry")
            delay = settings.AERO_TOOL_BACKOFF * attempt
            _record_retry(ctx, outbox_id, attempt, error, delay)
            sleep(delay)
            continue
        metrics.outbox_attempt("ok")
        return record_success(ctx, outbox_id, remote, started)
    raise AssertionError("unreachable: the last attempt records a result")


def record_success(ctx: ToolContext, outbox_id: int, remote: dict[str, Any], started: float) -> str:
    """The external system accepted the request: the call completes, with its event and
    the rows it puts in force, in one transaction; once."""
    from diagnosis.agent.tools import ToolFailure, _finished, action_result

    with transaction.atomic():
        outbox, tool_call = _lock(outbox_id)
        if outbox.status != OutboxStatus.PENDING:
            return outbox.status
        try:
            response = action_result(ctx, tool_call, remote)
        except ToolFailure as exc:
            return _record_failure(ctx, outbox, tool_call, started, str(exc))
        _finished(ctx, tool_call, started, response=response)
        _close(outbox, OutboxStatus.DONE, tool_call)
    return outbox.status


def _lock(outbox_id: int) -> tuple[Outbox, ToolCall]:
    outbox = Outbox.objects.select_for_update().get(pk=outbox_id)
    tool_call = ToolCall.objects.select_for_update().get(pk=outbox.tool_call_id)
    return outbox, tool_call


def _attempt_started(ctx: ToolContext, outbox: Outbox, tool_call: ToolCall) -> None:
    from diagnosis.agent.tools import _started

    outbox.attempts += 1
    outbox.save(update_fields=["attempts"])
    _started(ctx, tool_call)


def _record_retry(ctx: ToolContext, outbox_id: int, attempt: int, error: str, delay: float) -> None:
    with transaction.atomic():
        outbox, tool_call = _lock(outbox_id)
        outbox.last_error = error
        outbox.save(update_fields=["last_error"])
        append_event(
            tool_call.session_id,
            "tool.call_retrying",
            {
                "tool_call": tool_call.pk,
                "call_id": tool_call.call_id,
                "tool_name": tool_call.tool_name,
                "attempt": attempt,
                "error": error,
                "retry_in": delay,
            },
            producer=ctx.producer,
            run=ctx.run,
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
    from diagnosis.agent.tools import _finished

    _finished(ctx, tool_call, started, error=error)
    _close(outbox, OutboxStatus.FAILED, tool_call)
    logger.error("%s (%s) failed: %s", tool_call.tool_name, outbox.idempotency_key, error)
    return outbox.status


def _close(outbox: Outbox, status: str, tool_call: ToolCall) -> None:
    """The row ends as its call did (the same error and time, as the fold has it)."""
    outbox.status = status
    outbox.last_error = tool_call.error
    outbox.completed_at = tool_call.completed_at or timezone.now()
    outbox.save(update_fields=["status", "last_error", "completed_at"])
