"""Model calls as waits, the job's side: the request row a job records when the graph
stops at a model call (fenced by its lease), the check whether it is answered, and the
opening extraction recorded with a new session (diagnosis.llm_runner answers them)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from aero.compiled import Arg, Compiled, cached_sql, insert_values
from aero.packs import pack_for
from diagnosis.agent import waits
from diagnosis.agent.child_agents import WAIT_KIND as CHILDREN
from diagnosis.agent.fallback import call_with_fallback
from diagnosis.agent.providers import OfflineProvider, Provider, configured_providers
from diagnosis.events import (
    LeaseLost,
    check_fence,
    current_fence,
    current_known,
    lock_session,
)
from diagnosis.jobs.world import definition_of, world_of
from diagnosis.models import (
    Event,
    LLMRequest,
    LLMRequestStatus,
    Session,
)

logger = logging.getLogger("diagnosis.jobs")


# Twice per job that resumes after a model call: compiled once per connection.
_answered = Compiled(
    LLMRequest,
    lambda: (
        LLMRequest.objects.filter(key=Arg(0))
        .exclude(status=LLMRequestStatus.PENDING)
        .only("key", "status", "reply", "error", "answered_by")
        .order_by("pk")[:1]
    ),
)


def model_answered(key: str, session_id: Any = None) -> bool:
    """Whether the request `key` is answered. The row is read whole and kept for the
    job's node that reads the reply next (`waits.answered_requests`): one query, not two.
    A job's first read (`session_id`: its session) is the statement that loads its known
    keys, which its steps read next anyway: one query, not two again."""
    known = current_known(session_id) if session_id is not None else None
    loaded, row = known.answered(key) if known is not None else (False, None)
    if not loaded:
        row = _answered.first(key)
    if row is not None:
        waits.keep_answered(row)
    return row is not None


def request_answered(waiting: dict[str, Any], session_id: Any = None) -> bool:
    """Whether what a job's request wait waits for is answered: the model's (or a slow
    tool's) reply, or every child of a wait for child agents."""
    if waiting.get("kind") == CHILDREN:
        keys = [c["key"] for c in waiting["children"]]
        return not LLMRequest.objects.filter(key__in=keys, status=LLMRequestStatus.PENDING).exists()
    return model_answered(waiting["key"], session_id)


def record_model_request(session_id: Any, waiting: dict[str, Any]) -> None:
    """The request a node interrupted with, as the runner's row (once by its key: a
    re-run of the job finds it). Fenced: only the lease holder records it. A wait for
    child agents records a row per child (their jobs: child_jobs.record_wait)."""
    if waiting.get("kind") == CHILDREN:
        for child in waiting["children"]:
            record_model_request(session_id, {**child, "providers": []})
        return
    row = LLMRequest(
        key=waiting["key"],
        session_id=session_id,
        purpose=waiting.get("purpose", ""),
        request=waiting["request"],
        providers=waiting.get("providers", []),
        agent_run_id=waiting.get("run"),
    )
    fence = current_fence(session_id)
    connection = transaction.get_connection()
    if (
        fence is not None
        and fence.claim is None
        and connection.vendor == "postgresql"
        and not connection.in_atomic_block
    ):
        # ONE statement in autocommit, not a transaction of four (BEGIN, the
        # row lock, the INSERT, COMMIT): the session row share-locked and the lease
        # checked in the statement itself, the row inserted only if the lease holds.
        sql, _ = cached_sql(
            connection, ("fenced_request",), lambda: _fenced_request_sql(connection)
        )
        params = [session_id, fence.token, *insert_values(LLMRequest, [row], connection)]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            (held,) = cursor.fetchone()
        if not held:
            raise LeaseLost(f"session {session_id}: lease {fence.token} is no longer held")
        return
    with transaction.atomic():
        check_fence(lock_session(session_id))
        # One statement (INSERT ... ON CONFLICT DO NOTHING), not a read, a savepoint and
        # an insert: a re-run finds its row by the unique key.
        LLMRequest.objects.bulk_create([row], ignore_conflicts=True)


def _fenced_request_sql(connection: Any) -> tuple[str, list[Any]]:
    """The request's INSERT if the session's lease is the job's: its values are the
    session, the token, then the row's. The share lock makes a concurrent move of the
    lease wait for this statement, or this statement re-check the row after it (READ
    COMMITTED), as the row lock of the transaction it replaces did. Returns whether the
    lease held (the row may have been there already: a re-run)."""
    quote = connection.ops.quote_name
    session = Session._meta
    fields = [f for f in LLMRequest._meta.concrete_fields if f is not LLMRequest._meta.pk]
    # Typed: the values of an INSERT ... SELECT are not typed by their columns.
    values = ", ".join(f"CAST(%s AS {f.db_type(connection)})" for f in fields)
    columns = ", ".join(quote(f.column) for f in fields)
    return (
        f"WITH fence AS (SELECT 1 FROM {quote(session.db_table)}"
        f" WHERE {quote(session.pk.column)} = %s"
        f" AND {quote(session.get_field('lease_token').column)} = %s FOR SHARE),"
        f" inserted AS (INSERT INTO {quote(LLMRequest._meta.db_table)} ({columns})"
        f" SELECT {values} FROM fence ON CONFLICT DO NOTHING RETURNING 1)"
        " SELECT EXISTS (SELECT 1 FROM fence)",
        [],
    )


def request_opening_extraction(session: Session, message: Event) -> bool:
    """With model calls as waits: record the extraction of a new session's opening
    message as the runner's request, in the transaction that creates the session, so
    that the session needs no job until the model has answered. The request is
    what the input parser would ask (its own call path, run up to the wait) under the
    key the parser uses for that message; the runner enqueues the session's first job
    with the reply, and that job reads it as a resume does. Returns whether a request was
    recorded: not without waits, nor when only the offline provider is configured (it
    needs no wait)."""
    if not waits.waits_enabled():
        return False
    providers = configured_providers()
    if all(isinstance(p, OfflineProvider) for p in providers):
        return False
    definition = definition_of(session)
    if not pack_for(definition["kind"]).opens_from_message:
        return False  # its pack reads no opening message with a model
    text = message.payload.get("text", "")
    world = world_of(definition["kind"])

    def extract(provider: Provider) -> Any:
        return provider.extract(definition, text, world, None)

    def not_here(*args: Any) -> None:
        # The call failed before it could wait (a provider config that cannot be used,
        # say): the job makes it, and records the attempt and the fallback as always.
        raise _NotRequested()

    try:
        with transaction.atomic():  # a failure here leaves the session's creation whole
            waiting = waits.request_outside_graph(
                session.pk,
                waits.extraction_key(session.pk, message.seq),
                lambda: call_with_fallback(providers, "extract", extract, not_here, not_here),
            )
            if waiting is None:
                return False
            record_model_request(session.pk, waiting)
    except Exception:
        logger.warning(
            "session %s: its opening extraction goes to its first job", session.pk, exc_info=True
        )
        return False
    return True


class _NotRequested(Exception):
    pass
