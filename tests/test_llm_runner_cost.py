"""What the LLM runner's writes cost per model call (issue 11 item 9): the bench
makes 600 calls, each a claim, maybe failed attempts, and a reply; their statements are
pinned here, where load does not change them, with what each must still guarantee: the
claim fence (a runner without the claim writes nothing), the attempt and the reply in
one transaction, the attempt once by its key and its tokens counted once, the job
enqueued unless a job holding the lease will see the reply."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from langchain_core.messages import AIMessage

from diagnosis.actions import do_create_session
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.agent.providers import OpenAICompatibleProvider, ProviderError, Usage
from diagnosis.jobs import enqueue as job_enqueue
from diagnosis.llm_runner import claims, records
from diagnosis.models import Event, LLMCall, LLMRequest, Session
from scenarios_admin.models import ProviderConfig, Scenario
from tests.llm_helpers import fake_llm, fake_provider

__all__ = ["fake_llm"]  # the fixture

pytestmark = pytest.mark.services

MESSAGE = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"
REPLY = '{"flight_no": {"value": "CA1234", "quote": "CA1234"}}'
USAGE = Usage(120, 30, Decimal("0.0018"))


@pytest.fixture(autouse=True)
def model_waits(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.AERO_LLM_WAITS = True
    settings.AERO_LLM_REACT = False  # one extraction call: one pending request
    # The job's side alone: the test plays the runner, one write at a time.
    monkeypatch.setattr(job_enqueue, "run_pending_inline", lambda session_id: False)


class Dispatched(list[tuple[str, bool]]):
    """The runner's enqueues after commit (session, whether it read the lease itself)."""

    def __call__(self, session_id: Any, *, lease_read: bool = False) -> bool:
        self.append((str(session_id), lease_read))
        return True


@pytest.fixture
def dispatched() -> Dispatched:
    return Dispatched()


@pytest.fixture
def pending(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> tuple[Session, OpenAICompatibleProvider]:
    provider = OpenAICompatibleProvider(fake_provider(fake_llm))
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )
    assert LLMRequest.objects.get(session=session).status == "pending"
    return session, provider


def llm_events(session: Session) -> list[tuple[str, str]]:
    return [
        (e.type, e.key)
        for e in Event.objects.filter(session=session, type__startswith="llm.").order_by("seq")
    ]


def test_a_claim_is_one_statement_and_a_token_per_request(
    pending: tuple[Session, OpenAICompatibleProvider],
) -> None:
    with CaptureQueriesContext(connection) as claiming:
        (call,) = claims.claim(10)
    # UPDATE ... RETURNING in autocommit (BEGIN, SELECT, an UPDATE per row, COMMIT before).
    assert len(claiming) == 1, [q["sql"] for q in claiming]
    row = LLMRequest.objects.get(pk=call.pk)
    assert (call.token, call.claims, row.claims, row.text) == (row.claim_token, 1, 1, "")
    assert row.claim_expires_at is not None and row.claim_expires_at > timezone.now()
    assert (call.key, call.purpose, call.request) == (row.key, row.purpose, row.request)
    # The same statement read the enabled providers' row versions: the call's
    # chain is built once per version, then read from no table.
    (config,) = ProviderConfig.objects.filter(enabled=True)
    assert call.provider_ids == [config.pk] and set(call.provider_versions or {}) == {config.pk}
    records._providers.clear()
    with CaptureQueriesContext(connection) as building:
        (built,) = records.load_providers(call.provider_ids, call.provider_versions)
    assert len(building) == 1 and built.model == config.model
    with CaptureQueriesContext(connection) as loading:
        assert records.load_providers(call.provider_ids, call.provider_versions) == [built]
    assert len(loading) == 0  # 1 per call before
    # ...and the runner finds them on its loop, without a database thread; a row whose
    # version changed is read again.
    assert records.cached_providers(call.provider_ids, call.provider_versions) == [built]
    changed = {config.pk: "another version"}
    assert records.cached_providers(call.provider_ids, changed) is None
    assert records.cached_providers(call.provider_ids, {}) == []  # disabled: skipped

    # Held, it is not claimed again; a poll that finds nothing is one statement too.
    with CaptureQueriesContext(connection) as polling:
        assert claims.claim(10) == []
    assert len(polling) == 1  # 3 before
    # Its claim run out, another runner takes it over under a token of its own.
    LLMRequest.objects.filter(pk=call.pk).update(claim_expires_at=timezone.now())
    # ...but not by its own holder, whose renewal was only late (it has it in flight).
    with CaptureQueriesContext(connection) as holding:
        assert claims.claim(10, None, frozenset({call.key, "another"})) == []
    assert len(holding) == 1
    (again,) = claims.claim(10)
    assert again.claims == 2 and again.token != call.token
    with pytest.raises(claims.ClaimLost):
        records.write_deltas(call, "late")  # the first holder writes nothing more


def test_a_reply_is_five_statements_with_its_attempt_and_counted_once(
    pending: tuple[Session, OpenAICompatibleProvider], dispatched: Dispatched
) -> None:
    session, provider = pending
    (call,) = claims.claim(10)
    with CaptureQueriesContext(connection) as streaming:
        records.write_deltas(call, "{")
    # BEGIN, the request's UPDATE (the claim check), the session's locked read, one
    # write, COMMIT (no savepoint: the append runs in the caller's transaction).
    assert len(streaming) == 5, [q["sql"] for q in streaming]

    message = AIMessage(content=REPLY)
    with CaptureQueriesContext(connection) as finishing:
        records.finish_ok(call, provider, message, USAGE, 40, 1, dispatched, REPLY[1:])
    # BEGIN, the request's UPDATE, the session's locked read (with the key's lookup),
    # one statement for the session's UPDATE (seqs, counters) + the events + LLMCall,
    # COMMIT; no SELECT of the lease after the commit (the write read it under the lock).
    assert len(finishing) == 5, [q["sql"] for q in finishing]
    assert dispatched == [(str(session.pk), True)]

    request = LLMRequest.objects.get(pk=call.pk)
    assert (request.status, request.text, request.claim_token) == ("done", REPLY, None)
    key = f"llm.call:{call.key}:1:1"
    assert llm_events(session) == [("llm.delta", ""), ("llm.delta", ""), ("llm.call", key)]
    deltas = Event.objects.filter(session=session, type="llm.delta").order_by("seq")
    assert "".join(d.payload["text"] for d in deltas) == REPLY
    assert Event.objects.get(key=key).payload["text"] == REPLY
    assert list(LLMCall.objects.filter(session=session).values_list("status", "tokens_in")) == [
        ("ok", 120)
    ]
    session.refresh_from_db()
    assert (session.tokens_in, session.tokens_out, session.cost) == (120, 30, USAGE.cost)
    seqs = list(Event.objects.filter(session=session).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1)) and session.last_seq == seqs[-1]

    # The same attempt written again under the claim (a write whose commit the runner
    # never heard of, retried): its event is in the log, so nothing is counted again.
    LLMRequest.objects.filter(pk=call.pk).update(status="pending", claim_token=call.token)
    call.attempts = 0
    records.finish_ok(call, provider, message, USAGE, 40, 1, None)
    assert Event.objects.filter(session=session, type="llm.call").count() == 1
    assert LLMCall.objects.filter(session=session).count() == 1
    session.refresh_from_db()
    assert (session.tokens_in, session.tokens_out, session.cost) == (120, 30, USAGE.cost)


def test_a_failed_attempt_is_five_statements_and_a_lost_claim_writes_nothing(
    pending: tuple[Session, OpenAICompatibleProvider], dispatched: Dispatched
) -> None:
    session, provider = pending
    (call,) = claims.claim(10)
    error = ProviderError("invalid response", retryable=True, usage=Usage(10, 5, Decimal("1")))
    with CaptureQueriesContext(connection) as failing:
        records.record_failed_attempt(call, provider, error, 12, 1)
    # BEGIN, the request's locked read (the claim check), the session's, one write,
    # COMMIT.
    assert len(failing) == 5, [q["sql"] for q in failing]
    with CaptureQueriesContext(connection) as falling_back:
        records.record_fallback(call, "fake", "fake2", "invalid response", 0)
    assert len(falling_back) == 5, [q["sql"] for q in falling_back]
    session.refresh_from_db()
    assert (session.tokens_in, session.tokens_out, session.cost) == (10, 5, Decimal("1"))
    assert list(LLMCall.objects.filter(session=session).values_list("status", flat=True)) == [
        "error"
    ]

    # Another runner took the request over: this one's reply and failure write nothing.
    LLMRequest.objects.filter(pk=call.pk).update(claim_expires_at=timezone.now())
    claims.claim(10)
    before = llm_events(session)
    with pytest.raises(claims.ClaimLost):
        records.finish_ok(call, provider, AIMessage(content=REPLY), USAGE, 40, 2, dispatched, "}")
    with pytest.raises(claims.ClaimLost):
        records.finish_failed(call, "down", "fake", dispatched)
    assert llm_events(session) == before
    assert LLMCall.objects.filter(session=session).count() == 1
    assert LLMRequest.objects.get(pk=call.pk).status == "pending"
    assert dispatched == []


def test_no_job_is_enqueued_while_one_holds_the_lease(
    pending: tuple[Session, OpenAICompatibleProvider], dispatched: Dispatched
) -> None:
    """Read under the session's lock: the holder lets the lease go only after the reply
    commits, and then looks for answered requests itself (jobs.advance_session)."""
    session, provider = pending
    (call,) = claims.claim(10)
    Session.objects.filter(pk=session.pk).update(
        lease_token=call.token, lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    records.finish_ok(call, provider, AIMessage(content=REPLY), USAGE, 40, 1, dispatched)
    assert dispatched == []
    assert LLMRequest.objects.get(pk=call.pk).status == "done"
