"""The external systems an action reaches, simulated: each pack registers the systems
its actions reach (register_system) and says which system performs each action.

They behave like real APIs with idempotency keys: every request carries the key, the
first request with a key performs the effect and stores its response, a later request
with the same key performs nothing and gets the stored response back. Each call commits
on its own, outside the caller's transaction, as a remote system's write would: our
rollback cannot undo it (that is what the outbox is for, diagnosis/outbox.py).

`fault` is the test and fault-suite hook: a callable run before each request that may
raise ExternalUnavailable (a 503, a timeout) to simulate an outage."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from django.db import connection
from django.utils import timezone

from diagnosis.models import ExternalEffect

# Each system's reference prefix: the packs register the systems their actions reach.
PREFIXES: dict[str, str] = {}


def register_system(name: str, prefix: str) -> None:
    """A simulated system a pack's actions reach (from its AppConfig.ready())."""
    if PREFIXES.get(name, prefix) != prefix:
        raise RuntimeError(f"external system {name!r} is registered already")
    PREFIXES[name] = prefix


class ExternalUnavailable(Exception):
    """A transient failure (unreachable, 5xx, timeout): the same request may be retried
    with the same key."""


fault: Callable[[str, str, str], None] | None = None


def request(system: str, operation: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    """Send one request with its idempotency key; returns the system's response (the
    stored one when the key was seen before). Raises ExternalUnavailable."""
    if connection.in_atomic_block:
        # A remote write inside our transaction would be rolled back with it, which no
        # real system does: the outbox calls from outside any transaction.
        raise RuntimeError("external systems are called outside the database transaction")
    if fault is not None:
        fault(system, operation, key)
    table = ExternalEffect._meta.db_table
    # One statement, committed on its own: the first request with a key stores the
    # effect and its answer; a repeat only counts itself and gets the stored answer.
    with connection.cursor() as cursor:
        cursor.execute(
            f"""INSERT INTO {table}
                (system, operation, idempotency_key, request, response, requests, created_at)
                VALUES (%s, %s, %s, %s, %s, 1, %s)
                ON CONFLICT (idempotency_key)
                DO UPDATE SET requests = {table}.requests + 1
                RETURNING response""",
            [
                system,
                operation,
                key,
                json.dumps(body),
                json.dumps(_perform(system, operation, key)),
                timezone.now(),
            ],
        )
        (response,) = cursor.fetchone()
    return dict(json.loads(response) if isinstance(response, str) else response)


def _perform(system: str, operation: str, key: str) -> dict[str, Any]:
    """The remote side's answer: a reference number of its own, stable for the key."""
    prefix = PREFIXES[system]
    number = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 100_000
    return {"reference": f"{prefix}-{number:05d}", "accepted": operation}
