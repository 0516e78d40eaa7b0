"""The LLM runner (ADR 95): model calls as waits, made by an asyncio loop.

A graph node that needs the model records a keyed `LLMRequest` and its job ends
(diagnosis.agent.waits, diagnosis.jobs). This runner:

- claims pending requests with a lease of its own (`claim_token`, renewed by its
  heartbeat every AERO_LLM_CLAIM_SECONDS/4): a killed runner's claims run out and any
  runner takes the request over; every write of a call checks the claim (a runner that
  lost it writes nothing more);
- makes many calls at once on one event loop, with one client per provider config
  (`providers.client_for`; its SDK client with a connection pool of the runner's own,
  kept between calls, ADR 171), the chain's rules kept: tenacity
  retries (3 attempts, 1/2/4 s x AERO_LLM_BACKOFF + jitter, or Retry-After), no retry on
  a final 4xx, the next provider, the offline provider last (the node's own: it needs no
  wait), no attempt started after AERO_LLM_BUDGET_SECONDS;
- streams the reply's text into the log (`llm.delta` events, coalesced: each call's
  text is written at most every AERO_LLM_STREAM_FLUSH seconds, and less often when the
  database is the bottleneck: the text waits in the buffer meanwhile);
- records each attempt once by its key (`llm.call` event + `LLMCall` row + the
  session's token counters in one transaction; the successful attempt in the same
  transaction as the stored reply), then enqueues the session's job.

Production: `manage.py aero_llm_runner` beside the rq workers (scripts/run.sh supervises
it). Embedded mode: `start_in_thread()` from the web process. The inline backend (CLI,
tests): `run_pending_inline()` between two runs of the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import httpx2
import openai
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections, transaction
from django.db.models import BooleanField, F, Model, Q, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Concat
from django.utils import timezone
from langchain_core.messages import AIMessage, InvalidToolCall, ToolCall, message_to_dict
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import invalid_tool_call, tool_call
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_before_delay

from aero.compiled import Arg, CompiledUpdate
from aero.text import MAX_MODEL_TEXT, cut_generated
from diagnosis.agent import waits
from diagnosis.agent.providers import (
    OpenAICompatibleProvider,
    ProviderError,
    Usage,
    async_client_of_its_own,
    backoff_wait,
    classify,
    client_for,
    warm_up,
)
from diagnosis.events import append_projected, new_event, usage_fields
from diagnosis.models import (
    Event,
    LLMCall,
    LLMRequest,
    LLMRequestStatus,
    Session,
    SessionStatus,
    WorkerBeat,
)
from scenarios_admin.models import ProviderConfig


async def drain_rest(response: Any) -> None:
    """Read what is left of a response's body (the chunked end after [DONE]), for at most
    0.1 s, then close it: read whole, HTTP/1.1 keeps the connection for the next call."""
    try:
        async with asyncio.timeout(0.1):
            # The transport's own byte stream: the response's iterators refuse a body
            # already partly read (the lines up to [DONE]).
            async for _ in response.stream:
                pass
    except Exception:  # whichever HTTP package the SDK runs on: cleanup never fails
        pass  # cleanup only: the reply is complete; the connection is simply not kept
    finally:
        await response.aclose()


try:
    # The SDK's own drain (what its stream does at [DONE]); private, so an upgrade may
    # move it: then our own, which does the same.
    from openai._streaming_cleanup import drain_response_async
except ImportError:  # pragma: no cover - depends on the installed SDK
    drain_response_async = drain_rest

logger = logging.getLogger("diagnosis.llm_runner")
PRODUCER = "llm"
BEAT_PREFIX = "llm-runner:"
T = TypeVar("T")


class ClaimLost(Exception):
    """Another runner took the request over (this one was too slow to renew)."""


@dataclass
class Claimed:
    pk: int
    key: str
    session_id: Any
    token: uuid.UUID
    claims: int
    purpose: str
    request: dict[str, Any]
    provider_ids: list[int]
    # The enabled ones among them, each with its row version (PostgreSQL's xmin) as the
    # claim read it; None where the claim cannot read them (SQLite): loaded per call.
    provider_versions: dict[int, str] | None = None
    buffer: list[str] = field(default_factory=list)
    attempts: int = 0  # attempts recorded under this claim (their keys' counter)
    # The call's writes, in order: its streamed text never lands after its reply.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


async def backoff_sleep(seconds: float) -> None:
    """The wait between attempts (tests replace it to record waits instead of sleeping)."""
    await asyncio.sleep(seconds)


DB_THREADS = 4


def _db[T](fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """Run on the loop's database threads (`database_threads`: a few, a connection each):
    one thread for every write of 200 calls in flight fell behind, and the renewals of
    its claims with it (the runner then lost its own claims). A call's writes stay in
    order (Claimed.lock)."""

    async def run(*args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))

    return run


@contextlib.asynccontextmanager
async def database_threads() -> AsyncIterator[None]:
    """The loop's default executor: DB_THREADS threads, their connections closed at the
    end (each thread closes its own; the barrier makes every thread take one)."""
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="aero-llm-db")
    loop.set_default_executor(executor)
    try:
        yield
    finally:
        barrier = threading.Barrier(DB_THREADS)

        def close() -> None:
            connections.close_all()
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=5)

        await asyncio.gather(*(loop.run_in_executor(None, close) for _ in range(DB_THREADS)))


# --- database side (sync) ---------------------------------------------------------------


def claim(limit: int, session_id: Any = None, held: frozenset[str] = frozenset()) -> list[Claimed]:
    """Claim up to `limit` pending requests nobody holds (or whose claim ran out), never
    one of `held` (this runner's own, in flight: a late renewal must not restart them).
    Each claimed row gets a token of its own. On PostgreSQL ONE statement (ADR 167):
    UPDATE ... WHERE pk IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING, in autocommit;
    it was a transaction with a SELECT and one UPDATE per row (a poll that found nothing
    was still BEGIN, SELECT, COMMIT)."""
    now = timezone.now()
    expires = now + timedelta(seconds=settings.AERO_LLM_CLAIM_SECONDS)
    rows = LLMRequest.objects.filter(status=LLMRequestStatus.PENDING).filter(
        Q(claim_token__isnull=True) | Q(claim_expires_at__lt=now)
    )
    if session_id is not None:
        rows = rows.filter(session_id=session_id)
    rows = rows.order_by("created_at")
    connection = connections[LLMRequest.objects.db]
    if connection.vendor != "postgresql":
        if held:
            rows = rows.exclude(key__in=held)
        return _claim_each(rows.select_for_update(skip_locked=True)[:limit], expires)
    # `held` as ONE array parameter, not an IN list of a parameter per key (up to the
    # runner's ~500 calls in flight): the statement's text is then the same at every
    # poll, so psycopg prepares it once and PostgreSQL stops parsing and planning it.
    rows = rows.alias(
        is_held=RawSQL("key = ANY(%s)", (sorted(held),), output_field=BooleanField())
    ).filter(is_held=False)
    pick_sql, pick_params = (
        rows.values("pk")[:limit].query.get_compiler(connection=connection).as_sql()
    )
    # The lock clause written here: Django refuses to compile select_for_update outside
    # a transaction, and this statement is a transaction of its own (autocommit).
    pick_sql += " " + connection.ops.for_update_sql(skip_locked=True)
    table = connection.ops.quote_name(LLMRequest._meta.db_table)
    configs = connection.ops.quote_name(ProviderConfig._meta.db_table)
    # gen_random_uuid(): a token per row, drawn by PostgreSQL (13+), so that every check
    # keys on (pk, token) exactly as before. `provider_versions`: the request's enabled
    # provider configs as "id:xmin" (ADR 171): xmin changes with every write of the row
    # (the admin's, a queryset update, the key rotation), so the runner rebuilds a
    # provider only when its row changed, and reads no ProviderConfig per call.
    claimed = LLMRequest.objects.raw(
        f"UPDATE {table} SET claim_token = gen_random_uuid(), claim_expires_at = %s,"
        " claims = claims + 1, \"text\" = ''"
        f" WHERE id IN ({pick_sql})"
        " RETURNING id, key, session_id, claim_token, claims, purpose, request, providers,"
        " created_at,"
        f" (SELECT array_agg(p.id::text || ':' || p.xmin::text) FROM {configs} p"
        f" WHERE p.enabled AND {table}.providers @> to_jsonb(p.id)) AS provider_versions",
        (expires, *pick_params),
    )
    # RETURNING follows no order: the calls start oldest first, as the SELECT had them.
    calls: list[Claimed] = []
    for row in sorted(claimed, key=lambda row: (row.created_at, row.pk)):
        assert row.claim_token is not None  # set by this very statement
        call = _claimed(row, row.claim_token, row.claims)
        pairs = (item.split(":") for item in row.provider_versions or ())  # type: ignore[attr-defined]
        call.provider_versions = {int(pk): version for pk, version in pairs}
        calls.append(call)
    return calls


def _claimed(row: LLMRequest, token: uuid.UUID, claims: int) -> Claimed:
    return Claimed(
        row.pk,
        row.key,
        row.session_id,
        token,
        claims,
        row.purpose,
        row.request,
        list(row.providers),
    )


def _claim_each(rows: Any, expires: Any) -> list[Claimed]:
    """claim() where UPDATE ... RETURNING of a subquery is not at hand (SQLite)."""
    claimed: list[Claimed] = []
    with transaction.atomic():
        for row in rows:
            token = uuid.uuid4()
            LLMRequest.objects.filter(pk=row.pk).update(
                claim_token=token, claim_expires_at=expires, claims=F("claims") + 1, text=""
            )
            claimed.append(_claimed(row, token, row.claims + 1))
    return claimed


def renew(tokens: list[uuid.UUID]) -> int:
    if not tokens:
        return 0
    return LLMRequest.objects.filter(
        claim_token__in=tokens, status=LLMRequestStatus.PENDING
    ).update(claim_expires_at=timezone.now() + timedelta(seconds=settings.AERO_LLM_CLAIM_SECONDS))


def release(tokens: list[uuid.UUID]) -> None:
    """A stopping runner lets its unfinished calls go at once (not after the claim)."""
    if tokens:
        LLMRequest.objects.filter(claim_token__in=tokens, status=LLMRequestStatus.PENDING).update(
            claim_token=None, claim_expires_at=None
        )


def _held(call: Claimed) -> LLMRequest:
    row = (
        LLMRequest.objects.select_for_update()
        .filter(pk=call.pk, claim_token=call.token, status=LLMRequestStatus.PENDING)
        .first()
    )
    if row is None:
        raise ClaimLost(call.key)
    return row


# Providers built from their configs, by config id: (the row's version, the provider).
# Read by the loop's database threads; a dict's get and set are atomic.
_providers: dict[int, tuple[str, OpenAICompatibleProvider]] = {}


def load_providers(
    ids: list[int], versions: dict[int, str] | None = None
) -> list[OpenAICompatibleProvider]:
    """The request's real providers, in its order; one disabled meanwhile is skipped.
    `versions` (the claim's read, PostgreSQL): the enabled ones and their row versions;
    a provider built from that version of its row is reused, the others are read again
    (ADR 171: the query and the providers' building were a sixth of the database
    threads' time). A config edited after the claim is used from the next claim on."""
    if versions is None:
        configs = {c.pk: c for c in ProviderConfig.objects.filter(pk__in=ids, enabled=True)}
        return [OpenAICompatibleProvider(configs[i]) for i in ids if i in configs]
    chain = _cached_chain(ids, versions)
    missing = [pk for pk in ids if pk in versions and pk not in chain]
    if missing:
        rows = ProviderConfig.objects.filter(pk__in=missing, enabled=True).annotate(
            version=RawSQL("xmin::text", ())
        )
        for config in rows:
            provider = chain[config.pk] = OpenAICompatibleProvider(config)
            _providers[config.pk] = (config.version, provider)
    return [chain[pk] for pk in ids if pk in chain]


def cached_providers(
    ids: list[int], versions: dict[int, str] | None
) -> list[OpenAICompatibleProvider] | None:
    """load_providers() from the cache alone, or None when a provider must be read. No
    query: the runner calls it on its loop, which saves the call a hand-off to a
    database thread and back (ADR 171)."""
    if versions is None:
        return None
    chain = _cached_chain(ids, versions)
    # A disabled or deleted one (not in `versions`) is skipped, as load_providers does.
    if any(pk in versions and pk not in chain for pk in ids):
        return None
    return [chain[pk] for pk in ids if pk in chain]


def _cached_chain(ids: list[int], versions: dict[int, str]) -> dict[int, OpenAICompatibleProvider]:
    """The request's enabled providers built from the versions of their rows the claim
    read, by config id (those not built yet, or from another version, left out)."""
    chain: dict[int, OpenAICompatibleProvider] = {}
    for pk in ids:
        cached = _providers.get(pk)
        if pk in versions and cached is not None and cached[0] == versions[pk]:
            chain[pk] = cached[1]
    return chain


def write_deltas(call: Claimed, text: str) -> None:
    """Streamed text: the request's `text` (a reload shows it) and an `llm.delta` event
    (the live page pulls it), in one transaction, under the claim."""
    with transaction.atomic():
        updated = LLMRequest.objects.filter(
            pk=call.pk, claim_token=call.token, status=LLMRequestStatus.PENDING
        ).update(text=Concat(F("text"), Value(text)))
        if not updated:
            raise ClaimLost(call.key)
        append_projected(call.session_id, [_delta_event(call, text)])


def _delta_event(call: Claimed, text: str) -> Event:
    return new_event(
        call.session_id,
        "llm.delta",
        {
            "request": call.key,
            "attempt": f"{call.claims}.{call.attempts}",
            "purpose": call.purpose,
            "text": text,
        },
        producer=PRODUCER,
    )


def reset_text(call: Claimed) -> None:
    LLMRequest.objects.filter(pk=call.pk, claim_token=call.token).update(text="")


def _attempt(
    call: Claimed,
    provider: OpenAICompatibleProvider,
    status: str,
    usage: Usage,
    latency_ms: int,
    attempt: int,
    error: str = "",
    text: str | None = None,
) -> tuple[Event, dict[str, Any], list[Model]]:
    """One attempt, to be written once by its key (append_projected): its `llm.call`
    event, and what is written with it only if that event is new: the token counters
    (the session's UPDATE) and the LLMCall row (the same statement)."""
    call.attempts += 1
    payload: dict[str, Any] = {
        "provider": provider.name,
        "model": provider.model,
        "purpose": call.purpose,
        "status": status,
        "tokens_in": usage.tokens_in,
        "tokens_out": usage.tokens_out,
        "cost": str(usage.cost),
        "latency_ms": latency_ms,
        "error": error,
        "attempt": attempt,
        "request": call.key,
    }
    if text is not None:
        # The call's final text: what replay shows for it (the deltas are the live view).
        payload["text"], cut_from = cut_generated(text, MAX_MODEL_TEXT)
        if cut_from is not None:
            payload["cut_from_chars"] = cut_from
    event = new_event(
        call.session_id,
        "llm.call",
        payload,
        producer=PRODUCER,
        key=f"llm.call:{call.key}:{call.claims}:{call.attempts}",
    )
    row = LLMCall(
        session_id=call.session_id,
        provider=provider.name,
        model=provider.model,
        purpose=call.purpose,
        status=status,
        tokens_in=usage.tokens_in,
        tokens_out=usage.tokens_out,
        cost=usage.cost,
        latency_ms=latency_ms,
        error=error,
    )
    counted = usage.tokens_in or usage.tokens_out or usage.cost
    fields = usage_fields(usage.tokens_in, usage.tokens_out, usage.cost) if counted else {}
    return event, fields, [row]


def record_failed_attempt(
    call: Claimed,
    provider: OpenAICompatibleProvider,
    error: ProviderError,
    latency_ms: int,
    attempt: int,
) -> None:
    event, fields, rows = _attempt(
        call, provider, "error", error.usage, latency_ms, attempt, error=str(error)
    )
    with transaction.atomic():
        _held(call)
        append_projected(call.session_id, [event], fields=fields, rows=rows)


def record_fallback(call: Claimed, failed: str, next_provider: str, error: str, index: int) -> None:
    event = new_event(
        call.session_id,
        "llm.fallback",
        {"from": failed, "to": next_provider, "error": error, "request": call.key},
        producer=PRODUCER,
        key=f"llm.fallback:{call.key}:{call.claims}:{index}",
    )
    with transaction.atomic():
        _held(call)
        append_projected(call.session_id, [event])


def finish_ok(
    call: Claimed,
    provider: OpenAICompatibleProvider,
    message: AIMessage,
    usage: Usage,
    latency_ms: int,
    attempt: int,
    enqueue: bool,
    tail: str = "",
) -> None:
    """The successful attempt and the reply, in one transaction: a runner killed before
    it commits leaves the request pending (the next claim makes the call again), one
    killed after has recorded both; never one without the other. `tail`: the streamed
    text not written yet, written here as its last delta (ADR 160: one transaction per
    call fewer than a flush of its own, the same events in the same order).
    Three statements (ADR 167): the request's UPDATE, which is also the claim check (no
    row: ClaimLost, nothing written); the session's locked read; one statement for the
    session's UPDATE (seqs, token counters) and the INSERTs of the events and LLMCall."""
    events = [_delta_event(call, tail)] if tail else []
    text = message.content if isinstance(message.content, str) else json.dumps(message.content)
    event, fields, rows = _attempt(call, provider, "ok", usage, latency_ms, attempt, text=text)
    reply = message_to_dict(message)
    with transaction.atomic():
        updated = _answer.run(call.pk, call.token, tail, reply, provider.name, timezone.now())
        if not updated:
            raise ClaimLost(call.key)
        session, _ = append_projected(call.session_id, [*events, event], fields=fields, rows=rows)
        if enqueue:
            _enqueue_on_commit(call.session_id, session)


def _request_field(name: str) -> Any:
    return LLMRequest._meta.get_field(name)


# The reply's UPDATE, once per call: compiled once per connection (ADR 179, 185); the
# claim check is its WHERE (no row: the claim was lost).
_answer = CompiledUpdate(
    LLMRequest,
    lambda: LLMRequest.objects.filter(
        pk=Arg(0),
        claim_token=Arg(1, _request_field("claim_token")),
        status=LLMRequestStatus.PENDING,
    ),
    {
        "text": Concat(F("text"), Arg(2, _request_field("text"))),
        "status": LLMRequestStatus.DONE,
        "reply": Arg(3, _request_field("reply")),
        "answered_by": Arg(4, _request_field("answered_by")),
        "finished_at": Arg(5, _request_field("finished_at")),
        "claim_token": None,
        "claim_expires_at": None,
    },
)


def finish_failed(call: Claimed, error: str, last: str, enqueue: bool) -> None:
    """Every real provider failed: the node goes on with the offline provider."""
    with transaction.atomic():
        updated = LLMRequest.objects.filter(
            pk=call.pk, claim_token=call.token, status=LLMRequestStatus.PENDING
        ).update(
            status=LLMRequestStatus.FAILED,
            error=error or "no real provider is enabled",
            finished_at=timezone.now(),
            claim_token=None,
            claim_expires_at=None,
        )
        if not updated:
            raise ClaimLost(call.key)
        session = None
        if last:
            event = new_event(
                call.session_id,
                "llm.fallback",
                {"from": last, "to": "offline", "error": error, "request": call.key},
                producer=PRODUCER,
                key=f"llm.fallback:{call.key}:{call.claims}:offline",
            )
            session, _ = append_projected(call.session_id, [event])
        if enqueue:
            _enqueue_on_commit(call.session_id, session)


def _enqueue_on_commit(session_id: Any, locked: Session | None) -> None:
    """The session's job, once this commits. `locked`: the session as read under its row
    lock in this transaction (ADR 167): a live lease seen there is held by a job that
    can only let it go after this commits (that UPDATE waits for the lock), and it
    looks for answered requests after letting it go (advance_session): no job to add.
    No live lease there: enqueue without reading the lease again after the commit (one
    SELECT per call fewer); a job that took it meanwhile started after this commit and
    sees the reply, and rq's unique enqueue keeps its one job."""
    from diagnosis.jobs import dispatch_after_commit

    if locked is None:
        transaction.on_commit(lambda: dispatch_after_commit(session_id))
        return
    expires = locked.lease_expires_at
    if locked.lease_token is not None and expires is not None and expires > timezone.now():
        return
    transaction.on_commit(lambda: dispatch_after_commit(session_id, lease_read=True))


def beat(name: str, started_at: Any) -> None:
    WorkerBeat.objects.update_or_create(
        name=name,
        defaults={
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": started_at,
            "beat_at": timezone.now(),
        },
    )


def unregister(name: str) -> None:
    WorkerBeat.objects.filter(name=name).delete()


# Rows per prune pass: a backlog goes in a few passes, never one long DELETE.
PRUNE_BATCH = 5000


def prune_requests() -> int:
    """Periodic (the workers' maintenance loop): delete the requests of completed and
    canceled sessions. Their replies were only there for a re-run of the node that asked
    (a paid call is never made again); an ended session runs no node, and its calls stay
    in the log (`llm.call`, the text included) and in `LLMCall`. A canceled session's
    pending request goes too, so no runner makes that call any more (one making it now
    finds its claim gone at its next write). Failed sessions keep theirs, like their
    checkpoints: a retry re-runs the node from its checkpoint and reads the replies."""
    ended = LLMRequest.objects.filter(
        session__status__in=[SessionStatus.COMPLETED, SessionStatus.CANCELED]
    )
    pks = list(ended.values_list("pk", flat=True)[:PRUNE_BATCH])
    if not pks:
        return 0
    deleted, _ = LLMRequest.objects.filter(pk__in=pks).delete()
    return deleted


# --- the calls (async) ------------------------------------------------------------------


class Runner:
    def __init__(self, *, enqueue: bool = True, name: str | None = None) -> None:
        self.enqueue = enqueue
        self.name = name or f"{BEAT_PREFIX}{socket.gethostname()}:{os.getpid()}"
        self.inflight: dict[str, tuple[Claimed, asyncio.Task[None]]] = {}
        self.started_at = timezone.now()
        # Per LangChain client (one per provider config, `client_for`): its SDK client
        # with a connection pool of this runner's loop (ADR 171), closed at the loop's
        # end. A client replaced by a config edit keeps its entry (the calls in flight
        # still use its pool; its idle connections expire after a few seconds).
        self.sdk_clients: dict[int, tuple[Any, openai.AsyncOpenAI]] = {}

    def _sdk_client(self, client: Any) -> openai.AsyncOpenAI:
        entry = self.sdk_clients.get(id(client))
        if entry is None or entry[0] is not client:
            entry = self.sdk_clients[id(client)] = (client, async_client_of_its_own(client))
        return entry[1]

    async def _close_clients(self) -> None:
        clients = [sdk for _, sdk in self.sdk_clients.values()]
        self.sdk_clients.clear()
        await asyncio.gather(*(sdk.close() for sdk in clients), return_exceptions=True)

    # -- loops

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and call until `stop` is set; then let the unfinished calls go."""
        # Before the first beat says the runner is up: the model client's import, and
        # each enabled provider's clients and this loop's pool, which the first call
        # paid for otherwise, with every session's first call behind it (ADR 183).
        for client in await _db(warm_up)():
            self._sdk_client(client)
        background = [
            asyncio.create_task(self._beat_forever(stop)),
            asyncio.create_task(self._flush_forever(stop)),
        ]
        try:
            while not stop.is_set():
                free = settings.AERO_LLM_RUNNER_CONCURRENCY - len(self.inflight)
                if free > 0:
                    try:
                        held = frozenset(self.inflight)
                        for call in await _db(claim)(free, None, held):
                            self._start(call)
                    except DatabaseError:
                        logger.warning("llm runner: claiming failed", exc_info=True)
                        await _db(close_old_connections)()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), settings.AERO_LLM_RUNNER_POLL)
        finally:
            tokens = [call.token for call, _ in self.inflight.values()]
            for _, task in self.inflight.values():
                task.cancel()
            await asyncio.gather(*(t for _, t in self.inflight.values()), return_exceptions=True)
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            try:
                await _db(release)(tokens)
                await _db(unregister)(self.name)
            except DatabaseError:
                logger.warning("llm runner: could not release its claims", exc_info=True)
            await self._close_clients()

    async def serve(self, stop: asyncio.Event) -> None:
        """run() with its own database threads."""
        async with database_threads():
            await self.run(stop)

    async def process_pending_now(self, session_id: Any = None) -> int:
        """process_pending() with its own database threads."""
        async with database_threads():
            return await self.process_pending(session_id)

    async def process_pending(self, session_id: Any = None) -> int:
        """Claim every pending request (of one session) and make the calls; returns how
        many were made. The inline backend's runner."""
        calls = await _db(claim)(10_000, session_id)
        for call in calls:
            self._start(call)
        flusher_stop = asyncio.Event()
        flusher = asyncio.create_task(self._flush_forever(flusher_stop))
        await asyncio.gather(*(t for _, t in list(self.inflight.values())), return_exceptions=True)
        flusher_stop.set()
        await flusher
        await self._close_clients()
        return len(calls)

    def _start(self, call: Claimed) -> None:
        task = asyncio.create_task(self._handle(call))
        self.inflight[call.key] = (call, task)
        task.add_done_callback(lambda _: self.inflight.pop(call.key, None))

    async def _beat_forever(self, stop: asyncio.Event) -> None:
        interval = settings.AERO_LLM_CLAIM_SECONDS / 4
        while not stop.is_set():
            try:
                await _db(renew)([call.token for call, _ in self.inflight.values()])
                await _db(beat)(self.name, self.started_at)
            except DatabaseError:
                logger.warning("llm runner: heartbeat failed", exc_info=True)
                await _db(close_old_connections)()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def _flush_forever(self, stop: asyncio.Event) -> None:
        interval = settings.AERO_LLM_STREAM_FLUSH
        while True:
            started = time.monotonic()
            pending = [call for call, _ in list(self.inflight.values()) if call.buffer]
            await asyncio.gather(*(self._flush(call) for call in pending))
            if stop.is_set():
                return
            # At most every `interval`; a slow flush simply coalesces more text.
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def _flush(self, call: Claimed) -> None:
        async with call.lock:
            if not call.buffer:
                return
            text, call.buffer[:] = "".join(call.buffer), []
            await self._write_deltas(call, text)

    async def _write_deltas(self, call: Claimed, text: str) -> None:
        try:
            await _db(write_deltas)(call, text)
        except ClaimLost:
            self._drop(call)
        except Exception:
            # The database refused (too many clients, a restart): the text goes back to
            # the front of the buffer and is written with the next piece, in order.
            call.buffer.insert(0, text)
            logger.warning("llm runner: streamed text of %s not written", call.key, exc_info=True)

    def _drop(self, call: Claimed) -> None:
        entry = self.inflight.get(call.key)
        if entry is not None and entry[0] is call:
            entry[1].cancel()

    # -- one request

    async def _handle(self, call: Claimed) -> None:
        try:
            await self._chain(call)
        except ClaimLost:
            logger.warning("llm runner: lost the claim on %s; another runner has it", call.key)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The claim runs out and the request is taken again (by us or another runner).
            logger.exception("llm runner: request %s failed", call.key)

    async def _chain(self, call: Claimed) -> None:
        providers = cached_providers(call.provider_ids, call.provider_versions)
        if providers is None:
            providers = await _db(load_providers)(call.provider_ids, call.provider_versions)
        messages = waits.deserialize_messages(call.request)
        options = dict(call.request.get("kwargs") or {})
        started_chain = time.monotonic()
        budget = settings.AERO_LLM_BUDGET_SECONDS
        last_error, last_name = "", ""
        for index, provider in enumerate(providers):
            remaining = budget - (time.monotonic() - started_chain)
            if remaining <= 0:
                last_error = last_error or "no time left for another attempt"
                break
            attempt_number = 0

            async def attempt(
                provider: OpenAICompatibleProvider = provider,
            ) -> tuple[AIMessage, Usage, int, int]:
                nonlocal attempt_number
                attempt_number += 1
                started = time.monotonic()
                try:
                    message, usage = await self._stream(call, provider, messages, options)
                except (ClaimLost, asyncio.CancelledError):
                    raise
                except Exception as exc:
                    error = classify(exc, [provider.config.api_key()])
                    await _db(record_failed_attempt)(
                        call, provider, error, _ms(started), attempt_number
                    )
                    logger.warning(
                        "provider %s failed (%s): %s", provider.name, call.purpose, error
                    )
                    raise error from None
                return message, usage, _ms(started), attempt_number

            retrying = AsyncRetrying(
                stop=stop_after_attempt(provider.retries) | stop_before_delay(max(remaining, 0)),
                wait=backoff_wait,
                retry=retry_if_exception(lambda e: isinstance(e, ProviderError) and e.retryable),
                sleep=lambda seconds: backoff_sleep(seconds),
                reraise=True,
            )
            message: AIMessage
            usage: Usage
            latency: int
            number: int
            try:
                message, usage, latency, number = await retrying(attempt)
            except ProviderError as exc:
                last_error, last_name = str(exc), provider.name
                if index + 1 < len(providers):
                    await _db(record_fallback)(
                        call, provider.name, providers[index + 1].name, last_error, index
                    )
                continue
            async with call.lock:
                # The last of the text goes with the reply, in its transaction.
                tail, call.buffer[:] = "".join(call.buffer), []
                await _db(finish_ok)(
                    call, provider, message, usage, latency, number, self.enqueue, tail
                )
            return
        await self._flush(call)
        async with call.lock:
            await _db(finish_failed)(call, last_error, last_name, self.enqueue)

    async def _stream(
        self,
        call: Claimed,
        provider: OpenAICompatibleProvider,
        messages: list[Any],
        options: dict[str, Any],
    ) -> tuple[AIMessage, Usage]:
        """One attempt, streamed: the text goes to the call's buffer as it arrives."""
        if call.attempts:
            async with call.lock:
                call.buffer.clear()
                await _db(reset_text)(call)  # a new attempt streams a new text
        try:
            client = client_for(provider.config)
            message = await stream_reply(
                client, messages, options, call.buffer, self._sdk_client(client)
            )
        except (openai.APIError, asyncio.CancelledError, ClaimLost):
            raise
        except Exception as exc:
            # A body that is no event stream (or breaks it) is an unusable reply: retried.
            raise ProviderError(
                f"invalid response: {type(exc).__name__}: {exc}", retryable=True
            ) from None
        meta: dict[str, Any] = dict(message.usage_metadata or {})
        tokens_in, tokens_out = int(meta.get("input_tokens", 0)), int(meta.get("output_tokens", 0))
        usage = Usage(tokens_in, tokens_out, provider.cost(tokens_in, tokens_out))
        if "response_format" in options:
            # Structured output: a reply that is not a JSON object is an unusable reply,
            # retried like a failed call (and paid for); the node validates the schema.
            try:
                data = json.loads(str(message.content))
            except json.JSONDecodeError as exc:
                raise ProviderError(
                    f"the model's reply is not valid JSON ({exc.msg} at {exc.pos})",
                    retryable=True,
                    usage=usage,
                ) from None
            if not isinstance(data, dict):
                raise ProviderError(
                    "the model's reply is not a JSON object", retryable=True, usage=usage
                )
        return message, usage


async def stream_reply(
    client: Any,
    messages: list[Any],
    options: dict[str, Any],
    buffer: list[str],
    sdk: openai.AsyncOpenAI | None = None,
) -> AIMessage:
    """One streamed chat completion, read as plain server-sent events (ADR 160): the text
    goes to `buffer` as it arrives; the reply is one AIMessage, its tool arguments parsed
    strictly (strict_calls). The request is LangChain's (`_get_request_payload`: the
    same messages, tools and options as `astream`) sent by the same SDK client (its pool,
    timeout and HTTP errors); only the reading is ours: `astream` built an SDK pydantic
    object, a LangChain chunk and a merged message per chunk, about half of the runner's
    CPU with 200 calls in flight. `sdk`: the client's SDK client with the caller's own
    connection pool (`Runner._sdk_client`); LangChain's by default."""
    payload = client._get_request_payload(
        messages, stream=True, stream_options={"include_usage": True}, **options
    )
    content: list[str] = []
    tools: dict[int, dict[str, Any]] = {}
    usage: dict[str, Any] | None = None
    meta: dict[str, Any] = {}
    sdk = sdk or client.root_async_client
    create = sdk.chat.completions.with_streaming_response.create
    # The body goes as `extra_body`, which the SDK sends as it is: passed as `create`'s
    # own arguments, the SDK walked every message and tool schema against its TypedDicts
    # first (`async_maybe_transform`, ~5 ms per call here, a fifth of the runner's CPU);
    # LangChain built the payload from the same types already.
    body = {k: v for k, v in payload.items() if k not in ("model", "stream")}
    async with create(
        model=payload["model"], messages=[], stream=True, extra_body=body
    ) as response:
        try:
            async for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, comments, `event:` lines
                data = line[5:].strip()
                if data == "[DONE]":
                    # What the SDK's own stream does at [DONE]: read the rest of the body
                    # (the chunked end, at most 0.1 s) so that HTTP/1.1 keeps the
                    # connection for the next call. Closed unread, every call opened a
                    # TCP connection of its own (about a tenth of the runner's CPU).
                    if response.http_response.http_version == "HTTP/1.1":
                        await drain_response_async(response.http_response)
                    break
                chunk = json.loads(data)
                if not isinstance(chunk, dict):
                    raise ValueError("an event that is not a JSON object")
                if chunk.get("error"):
                    error = chunk["error"]
                    text = error.get("message") if isinstance(error, dict) else str(error)
                    raise openai.APIError(
                        str(text), response.http_request, body=error
                    )  # what the SDK raises for an error inside the stream
                meta.setdefault("id", chunk.get("id"))
                meta.setdefault("model_name", chunk.get("model"))
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if choice.get("finish_reason"):
                        meta["finish_reason"] = choice["finish_reason"]
                    piece = delta.get("content")
                    if isinstance(piece, str) and piece:
                        content.append(piece)
                        buffer.append(piece)
                    for part in delta.get("tool_calls") or ():
                        entry = tools.setdefault(
                            int(part.get("index") or 0), {"id": None, "name": "", "args": []}
                        )
                        function = part.get("function") or {}
                        entry["id"] = part.get("id") or entry["id"]
                        entry["name"] += function.get("name") or ""
                        entry["args"].append(function.get("arguments") or "")
        # The body is read after the SDK's own error handling (which covers the request
        # and the headers): a transport error mid-body is turned into the SDK's error, as
        # the SDK would turn it before the headers, so that it is retried as one. The
        # SDK's transport is httpx2 (not httpx: its exceptions are other classes).
        except httpx2.TimeoutException as exc:
            raise openai.APITimeoutError(response.http_request) from exc
        except httpx2.TransportError as exc:
            raise openai.APIConnectionError(request=response.http_request) from exc
    if not meta:
        raise ValueError("the model sent an empty stream")
    usage_metadata: UsageMetadata | None = None
    if usage is not None:
        prompt, completion = (
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
        )
        usage_metadata = {
            "input_tokens": prompt,
            "output_tokens": completion,
            "total_tokens": int(usage.get("total_tokens") or prompt + completion),
        }
    calls, invalid = strict_calls(
        [(t["name"], "".join(t["args"]), t["id"]) for _, t in sorted(tools.items())]
    )
    return AIMessage(
        content="".join(content),
        tool_calls=calls,
        invalid_tool_calls=invalid,
        usage_metadata=usage_metadata,
        response_metadata={
            "finish_reason": meta.get("finish_reason"),
            "model_name": meta.get("model_name"),
            "model_provider": "openai",
        },
        id=meta.get("id"),
    )


def strict_calls(
    raw_calls: list[tuple[str | None, str, str | None]],
) -> tuple[list[ToolCall], list[InvalidToolCall]]:
    """Streamed tool calls (name, raw arguments, id), their arguments parsed strictly:
    arguments that are not a JSON object make an invalid call (the repair turn)."""
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for name, raw, call_id in raw_calls:
        try:
            args = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            args, problem = None, f"not valid JSON: {exc.msg}"
        else:
            problem = "" if isinstance(args, dict) else "not a JSON object"
        if problem or not isinstance(args, dict):
            invalid.append(invalid_tool_call(name=name, args=raw, id=call_id, error=problem))
        else:
            calls.append(tool_call(name=name or "", args=args, id=call_id))
    return calls, invalid


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


# --- the three ways to run it -----------------------------------------------------------


def run_pending_inline(session_id: Any) -> bool:
    """Make the session's pending calls now, on an event loop of a fresh thread (the
    caller's thread may already run one: Playwright's tests). False when there were none
    to claim (another runner holds them)."""
    result: list[int] = []

    def target() -> None:
        try:
            result.append(asyncio.run(Runner(enqueue=False).process_pending_now(session_id)))
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name="aero-llm-inline")
    thread.start()
    thread.join()
    return bool(result and result[0])


_thread: threading.Thread | None = None
_thread_lock = threading.Lock()


def start_in_thread() -> None:
    """Embedded mode: the runner as an event loop on a daemon thread of this process."""
    global _thread
    with _thread_lock:
        if _thread is not None and _thread.is_alive():
            return

        def target() -> None:
            try:
                asyncio.run(Runner().serve(asyncio.Event()))
            except Exception:
                logger.exception("the embedded LLM runner stopped")
            finally:
                connections.close_all()

        _thread = threading.Thread(target=target, daemon=True, name="aero-llm-runner")
        _thread.start()
