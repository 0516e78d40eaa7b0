"""A runner's claims on pending model requests (a lease of its own per request, renewed by
its heartbeat, run out when it is killed), its heartbeat row, and the pruning of the
requests ended sessions no longer need."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import BooleanField, F, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from diagnosis.agent.child_agents import PURPOSE_PREFIX as CHILD_PURPOSE
from diagnosis.models import (
    LLMRequest,
    LLMRequestStatus,
    SessionStatus,
    WorkerBeat,
)
from scenarios_admin.models import ProviderConfig, ProviderHealth

BEAT_PREFIX = "llm-runner:"


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
    # The breaker rows of its providers that are not plain closed (failures counted, or
    # open), as the claim read them; None where the claim cannot read them (SQLite): the
    # chain reads them itself. A provider absent from it is closed with no failure.
    provider_health: dict[int, ProviderHealth] | None = None
    # The agent run that asked: its node shows the stream, its calls count under it.
    run: int | None = None
    buffer: list[str] = field(default_factory=list)
    attempts: int = 0  # attempts recorded under this claim (their keys' counter)
    # The call's writes, in order: its streamed text never lands after its reply.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def claim(limit: int, session_id: Any = None, held: frozenset[str] = frozenset()) -> list[Claimed]:
    """Claim up to `limit` pending requests nobody holds (or whose claim ran out), never
    one of `held` (this runner's own, in flight: a late renewal must not restart them).
    Each claimed row gets a token of its own. On PostgreSQL ONE statement:
    UPDATE ... WHERE pk IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING, in autocommit;
    it was a transaction with a SELECT and one UPDATE per row (a poll that found nothing
    was still BEGIN, SELECT, COMMIT)."""
    now = timezone.now()
    expires = now + timedelta(seconds=settings.AERO_LLM_CLAIM_SECONDS)
    rows = (
        LLMRequest.objects.filter(status=LLMRequestStatus.PENDING)
        .filter(Q(claim_token__isnull=True) | Q(claim_expires_at__lt=now))
        # A child agent's row is its job's (diagnosis.jobs.child_jobs), not a call.
        .exclude(purpose__startswith=CHILD_PURPOSE)
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
    health = connection.ops.quote_name(ProviderHealth._meta.db_table)
    # gen_random_uuid(): a token per row, drawn by PostgreSQL (13+), so that every check
    # keys on (pk, token) exactly as before. `provider_versions`: the request's enabled
    # provider configs as "id:xmin": xmin changes with every write of the row
    # (the admin's, a queryset update, the key rotation), so the runner rebuilds a
    # provider only when its row changed, and reads no ProviderConfig per call.
    claimed = LLMRequest.objects.raw(
        f"UPDATE {table} SET claim_token = gen_random_uuid(), claim_expires_at = %s,"
        " claims = claims + 1, \"text\" = ''"
        f" WHERE id IN ({pick_sql})"
        " RETURNING id, key, session_id, claim_token, claims, purpose, request, providers,"
        " agent_run_id,"
        " created_at,"
        f" (SELECT array_agg(p.id::text || ':' || p.xmin::text) FROM {configs} p"
        f" WHERE p.enabled AND {table}.providers @> to_jsonb(p.id)) AS provider_versions,"
        # The breakers that are not plain closed, read in the same statement: a closed
        # provider (the usual case) costs the call no query of its own.
        " (SELECT array_agg(h.provider_id::text || ':' || h.failures::text || ':'"
        " || coalesce(extract(epoch FROM h.open_until)::text, '')"
        " || ':' || coalesce(extract(epoch FROM h.probe_until)::text, ''))"
        f" FROM {health} h WHERE (h.failures > 0 OR h.open_until IS NOT NULL)"
        f" AND {table}.providers @> to_jsonb(h.provider_id)) AS provider_health",
        (expires, *pick_params),
    )
    # RETURNING follows no order: the calls start oldest first, as the SELECT had them.
    calls: list[Claimed] = []
    for row in sorted(claimed, key=lambda row: (row.created_at, row.pk)):
        assert row.claim_token is not None  # set by this very statement
        call = _claimed(row, row.claim_token, row.claims)
        pairs = (item.split(":") for item in row.provider_versions or ())  # type: ignore[attr-defined]
        call.provider_versions = {int(pk): version for pk, version in pairs}
        call.provider_health = dict(
            _health_row(item)
            for item in row.provider_health or ()  # type: ignore[attr-defined]
        )
        calls.append(call)
    return calls


def _health_row(item: str) -> tuple[int, ProviderHealth]:
    """One "id:failures:open_until:probe_until" of the claim (epoch seconds or empty)."""
    pk, failures, open_until, probe_until = item.split(":")

    def when(epoch: str) -> datetime | None:
        return datetime.fromtimestamp(float(epoch), tz=UTC) if epoch else None

    health = ProviderHealth(
        provider_id=int(pk),
        failures=int(failures),
        open_until=when(open_until),
        probe_until=when(probe_until),
    )
    return int(pk), health


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
        run=row.agent_run_id,
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


def locked_claim(call: Claimed) -> LLMRequest:
    row = (
        LLMRequest.objects.select_for_update()
        .filter(pk=call.pk, claim_token=call.token, status=LLMRequestStatus.PENDING)
        .first()
    )
    if row is None:
        raise ClaimLost(call.key)
    return row


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
