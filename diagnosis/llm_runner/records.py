"""What a runner writes of a call, each write under its claim: the streamed text, each
attempt once by its key, the reply (or the failure) with the session's job enqueued on
commit; and the providers a call uses, built from their configs once per version."""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from django.db import transaction
from django.db.models import F, Model, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Concat
from django.utils import timezone
from langchain_core.messages import AIMessage, message_to_dict

from aero import metrics
from aero.compiled import Arg, CompiledUpdate
from aero.text import MAX_MODEL_TEXT, cut_generated
from diagnosis.agent.fallback import skipped_payload
from diagnosis.agent.providers import OpenAICompatibleProvider
from diagnosis.agent.usage import ProviderError, Usage
from diagnosis.eventlog.names import LLM_CALL, LLM_DELTA, LLM_FALLBACK, LLM_SKIPPED, TOOL_SLOW_CALL
from diagnosis.events import append_projected, new_event, usage_fields
from diagnosis.llm_runner.claims import Claimed, ClaimLost, locked_claim
from diagnosis.models import (
    Event,
    LLMCall,
    LLMRequest,
    LLMRequestStatus,
    Session,
)
from scenarios_admin import breaker
from scenarios_admin.models import ProviderConfig

logger = logging.getLogger("diagnosis.llm_runner")


PRODUCER = "llm"
# Who a slow tool's outcome is recorded as.
TOOL_PRODUCER = "tools"


class Dispatch(Protocol):
    """What enqueues a session's job once a reply commits (the jobs' dispatch_after_commit),
    handed to the runner by whoever starts it: the runner imports nothing of the jobs."""

    def __call__(self, session_id: Any, *, lease_read: bool = False) -> bool: ...


# Providers built from their configs, by config id: (the row's version, the provider).
# Read by the loop's database threads; a dict's get and set are atomic.
_providers: dict[int, tuple[str, OpenAICompatibleProvider]] = {}


def load_providers(
    ids: list[int], versions: dict[int, str] | None = None
) -> list[OpenAICompatibleProvider]:
    """The request's real providers, in its order; one disabled meanwhile is skipped.
    `versions` (the claim's read, PostgreSQL): the enabled ones and their row versions;
    a provider built from that version of its row is reused, the others are read again
    (the query and the providers' building were a sixth of the database
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
    database thread and back."""
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
        LLM_DELTA,
        {
            "request": call.key,
            "attempt": f"{call.claims}.{call.attempts}",
            "purpose": call.purpose,
            "text": text,
        },
        producer=PRODUCER,
        run_id=call.run,  # the run's node in the agent tree shows its stream
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
    error_class: str = "",
    breaker: str = "",
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
    if usage.estimated:
        payload["estimated"] = True  # the provider sent no usage: AERO's estimate
    if error_class:
        payload["error_class"] = error_class
    if breaker:
        payload["breaker"] = breaker
    if text is not None:
        # The call's final text: what replay shows for it (the deltas are the live view).
        payload["text"], cut_from = cut_generated(text, MAX_MODEL_TEXT)
        if cut_from is not None:
            payload["cut_from_chars"] = cut_from
    event = new_event(
        call.session_id,
        LLM_CALL,
        payload,
        producer=PRODUCER,
        run_id=call.run,
        key=f"llm.call:{call.key}:{call.claims}:{call.attempts}",
    )
    row = LLMCall(
        session_id=call.session_id,
        agent_run_id=call.run,
        provider=provider.name,
        model=provider.model,
        purpose=call.purpose,
        status=status,
        tokens_in=usage.tokens_in,
        tokens_out=usage.tokens_out,
        cost=usage.cost,
        tokens_estimated=usage.estimated,
        latency_ms=latency_ms,
        error=error,
        error_class=error_class,
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
    breaker: str = "",
) -> None:
    event, fields, rows = _attempt(
        call,
        provider,
        "error",
        error.usage,
        latency_ms,
        attempt,
        error=str(error),
        error_class=error.error_class,
        breaker=breaker,
    )
    with transaction.atomic():
        locked_claim(call)
        append_projected(call.session_id, [event], fields=fields, rows=rows)


def record_failure(
    call: Claimed,
    provider: OpenAICompatibleProvider,
    error: ProviderError,
    latency_ms: int,
    attempt: int,
    probe: bool,
) -> None:
    """A failed attempt: told to the provider's breaker first (its own transaction),
    then recorded with what it did to the breaker. `error.breaker_open` tells the retry
    policy to stop: no attempt goes to an open provider."""
    change = breaker.failed(provider.config.pk, error.error_class, error.status, str(error), probe)
    error.breaker_open = change in (breaker.OPENED, breaker.OPEN)
    metrics.llm_attempt_failed(provider.name, error.error_class)
    metrics.llm_breaker(provider.name, change)
    record_failed_attempt(
        call, provider, error, latency_ms, attempt, change if change == breaker.OPENED else ""
    )


def record_skip(
    call: Claimed,
    provider: OpenAICompatibleProvider,
    admission: breaker.Admission,
    next_provider: str,
    index: int,
) -> None:
    """A provider skipped because its breaker is open (or another call is its probe): an
    `llm.skipped` event, which also names the provider the call goes on to."""
    event = new_event(
        call.session_id,
        LLM_SKIPPED,
        skipped_payload(provider.name, next_provider, admission, call.purpose, call.key),
        producer=PRODUCER,
        run_id=call.run,
        key=f"llm.skipped:{call.key}:{call.claims}:{index}",
    )
    with transaction.atomic():
        locked_claim(call)
        append_projected(call.session_id, [event])


def record_fallback(call: Claimed, failed: str, next_provider: str, error: str, index: int) -> None:
    event = new_event(
        call.session_id,
        LLM_FALLBACK,
        {"from": failed, "to": next_provider, "error": error, "request": call.key},
        producer=PRODUCER,
        run_id=call.run,
        key=f"llm.fallback:{call.key}:{call.claims}:{index}",
    )
    with transaction.atomic():
        locked_claim(call)
        append_projected(call.session_id, [event])


def finish_ok(
    call: Claimed,
    provider: OpenAICompatibleProvider,
    message: AIMessage,
    usage: Usage,
    latency_ms: int,
    attempt: int,
    enqueue: Dispatch | None,
    tail: str = "",
    breaker_change: str = "",
) -> None:
    """The successful attempt and the reply, in one transaction: a runner killed before
    it commits leaves the request pending (the next claim makes the call again), one
    killed after has recorded both; never one without the other. `tail`: the streamed
    text not written yet, written here as its last delta (one transaction per
    call fewer than a flush of its own, the same events in the same order).
    Three statements: the request's UPDATE, which is also the claim check (no
    row: ClaimLost, nothing written); the session's locked read; one statement for the
    session's UPDATE (seqs, token counters) and the INSERTs of the events and LLMCall."""
    events = [_delta_event(call, tail)] if tail else []
    text = message.content if isinstance(message.content, str) else json.dumps(message.content)
    event, fields, rows = _attempt(
        call, provider, "ok", usage, latency_ms, attempt, text=text, breaker=breaker_change
    )
    reply = message_to_dict(message)
    with transaction.atomic():
        updated = _answer.run(call.pk, call.token, tail, reply, provider.name, timezone.now())
        if not updated:
            raise ClaimLost(call.key)
        session, _ = append_projected(call.session_id, [*events, event], fields=fields, rows=rows)
        if enqueue is not None:
            _enqueue_on_commit(call.session_id, session, enqueue)


def _request_field(name: str) -> Any:
    return LLMRequest._meta.get_field(name)


# The reply's UPDATE, once per call: compiled once per connection; the
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


def finish_failed(call: Claimed, error: str, last: str, enqueue: Dispatch | None) -> None:
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
                LLM_FALLBACK,
                {"from": last, "to": "offline", "error": error, "request": call.key},
                producer=PRODUCER,
                run_id=call.run,
                key=f"llm.fallback:{call.key}:{call.claims}:offline",
            )
            session, _ = append_projected(call.session_id, [event])
        if enqueue is not None:
            _enqueue_on_commit(call.session_id, session, enqueue)


def finish_tool(
    call: Claimed,
    name: str,
    result: dict[str, Any],
    error: str,
    latency_ms: int,
    enqueue: Dispatch | None,
) -> None:
    """A slow tool's outcome: the request answered (its result, or failed with the
    reason) and its `tool.slow_call` event, in one transaction under the claim. Keyed by
    the request: whichever claim commits it, it is written once."""
    now = timezone.now()
    with transaction.atomic():
        updated = LLMRequest.objects.filter(
            pk=call.pk, claim_token=call.token, status=LLMRequestStatus.PENDING
        ).update(
            status=LLMRequestStatus.FAILED if error else LLMRequestStatus.DONE,
            reply=None if error else {"result": result},
            error=error,
            answered_by=name,
            finished_at=now,
            claim_token=None,
            claim_expires_at=None,
        )
        if not updated:
            raise ClaimLost(call.key)
        event = new_event(
            call.session_id,
            TOOL_SLOW_CALL,
            {
                "tool": name,
                "request": call.key,
                "status": "error" if error else "ok",
                "error": error,
                "latency_ms": latency_ms,
                "claims": call.claims,
            },
            producer=TOOL_PRODUCER,
            run_id=call.run,
            key=f"tool.slow_call:{call.key}",
        )
        session, _ = append_projected(call.session_id, [event])
        if enqueue is not None:
            _enqueue_on_commit(call.session_id, session, enqueue)


def _enqueue_on_commit(session_id: Any, locked: Session | None, dispatch: Dispatch) -> None:
    """The session's job, once this commits. `locked`: the session as read under its row
    lock in this transaction: a live lease seen there is held by a job that
    can only let it go after this commits (that UPDATE waits for the lock), and it
    looks for answered requests after letting it go (advance_session): no job to add.
    No live lease there: enqueue without reading the lease again after the commit (one
    SELECT per call fewer); a job that took it meanwhile started after this commit and
    sees the reply, and rq's unique enqueue keeps its one job."""
    if locked is None:
        transaction.on_commit(lambda: dispatch(session_id))
        return
    expires = locked.lease_expires_at
    if locked.lease_token is not None and expires is not None and expires > timezone.now():
        return
    transaction.on_commit(lambda: dispatch(session_id, lease_read=True))
