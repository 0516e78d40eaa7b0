"""A circuit breaker per model provider, shared by every process through its
ProviderHealth row (PostgreSQL: web, workers and LLM runners see one state).

- **closed**: calls go to the provider. Each failed attempt the breaker counts (nothing
  listening, a timeout, another network failure, HTTP 5xx, 429, 401/403/404/408, a reply
  that is no usable completion) adds one to `failures`; a success resets it.
  AERO_LLM_BREAKER_FAILURES in a row open it. A 400 or 422 is about one request, not the
  provider: not counted.
- **open** until `open_until` (AERO_LLM_BREAKER_COOLDOWN seconds): the chain skips the
  provider at once, with no attempt.
- **half-open** once the cool-down is over: one call at a time is the probe (it takes
  `probe_until`, a lease as long as the provider's timeout, so that a prober that died
  frees it), with one attempt and no retry. Its success closes the breaker; its failure
  opens it for another cool-down. Other calls skip the provider meanwhile.

Every write is one short transaction of its own, committed at once, also when the caller
is inside a transaction (a job's step group): a breaker row locked until a step commits
would hold every other process's report about the provider. Embedded (SQLite, one
writer, held by the step) the write rides the step's transaction instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, connections, transaction
from django.db.models import Q
from django.utils import timezone

from scenarios_admin.models import ProviderHealth

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
# What a failed attempt or a success did to the breaker (the llm.call event says it).
OPENED, RECLOSED = "opened", "closed"

# Error classes (diagnosis.agent.usage.ErrorClass) that say the provider is unwell.
COUNTED_CLASSES = frozenset({"refused", "timeout", "connection", "5xx", "bad_reply"})
# HTTP 4xx that hold for every call to it: a rate limit, a refused key, a wrong URL or
# model, the server's own timeout.
COUNTED_STATUSES = frozenset({401, 403, 404, 408, 429})


def counts(error_class: str, status: int | None) -> bool:
    """Whether a failure of this class is the provider's, not the request's."""
    return error_class in COUNTED_CLASSES or (error_class == "4xx" and status in COUNTED_STATUSES)


def state_of(health: ProviderHealth | None, now: datetime | None = None) -> str:
    if health is None or health.open_until is None:
        return CLOSED
    if health.open_until > (now or timezone.now()):
        return OPEN
    return HALF_OPEN


@dataclass(frozen=True)
class Admission:
    """Whether a call may go to the provider now. `probe`: it is the half-open probe
    (one attempt). `failures`: the count seen (a success resets only a count above 0)."""

    allowed: bool
    state: str = CLOSED
    probe: bool = False
    retry_at: datetime | None = None
    failures: int = 0


# A person's successful "Test connection" in the admin: a probe of its own.
MANUAL_PROBE = Admission(True, HALF_OPEN, probe=True)


def read(provider_id: int) -> ProviderHealth | None:
    return ProviderHealth.objects.filter(pk=provider_id).first()


def admit(
    provider_id: int, probe_seconds: float, health: ProviderHealth | bool | None = False
) -> Admission:
    """Whether a call may go to the provider now (closed, or the probe taken here).
    `health`: the row as the caller read it (None: no row), or False to read it here."""
    seen = read(provider_id) if health is False else health
    assert seen is None or isinstance(seen, ProviderHealth)
    now = timezone.now()
    state = state_of(seen, now)
    if seen is None or state == CLOSED:
        return Admission(True, failures=seen.failures if seen is not None else 0)
    if state == OPEN:
        return Admission(False, OPEN, retry_at=seen.open_until)
    lease = now + timedelta(seconds=max(probe_seconds, 1.0))

    def take() -> int:
        return (
            ProviderHealth.objects.filter(pk=provider_id, open_until__lte=now)
            .filter(Q(probe_until__isnull=True) | Q(probe_until__lt=now))
            .update(probe_until=lease)
        )

    if _own_transaction(take):
        return Admission(True, HALF_OPEN, probe=True, failures=seen.failures)
    # Another call is the probe: this one skips the provider like an open one.
    return Admission(False, HALF_OPEN, retry_at=seen.probe_until)


def failed(provider_id: int, error_class: str, status: int | None, error: str, probe: bool) -> str:
    """Count a failed attempt. Returns OPENED when it opened the breaker (the threshold
    reached, or a half-open provider failing again), OPEN when the breaker is open anyway
    (a call that started before), "" while it stays closed. A failure the breaker does
    not count only frees the probe it held."""
    if not counts(error_class, status):
        if probe:
            _own_transaction(
                lambda: ProviderHealth.objects.filter(pk=provider_id).update(probe_until=None)
            )
        return OPEN if probe else ""

    def write() -> str:
        now = timezone.now()
        try:
            return count(now)
        except IntegrityError:  # the provider was deleted meanwhile: no breaker to keep
            return ""

    def count(now: datetime) -> str:
        with transaction.atomic():
            health, _ = ProviderHealth.objects.select_for_update().get_or_create(
                provider_id=provider_id
            )
            before = state_of(health, now)
            health.failures += 1
            health.last_error = error[:300]
            health.last_error_class = error_class
            health.last_failure_at = now
            outcome = ""
            if before == OPEN:
                outcome = OPEN
            elif before == HALF_OPEN or health.failures >= settings.AERO_LLM_BREAKER_FAILURES:
                health.open_until = now + timedelta(seconds=settings.AERO_LLM_BREAKER_COOLDOWN)
                health.opened_at = now
                health.probe_until = None
                outcome = OPENED
            health.save()
            return outcome

    return _own_transaction(write)


def resets(admission: Admission) -> bool:
    """Whether a success after this admission has anything to reset (a count, a probe)."""
    return admission.probe or admission.failures > 0


def succeeded(provider_id: int, admission: Admission) -> str:
    """A call answered: the count goes back to 0 and an open or half-open breaker closes
    (RECLOSED). No query when nothing was counted (the usual case)."""
    if not resets(admission):
        return ""

    def write() -> str:
        with transaction.atomic():
            health = ProviderHealth.objects.select_for_update().filter(pk=provider_id).first()
            if health is None:
                return ""
            before = state_of(health)
            health.failures = 0
            health.open_until = health.opened_at = health.probe_until = None
            health.save()
            return RECLOSED if before != CLOSED else ""

    return _own_transaction(write)


def _own_transaction[T](write: Callable[[], T]) -> T:
    """`write` committed at once: directly in autocommit (the LLM runner's database
    threads), else on a thread and connection of its own (a job's step group); on SQLite
    within the caller's transaction."""
    if not connection.in_atomic_block:
        return write()
    if connection.vendor == "sqlite":
        # SQLite has one writer, and the step's transaction (IMMEDIATE) holds it: another
        # connection waited out its 20 s timeout, then failed the step ("database is
        # locked"; the README's simulated demo stalled 20 s at its first 429). Embedded,
        # the count rides the step's transaction in a savepoint instead.
        with transaction.atomic():
            return write()
    result: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(write())
        except BaseException as exc:  # handed back to the caller's thread
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name="aero-breaker")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]
