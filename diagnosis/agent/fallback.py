"""The fallback chain: each provider tried with tenacity's retries (1/2/4 s x
AERO_LLM_BACKOFF plus jitter, or the server's Retry-After), skipped while its circuit
breaker is open, the offline provider last (it cannot fail). Every attempt is recorded.
Inside a graph node with waits on, the real providers' part is the LLM runner's."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
)
from tenacity.stop import stop_base

from aero import metrics
from diagnosis.agent import waits
from diagnosis.agent.clients import classify
from diagnosis.agent.providers import Attempt, OfflineProvider, Provider
from diagnosis.agent.usage import ProviderError, Usage
from scenarios_admin import breaker
from scenarios_admin.models import ProviderConfig

logger = logging.getLogger("diagnosis.providers")

MAX_RETRY_AFTER = 60.0


def backoff_sleep(seconds: float) -> None:
    """The wait between attempts (tests replace it to record waits instead of sleeping)."""
    time.sleep(seconds)


def backoff_wait(retry_state: RetryCallState) -> float:
    """Retry-After when the server sent one, else 1/2/4 s (x AERO_LLM_BACKOFF) + jitter."""
    outcome = retry_state.outcome
    error = outcome.exception() if outcome else None
    if isinstance(error, ProviderError) and error.retry_after is not None:
        return min(error.retry_after, MAX_RETRY_AFTER)
    base = settings.AERO_LLM_BACKOFF
    exponential = base * 2 ** (retry_state.attempt_number - 1)
    return float(min(exponential, 4 * base) + random.uniform(0, base / 4))


class _StopWhenOpen(stop_base):
    """tenacity's stop condition for a provider whose breaker the last failure found
    open (opened by it, or by other calls meanwhile): no retry against it."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        return isinstance(error, ProviderError) and error.breaker_open


def chain_stop(provider: Provider, admission: breaker.Admission, remaining: float) -> stop_base:
    """When the chain stops trying one provider: after its retries (one attempt for the
    half-open probe), when no time is left, or as soon as its breaker is open."""
    attempts = 1 if admission.probe else provider.retries
    return stop_after_attempt(attempts) | stop_before_delay(max(remaining, 0)) | _StopWhenOpen()


def skipped_text(admission: breaker.Admission) -> str:
    if admission.state == breaker.OPEN and admission.retry_at is not None:
        return f"circuit breaker open until {admission.retry_at.isoformat(timespec='seconds')}"
    return "circuit breaker half-open: another call is its probe"


def skipped_payload(
    provider: str, next_provider: str, admission: breaker.Admission, purpose: str, request: str
) -> dict[str, Any]:
    """The `llm.skipped` event of a provider the chain did not try."""
    payload: dict[str, Any] = {
        "provider": provider,
        "to": next_provider,
        "state": admission.state,
        "until": admission.retry_at.isoformat() if admission.retry_at else "",
        "purpose": purpose,
    }
    if request:
        payload["request"] = request
    return payload


def call_with_fallback[T](
    providers: list[Provider],
    purpose: str,
    call: Callable[[Provider], tuple[T, Usage]],
    record: Callable[[Attempt], None],
    on_fallback: Callable[[str, str, str], None],
    on_skip: Callable[[dict[str, Any]], None] | None = None,
) -> T:
    """Try each provider with its retries; fall back to the next. A provider whose
    circuit breaker is open is skipped at once (`on_skip` gets the `llm.skipped`
    payload). The offline provider cannot fail, so the chain always answers. Inside a
    graph node with waits on, the real providers' part of the chain is the LLM runner's
    (call_waiting)."""
    scope = waits.current_scope()
    if scope is not None and any(not isinstance(p, OfflineProvider) for p in providers):
        return call_waiting(scope, providers, purpose, call, record, on_fallback)
    last_error = ""
    budget = settings.AERO_LLM_BUDGET_SECONDS
    started_chain = time.monotonic()
    for index, provider in enumerate(providers):
        offline = isinstance(provider, OfflineProvider)
        remaining = budget - (time.monotonic() - started_chain)
        next_name = providers[index + 1].name if index + 1 < len(providers) else ""
        config: ProviderConfig | None = getattr(provider, "config", None)
        # A config never saved (a test's, a preview) has no breaker row to share.
        shared = config is not None and not config._state.adding
        admission = breaker.Admission(True)
        if shared and config is not None and remaining > 0:  # no probe taken for nothing
            admission = breaker.admit(config.pk, config.timeout_seconds)
        if not offline and remaining <= 0:
            last_error = last_error or "no time left within the lease"
        elif not admission.allowed:
            last_error = skipped_text(admission)
            if on_skip is not None:
                on_skip(skipped_payload(provider.name, next_name, admission, purpose, ""))
            metrics.llm_fallback(provider.name, "open")
            continue  # the skip event names the next provider: no fallback event too
        else:
            attempt_number = 0

            def attempt(
                provider: Provider = provider,
                config: ProviderConfig | None = config,
                admission: breaker.Admission = admission,
                shared: bool = shared,
            ) -> T:
                nonlocal attempt_number
                attempt_number += 1
                started = time.monotonic()
                try:
                    value, usage = call(provider)
                except Exception as exc:  # any provider failure degrades to the next one
                    error = classify(exc, [config.api_key()] if config is not None else [])
                    change = ""
                    if shared and config is not None:
                        change = breaker.failed(
                            config.pk, error.error_class, error.status, str(error), admission.probe
                        )
                        error.breaker_open = change in (breaker.OPENED, breaker.OPEN)
                        metrics.llm_attempt_failed(provider.name, error.error_class)
                        metrics.llm_breaker(provider.name, change)
                    record(
                        Attempt(
                            provider.name,
                            provider.model,
                            purpose,
                            "error",
                            _ms(started),
                            error.usage,
                            error=str(error),
                            attempt=attempt_number,
                            retryable=error.retryable,
                            error_class=error.error_class,
                            breaker=change if change == breaker.OPENED else "",
                        )
                    )
                    logger.warning(
                        "provider %s failed (%s, %s): %s",
                        provider.name,
                        purpose,
                        error.error_class,
                        error,
                    )
                    raise error from None
                change = ""
                if shared and config is not None:
                    change = breaker.succeeded(config.pk, admission)
                    metrics.llm_breaker(provider.name, change)
                record(
                    Attempt(
                        provider.name,
                        provider.model,
                        purpose,
                        "ok",
                        _ms(started),
                        usage,
                        attempt=attempt_number,
                        breaker=change,
                    )
                )
                return value

            retrying = Retrying(
                stop=chain_stop(provider, admission, remaining),
                wait=backoff_wait,
                retry=retry_if_exception(lambda e: isinstance(e, ProviderError) and e.retryable),
                sleep=lambda seconds: backoff_sleep(seconds),
                reraise=True,
            )
            try:
                return retrying(attempt)
            except ProviderError as exc:
                last_error = str(exc)
                if not offline:
                    metrics.llm_fallback(provider.name, "failed")
        if next_name:
            on_fallback(provider.name, next_name, last_error)
    raise RuntimeError(f"every provider failed for {purpose}: {last_error}")


def call_waiting[T](
    scope: waits.WaitScope,
    providers: list[Provider],
    purpose: str,
    call: Callable[[Provider], tuple[T, Usage]],
    record: Callable[[Attempt], None],
    on_fallback: Callable[[str, str, str], None],
) -> T:
    """The chain as a wait. The call runs against the first real provider; its
    model calls read the runner's stored replies or raise ModelWait (the node interrupts).
    The runner tried every real provider with the retries above and recorded each
    attempt, its tokens and each fallback: nothing of that is recorded again here. What is
    left to the node: a stored reply it cannot use (recorded, then offline) and the
    offline provider itself, which needs no wait (deterministic and instant)."""
    real = [p for p in providers if not isinstance(p, OfflineProvider)]
    offline = [p for p in providers if isinstance(p, OfflineProvider)]
    scope.purpose = purpose
    scope.provider_ids = [int(p.config.pk) for p in real if hasattr(p, "config")]
    scope.chain_failed = False
    first = real[0]
    started = time.monotonic()
    try:
        value, _usage = call(first)
        return value  # its tokens were counted by the runner, once
    except Exception as exc:
        config = getattr(first, "config", None)
        error = classify(exc, [config.api_key()] if config is not None else [])
        if not scope.chain_failed:
            # The reply came back but this node could not use it (the runner checks only
            # what every caller needs): a failed attempt of its own, no tokens (counted).
            record(
                Attempt(
                    first.name,
                    first.model,
                    purpose,
                    "error",
                    _ms(started),
                    error=str(error),
                    attempt=1,
                    retryable=False,
                )
            )
            if offline:
                on_fallback(first.name, offline[0].name, str(error))
        if not offline:
            raise RuntimeError(f"every provider failed for {purpose}: {error}") from None
    started = time.monotonic()
    value, usage = call(offline[0])
    record(Attempt(offline[0].name, offline[0].model, purpose, "ok", _ms(started), usage))
    return value


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
