"""Tools the agent calls. Deterministic tools never call an LLM. Every call is a ToolCall
keyed by an idempotency key (session + call id): a completed call is reused, never re-run."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models.constants import OnConflict
from django.db.models.sql import InsertQuery
from django.utils import timezone

from aero.compiled import AnyOf, Compiled, insert_rows
from aero.packs import LookupTool, action_tool, argument_words
from diagnosis import restrictions
from diagnosis.events import lock_session
from diagnosis.execution import execution_problems, refuse_execution
from diagnosis.models import (
    Outbox,
    OutboxStatus,
    ToolCall,
    ToolCallStatus,
)
from diagnosis.outbox import enqueue_effect, execute_after_commit, prepare
from diagnosis.toolcalls import (
    FAILURES,
    ToolContext,
    ToolFailure,
    call_finished,
    call_started,
    failure,
    finished_event,
    idempotency_key,
)


def get_or_create_call(
    ctx: ToolContext,
    call: dict[str, Any],
    status: str,
    attempts: int = 0,
    *,
    fresh: bool = False,
) -> tuple[ToolCall, bool]:
    """Not QuerySet.get_or_create, whose savepoint guards against a concurrent insert:
    only the job holding the session's lease creates its calls, inside its step's
    transaction, and a duplicate key would fail the whole step anyway (unique index).
    `attempts`: a call created to run at once is inserted as started (no UPDATE).
    `fresh`: the caller read the session's calls in this step's transaction and this one
    is not among them, so it is created without the lookup."""
    if not fresh:
        key = idempotency_key(ctx.session_id, call["call_id"])
        existing = ToolCall.objects.filter(idempotency_key=key).first()
        if existing is not None:
            return existing, False
    created = new_call(ctx, call, status, attempts)
    created.save(force_insert=True)
    return created, True


def new_call(ctx: ToolContext, call: dict[str, Any], status: str, attempts: int = 0) -> ToolCall:
    """The row of a call about to be made, not saved yet."""
    return ToolCall(
        idempotency_key=idempotency_key(ctx.session_id, call["call_id"]),
        session_id=ctx.session_id,
        agent_run=ctx.run,
        call_id=call["call_id"],
        tool_name=call["tool"],
        risk_class=call.get("risk_class", "R0"),
        is_action=call.get("is_action", False),
        request_payload=call.get("args", {}),
        status=status,
        position=call.get("position", 0),
        attempts=attempts,
    )


# --- enrichment lookups (parallel, each with its own timeout) -----------------------


# The world the lookups read: the job's (ToolContext.graph, built once per process and
# checked against the stamp the lease read when the job starts), set by run_enrichment;
# None outside a step (a lookup then loads its pack's active world itself).
_lookup_world: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "aero_lookup_world", default=None
)


def lookup_world() -> Any:
    """The world of the step running the lookups; None outside one."""
    return _lookup_world.get()


# The lookups of the installed packs (aero.packs.LookupTool), by name: what each runs,
# and where its answer lands in the enrichment (report templates use these names).
ENRICHMENT_SOURCES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
ENRICHMENT_KEYS: dict[str, str] = {}
# The sources that read this database run in the job's own thread (a thread each cost
# more than the lookup). Any other source (a remote service, a test double) runs in a
# thread so its timeout holds.
IN_PROCESS_SOURCES: set[Callable[[dict[str, Any]], dict[str, Any]]] = set()


def register_lookups(lookups: Mapping[str, LookupTool], failures: Mapping[str, Any]) -> None:
    """A pack's lookups and its failure texts (from its AppConfig.ready())."""
    for name, lookup in lookups.items():
        ENRICHMENT_SOURCES[name] = lookup.run
        ENRICHMENT_KEYS[name] = lookup.key
        if lookup.in_process:
            IN_PROCESS_SOURCES.add(lookup.run)
    for code, text in failures.items():
        FAILURES.setdefault(code, text)


def _in_thread(
    source: Callable[[dict[str, Any]], dict[str, Any]], args: dict[str, Any]
) -> dict[str, Any]:
    try:
        return source(args)
    finally:
        # Worker threads open their own database connections: close them here.
        connections.close_all()


def run_enrichment(ctx: ToolContext, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Run the lookups: in-process ones inline, remote ones in parallel threads under
    AERO_ENRICHMENT_TIMEOUT. A failing or slow source is recorded and degrades: the result
    lists it under `degraded` and the agent goes on without it."""
    token = _lookup_world.set(ctx.graph)
    try:
        return _run_enrichment(ctx, calls)
    finally:
        _lookup_world.reset(token)


# Read at every enrichment step: compiled once per connection; the keys go as
# one array, so the SQL is the same whatever their number.
_calls_made = Compiled(
    ToolCall,
    lambda: ToolCall.objects.filter(AnyOf("idempotency_key", 0)),
)


def _run_enrichment(ctx: ToolContext, calls: list[dict[str, Any]]) -> dict[str, Any]:
    results: dict[str, Any] = {"degraded": []}
    pending: list[tuple[dict[str, Any], ToolCall]] = []
    # The calls this step made before (a re-run), in one query for all the lookups.
    keys = [idempotency_key(ctx.session_id, call["call_id"]) for call in calls]
    made = {t.idempotency_key: t for t in _calls_made.rows(keys)}
    remote = []
    done: list[tuple[dict[str, Any], ToolCall]] = []
    for key, call in zip(keys, calls, strict=True):
        source = ENRICHMENT_SOURCES[call["tool"]]
        tool_call = made.get(key)
        if tool_call is None and source in IN_PROCESS_SOURCES:
            # Looked up first, then inserted with the others and their answers: one
            # INSERT for all of them.
            started = time.monotonic()
            try:
                response, error = source(call["args"]), ""
            except Exception as exc:  # a broken source degrades, it never blocks the agent
                response, error = {}, str(exc) or type(exc).__name__
            done.append((call, _done_row(ctx, call, started, response=response, error=error)))
            if error:
                results["degraded"].append({"source": call["tool"], "error": error})
            else:
                results[ENRICHMENT_KEYS[call["tool"]]] = response
            continue
        # The row and its tool.call_started event together. No savepoint: this runs in
        # a graph step's transaction and nothing in between catches an error.
        with transaction.atomic(savepoint=False):
            if tool_call is None:
                tool_call, created = get_or_create_call(
                    ctx, call, ToolCallStatus.RUNNING, attempts=1, fresh=True
                )
            else:
                created = False
            if tool_call.status == ToolCallStatus.COMPLETED:
                results[ENRICHMENT_KEYS[call["tool"]]] = tool_call.response_payload
            elif tool_call.status == ToolCallStatus.FAILED:
                results["degraded"].append({"source": call["tool"], "error": tool_call.error})
            else:
                call_started(ctx, tool_call, saved=created)
                pending.append((call, tool_call))
    if done:
        rows = insert_rows(ToolCall, [row for _, row in done])
        # Logged as two writes would log them: every start, then every outcome.
        for row in rows:
            call_started(ctx, row, saved=True)
        for row in rows:
            finished_event(ctx, row, response=row.response_payload, error=row.error)
    for call, tool_call in pending:
        source = ENRICHMENT_SOURCES[call["tool"]]
        if source not in IN_PROCESS_SOURCES:
            remote.append((call, tool_call))
            continue
        # Started before a crash, under an older release: finish the row it left.
        started = time.monotonic()
        try:
            response = source(call["args"])
        except Exception as exc:  # a broken source degrades, it never blocks the agent
            error = str(exc) or type(exc).__name__
            call_finished(ctx, tool_call, started, error=error)
            results["degraded"].append({"source": call["tool"], "error": error})
        else:
            call_finished(ctx, tool_call, started, response=response)
            results[ENRICHMENT_KEYS[call["tool"]]] = response
    if not remote:
        return results
    timeout = settings.AERO_ENRICHMENT_TIMEOUT
    pool = ThreadPoolExecutor(max_workers=len(remote), thread_name_prefix="aero-lookup")
    started = time.monotonic()
    futures = [
        (call, tool_call, pool.submit(_in_thread, ENRICHMENT_SOURCES[call["tool"]], call["args"]))
        for call, tool_call in remote
    ]
    for call, tool_call, future in futures:
        remaining = max(0.0, timeout - (time.monotonic() - started))
        try:
            response = future.result(timeout=remaining)
        except FutureTimeout:
            error = failure("timed_out", seconds=f"{timeout:g}")
            call_finished(ctx, tool_call, started, error=error)
            results["degraded"].append({"source": call["tool"], "error": error})
        except Exception as exc:  # a broken source degrades, it never blocks the agent
            error = str(exc) or type(exc).__name__
            call_finished(ctx, tool_call, started, error=error)
            results["degraded"].append({"source": call["tool"], "error": error})
        else:
            call_finished(ctx, tool_call, started, response=response)
            results[ENRICHMENT_KEYS[call["tool"]]] = response
    # Never wait for a slow source: its thread finishes on its own.
    pool.shutdown(wait=False, cancel_futures=True)
    return results


# --- deterministic analysis tools -----------------------------------------------------


def run_deterministic(
    ctx: ToolContext, call: dict[str, Any], compute: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    key = idempotency_key(ctx.session_id, call["call_id"])
    # Computed first (a pure function of the state: cheap, no effect), then inserted
    # with its result unless the call has a row already (a re-run): one statement,
    # INSERT ... ON CONFLICT DO NOTHING, not a read and an insert.
    started = time.monotonic()
    try:
        response, failure = compute(), None
    except Exception as exc:
        response, failure = {}, exc
    if failure is None and _record_done(ctx, call, started, response=response, new_only=True):
        return response
    tool_call = ToolCall.objects.filter(idempotency_key=key).first()
    if tool_call is None:
        # A failure raises and the step rolls back, as it did with the row inserted first.
        raise ToolFailure(f"{call['tool']} failed: {failure}") from failure
    if tool_call.status == ToolCallStatus.COMPLETED:
        return tool_call.response_payload
    call_started(ctx, tool_call)  # left running by an older release's crashed step
    started = time.monotonic()
    try:
        response = compute()
    except Exception as exc:
        call_finished(ctx, tool_call, started, error=str(exc))
        raise ToolFailure(f"{call['tool']} failed: {exc}") from exc
    call_finished(ctx, tool_call, started, response=response)
    return response


def run_recorded(
    ctx: ToolContext, call: dict[str, Any], compute: Callable[[], dict[str, Any]]
) -> tuple[dict[str, Any], str]:
    """A pack's lookup or evidence tool (R0): run once, recorded as its ToolCall with its
    start and its outcome, keyed so a re-run reuses it. A failure is recorded on the call
    and returned as (empty response, error), never raised: a broken source degrades the
    evidence, it never fails the step."""
    key = idempotency_key(ctx.session_id, call["call_id"])
    earlier = ToolCall.objects.filter(idempotency_key=key).first()
    if earlier is not None and earlier.status in (ToolCallStatus.COMPLETED, ToolCallStatus.FAILED):
        return earlier.response_payload, earlier.error
    started = time.monotonic()
    try:
        response, error = compute(), ""
    except Exception as exc:  # recorded on the call; the evidence goes on without it
        response, error = {}, str(exc) or type(exc).__name__
    if earlier is None:
        _record_done(ctx, call, started, response=response, error=error)
    else:  # left running by a crashed step: finish its row
        call_finished(ctx, earlier, started, response=response, error=error)
    return response, error


# --- response actions -----------------------------------------------------------------
# An action's effect happens in an external system, from the outbox (diagnosis/outbox.py):
# its pack's request says what to send (refusing a request no system could accept), its
# result records what came back, in the transaction that records the result.


def dispatch_summary(name: str, args: dict[str, Any]) -> str:
    """A dispatch's result in the active language: what was done (the words its pack
    declares), and where."""
    declared = action_tool(name)
    done = declared.done if declared is not None and declared.done is not None else name
    words = argument_words()
    where = ", ".join(f"{words.get(k, k)} {v}" for k, v in args.items() if k != "message")
    return f"{done} ({where})" if where else str(done)


def restriction_summary(kind: str, target: Any) -> str:
    """A restriction put in force, in the active language: "Taxiway closed: A"."""
    return f"{restrictions.label(kind)}: {target}"


UNFINISHED = (
    ToolCallStatus.APPROVED,
    ToolCallStatus.PROPOSED,
    ToolCallStatus.EXECUTING,
    ToolCallStatus.RUNNING,
)


def run_action(ctx: ToolContext, tool_call_id: int) -> ToolCall:
    """Execute an approved (or R0) action through the outbox. In the caller's
    transaction: the row lock, the call handed to the outbox (`executing`, its row and
    event, unless the decision did so already), the policy checked and the attempt
    logged; the request goes out once that transaction commits. A call handed over
    before a crash (`executing` or `running`, its row pending) is sent again under the
    same key: the external system never repeats the effect. Anything else is left as
    it is. No savepoint: it runs in a graph step's transaction."""
    with transaction.atomic(savepoint=False):
        # The session row first, as every writer of a session's rows (docs/lock-order.md):
        # a decision holding it never waits for this call's row while this waits for it.
        lock_session(ctx.session_id)
        tool_call = (
            ToolCall.objects.select_for_update(of=("self",))
            .select_related("outbox")
            .get(pk=tool_call_id)
        )
        if tool_call.status not in UNFINISHED:
            return tool_call  # decided otherwise, or ended: never again
        existing: Outbox | None = getattr(tool_call, "outbox", None)
        if existing is None:
            problems = execution_problems(tool_call)
            if problems:
                refuse_execution(tool_call, problems, producer=ctx.producer, run=ctx.run)
                return tool_call
            outbox = enqueue_effect(tool_call, producer=ctx.producer, run=ctx.run, fresh=True)
            effect = prepare(ctx, outbox, tool_call, checked=True) if outbox else None
        elif existing.status == OutboxStatus.PENDING:  # by the decision, or a crashed run
            effect = prepare(ctx, existing, tool_call)
        else:
            # Its effect was recorded already, yet the row says otherwise: changed by hand.
            problems = execution_problems(tool_call) or ["its effect was already recorded"]
            refuse_execution(tool_call, problems, producer=ctx.producer, run=ctx.run)
            return tool_call
        if effect is not None:
            execute_after_commit(ctx, effect)
    return tool_call


# --- recording ------------------------------------------------------------------------


def _record_done(
    ctx: ToolContext,
    call: dict[str, Any],
    started: float,
    *,
    response: dict[str, Any],
    error: str = "",
    new_only: bool = False,
) -> ToolCall | None:
    """A call that ran before its row existed: the row inserted with its outcome (one
    INSERT), then its tool.call_started and its tool.call_completed/failed events, in
    that order, as a call recorded in two writes logs them. `new_only`: None, and
    nothing written, if the call has a row already (its idempotency key)."""
    tool_call = _done_row(ctx, call, started, response=response, error=error)
    if new_only:
        if not _insert_unless_exists(tool_call):
            return None
    else:
        tool_call.save(force_insert=True)
    call_started(ctx, tool_call, saved=True)
    finished_event(ctx, tool_call, response=tool_call.response_payload, error=error)
    return tool_call


def _insert_unless_exists(tool_call: ToolCall) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING RETURNING id: whether the row is new (and its
    pk set). The step holds the lease, so a conflict is a re-run's own earlier row."""
    connection = transaction.get_connection()
    query = InsertQuery(ToolCall, on_conflict=OnConflict.IGNORE)
    pk = ToolCall._meta.pk
    query.insert_values([f for f in ToolCall._meta.concrete_fields if f is not pk], [tool_call])
    compiler = query.get_compiler(connection=connection)
    compiler.returning_fields = [pk]
    ((sql, params),) = compiler.as_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False
    tool_call.pk = row[0]
    tool_call._state.adding = False
    tool_call._state.db = connection.alias
    return True


def _done_row(
    ctx: ToolContext,
    call: dict[str, Any],
    started: float,
    *,
    response: dict[str, Any],
    error: str = "",
) -> ToolCall:
    """The row of a call that has run, not saved yet."""
    row = new_call(
        ctx, call, ToolCallStatus.FAILED if error else ToolCallStatus.COMPLETED, attempts=1
    )
    row.response_payload = response if not error else {}
    row.error = error
    row.duration_ms = int((time.monotonic() - started) * 1000)
    row.completed_at = timezone.now()
    return row
