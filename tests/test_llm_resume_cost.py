"""What one job costs when it resumes a session after a model call: a model-bound
session is a few such jobs, so their queries and the checkpointer's statements are
pinned here, where load does not change them. The session
is the bench's: the worked example with ReAct on, a scripted model answering at once;
no runner runs between the jobs but the one this test drives."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver

from diagnosis import jobs
from diagnosis.actions import do_create_session
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.events import fenced
from diagnosis.jobs import enqueue as job_enqueue
from diagnosis.jobs import job, lease
from diagnosis.llm_runner import Runner
from diagnosis.models import AgentRun, Event, LLMCall, LLMRequest, Session, SessionStatus
from scenarios_admin.models import Scenario
from tests.llm_helpers import fake_llm, fake_provider

__all__ = ["fake_llm"]  # the fixture

pytestmark = pytest.mark.services

MESSAGE = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"
# The bench's model (bench/llm_bound.py), without its latency.
SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "match": {"has_tools": False},
            "usage": {"prompt_tokens": 420, "completion_tokens": 96},
            "json": {
                "flight_no": {"value": "CA1234", "quote": "CA1234"},
                "position": {"value": "105", "quote": "105机位"},
                "fluid_type": {"value": "FUEL", "quote": "燃油泄漏"},
                "engine_status": {"value": "RUNNING", "quote": "发动机仍在运转"},
                "continuous": {"value": True, "quote": "还在持续漏"},
            },
        },
        {
            "match": {"after_tool": "lookup_stand_location"},
            "content": "Assessing the risk.",
            "tool_calls": [{"name": "assess_risk", "arguments": {}}],
        },
        {
            "match": {"after_tool": "assess_risk"},
            "content": "Working out the impact.",
            "tool_calls": [{"name": "analyze_impact", "arguments": {}}],
        },
        {
            "match": {"after_tool": "analyze_impact"},
            "content": "Proposing the response actions.",
            "tool_calls": [
                {"name": "notify_atc", "arguments": {"message": "Fuel spill at 105"}},
                {"name": "dispatch_cleanup_crew", "arguments": {"position": "105"}},
            ],
        },
        {
            "match": {"has_tools": True},
            "content": "Looking up the flight and the stand first.",
            "tool_calls": [
                {"name": "lookup_aircraft_info", "arguments": {"flight_no": "CA1234"}},
                {"name": "lookup_flight_plan", "arguments": {"flight_no": "CA1234"}},
                {"name": "lookup_stand_location", "arguments": {"position": "105"}},
            ],
        },
    ]
}
# Today's counts plus a small margin: lower them as the resume gets cheaper,
# never raise them. Django's queries of one job that resumes after a model call and
# stops at the next one (the steps in between are the other engineers' budgets: the
# worst such job here runs one ReAct step and its tools). No margin: the answered
# request kept for the node, the job's start and end in one statement each with its
# root run, the model request one fenced statement and the provider configs read only
# when their stamp changed each save a statement, and so does the answered request
# read with the job's known keys, and a step group's node runs inserted by its events'
# statement, which needs no locking read of the session row before it, and the
# compliance check run inside the tool step before it (no savepoint of its own): any of
# them coming undone fails here.
RESUME_TO_NEXT_MODEL_WAIT = 18
# The job that ends at the human wait (the proposals, the R0 action's effect, the
# approvals): its move to waiting_user is written with its last group, its state is
# not read again after the run, its start and end are one statement each, and each
# group's node runs ride its events' statement, without a locking read before it.
RESUME_TO_FIRST_APPROVAL = 35
# The checkpointer's calls per such job: the state asked for twice (what the job waits
# for, then the run) and read from the database once, one write at exit, no
# prune.
CHECKPOINTER_CALLS = Counter({"get_tuple": 2, "read": 1, "put": 1, "put_writes": 1})


@pytest.fixture(autouse=True)
def react_with_waits(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.AERO_LLM_WAITS = True
    settings.AERO_LLM_REACT = True
    settings.AERO_LLM_STREAM_FLUSH = 0.05
    # This test runs the runner itself, between the jobs it measures.
    monkeypatch.setattr(job_enqueue, "run_pending_inline", lambda session_id: False)


@pytest.fixture
def checkpointer_calls() -> Iterator[Counter[str]]:
    """The checkpointer's reads, writes and prunes, counted by method."""
    saver = jobs.agent_graph().checkpointer
    counts: Counter[str] = Counter()
    names = ("get_tuple", "list", "put", "put_writes", "prune", "delete_thread")
    originals = {name: getattr(saver, name) for name in names}

    def counting(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return originals[name](*args, **kwargs)

        return call

    for name in names:
        setattr(saver, name, counting(name))
    # The reads that reach the database: LangGraph's own method, under AERO's saver.
    base = PostgresSaver.get_tuple

    def read(self: Any, config: Any) -> Any:
        counts["read"] += 1
        return base(self, config)

    PostgresSaver.get_tuple = read  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        PostgresSaver.get_tuple = base  # type: ignore[method-assign]
        for name in names:
            delattr(saver, name)  # the instance attribute: the class's method again


def run_the_runner(*, enqueue: bool = False) -> int:
    """The runner's pending calls, made now; `enqueue`: as `aero_llm_runner` runs it,
    each reply enqueues its session's job."""
    made: list[int] = []

    def target() -> None:
        try:
            made.append(
                asyncio.run(
                    Runner(
                        enqueue=jobs.dispatch_after_commit if enqueue else None
                    ).process_pending_now()
                )
            )
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=60)
    return made[0] if made else 0


def test_a_job_that_resumes_after_a_model_call_stays_within_budget(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    checkpointer_calls: Counter[str],
) -> None:
    fake_llm.set_script(SCRIPT)
    fake_provider(fake_llm)
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )
    resumes: list[tuple[str, int, Counter[str], float]] = []
    for _ in range(10):
        if not run_the_runner():
            break
        checkpointer_calls.clear()
        started = time.process_time()
        with CaptureQueriesContext(connection) as queries:
            status = jobs.advance_session(str(session.pk))
        cpu_ms = (time.process_time() - started) * 1000
        resumes.append((status, len(queries), Counter(checkpointer_calls), cpu_ms))
    for status, count, calls, cpu_ms in resumes:
        print(f"resume job: {status}, {count} queries, checkpointer {dict(calls)}, {cpu_ms:.0f} ms")

    # What a user sees: every model call made once, and the session at its approvals.
    session.refresh_from_db()
    assert session.status == SessionStatus.WAITING_USER
    assert session.snapshot["risk"]["rule"] == "OS-01"
    assert LLMRequest.objects.filter(session=session, status="done").count() == 5
    assert LLMCall.objects.filter(session=session, status="ok").count() == 5
    assert len(fake_llm.requests) == 5
    made = LLMCall.objects.filter(session=session)
    assert session.tokens_in == sum(c.tokens_in for c in made)  # each call counted once
    assert session.tokens_out == sum(c.tokens_out for c in made)
    seqs = list(Event.objects.filter(session=session).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    # A model wait is no status change: the timeline shows one run, then the approvals.
    statuses = [
        e.payload["to"]
        for e in Event.objects.filter(session=session, type="session.status_changed").order_by(
            "seq"
        )
    ]
    assert statuses == ["running", "waiting_user"]

    # What each resume cost: the jobs that stop at the next model call.
    model_waits = [r for r in resumes if r[0] == jobs.WAITING_MODEL]
    assert len(model_waits) == 4 and resumes[-1][0] == SessionStatus.WAITING_USER
    for _, count, calls, _ in model_waits:
        assert count <= RESUME_TO_NEXT_MODEL_WAIT
        assert calls == CHECKPOINTER_CALLS
    _, count, calls, _ = resumes[-1]
    assert count <= RESUME_TO_FIRST_APPROVAL
    # Each job's root run ended with its lease, saying where the job left the session.
    roots = AgentRun.objects.filter(session=session, parent__isnull=True).order_by("pk")
    assert [(r.status, r.output_summary["status"]) for r in roots][-len(resumes) :] == [
        ("completed", status) for status, *_ in resumes
    ]
    assert all(r.ended_at is not None for r in roots)
    # Each root run, inserted with its lease, says what the job found and ran on.
    for r in roots:
        assert r.agent_name == "incident_agent" and r.mode == "react"
        assert r.input_snapshot["status"] in (SessionStatus.QUEUED, SessionStatus.RUNNING)
        assert {"pid", "host", "backend", "lease"} <= set(r.input_snapshot)
    # The state read once; no prune: the maintenance loop's, once it has waited.
    assert calls == CHECKPOINTER_CALLS
    assert Session.objects.get(pk=session.pk).lease_token is None


def test_a_job_at_a_model_wait_reads_its_state_without_a_snapshot(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    checkpointer_calls: Counter[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that resumes at a model wait (or starts a new session) reads its state from
    the checkpoint tuple (`first_state`): no LangGraph state snapshot, whose preparing of
    the next tasks the run does again. What it reads is what the snapshot says (LangGraph's
    writes, pinned here), and the checkpoint is still read from the database once."""
    fake_llm.set_script(SCRIPT)
    fake_provider(fake_llm)
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )
    graph = jobs.agent_graph()
    config: Any = {"configurable": {"thread_id": str(session.pk)}}
    snapshots: list[str] = []
    get_state = type(graph).get_state

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        snapshots.append("get_state")
        return get_state(self, *args, **kwargs)

    resumed = 0
    for _ in range(10):
        if not run_the_runner():
            break
        # The light read and the snapshot agree: no state yet, or the same wait at the
        # same checkpoint.
        light = job.SavedState.of(graph.checkpointer.get_tuple(config), config)
        snapshot = graph.get_state(config)
        assert light is not None
        if not snapshot.values:
            assert light.values == {} and light.interrupts == () and not snapshot.interrupts
        else:
            assert light.values and snapshot.interrupts
            assert light.interrupts[0].value == snapshot.interrupts[0].value
            assert light.interrupts[0].value["kind"] == "model"
            assert (
                light.config["configurable"]["checkpoint_id"]
                == (snapshot.config["configurable"]["checkpoint_id"])
            )
        checkpointer_calls.clear()
        with monkeypatch.context() as patched:
            patched.setattr(type(graph), "get_state", counted)
            jobs.advance_session(str(session.pk))
        assert snapshots == []
        assert checkpointer_calls == CHECKPOINTER_CALLS
        resumed += 1
    assert resumed == 5
    session.refresh_from_db()
    assert session.status == SessionStatus.WAITING_USER

    # At a human wait the job asks LangGraph, still reading the checkpoint once: the
    # read it handed to the snapshot is kept for the run.
    approval = graph.get_state(config)
    assert approval.interrupts[0].value["kind"] == "approval"
    assert job.SavedState.of(graph.checkpointer.get_tuple(config), config) is None
    checkpointer_calls.clear()
    with fenced(str(session.pk), uuid.uuid4()):
        state = job.first_state(graph, config)
        assert graph.checkpointer.get_tuple(config) is not None
    assert state.interrupts[0].value == approval.interrupts[0].value
    # Asked three times (the job, its snapshot, here the run's read), read once.
    assert checkpointer_calls == Counter({"get_tuple": 3, "read": 1})


def test_a_runs_exit_checkpoint_and_its_pending_writes_are_one_transaction(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's run saves its exit checkpoint and its pending writes in one transaction
    with one check of the lease (`exit_writes`), and a pending write that fails leaves
    the checkpoint unsaved too: the next job resumes from the one before."""
    fake_llm.set_script(SCRIPT)
    fake_provider(fake_llm)
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )
    checks: list[str] = []
    execute = psycopg.Cursor.execute

    def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if "SELECT lease_token FROM diagnosis_session" in str(query):
            checks.append(str(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    statuses = []
    for _ in range(10):
        if not run_the_runner():
            break
        checks.clear()
        statuses.append(jobs.advance_session(str(session.pk)))
        assert len(checks) == 1  # the checkpoint, then its pending writes: one check
    assert statuses[-1] == SessionStatus.WAITING_USER and len(statuses) == 5

    # The checkpoint saved, its pending writes refused: neither is saved.
    saver = jobs.agent_graph().checkpointer
    config = {"configurable": {"thread_id": str(session.pk), "checkpoint_ns": ""}}
    before = saver.get_tuple(config)
    assert before is not None
    token = lease.acquire_lease(session.pk)
    assert token is not None

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("pending writes refused")

    try:
        with (
            monkeypatch.context() as patched,
            fenced(str(session.pk), token),
            pytest.raises(RuntimeError),
            saver.exit_writes(),
        ):
            patched.setattr(saver, "_dump_writes", refused)
            saved = saver.put(config, empty_checkpoint(), {"source": "loop", "step": 9}, {})
            saver.put_writes(saved, [("consumed_seq", 1)], "task")
    finally:
        lease.release_lease(session.pk, token)
    after = saver.get_tuple(config)
    assert after is not None and after.checkpoint["id"] == before.checkpoint["id"]

    # Only the job's own graph's write holds its transaction: a subgraph's (its own
    # namespace, written while the run goes on) commits at once, the saver's lock free.
    token = lease.acquire_lease(session.pk)
    assert token is not None
    child = {"configurable": {"thread_id": str(session.pk), "checkpoint_ns": "child:1"}}
    try:
        with fenced(str(session.pk), token), saver.exit_writes():
            saver.put(child, empty_checkpoint(), {"source": "loop", "step": 1}, {})
            assert saver.lock.acquire(blocking=False)
            saver.lock.release()
            saver.put(config, empty_checkpoint(), {"source": "loop", "step": 9}, {})
            assert not saver.lock.acquire(blocking=False)  # held until the block ends
        assert saver.lock.acquire(blocking=False)
        saver.lock.release()
    finally:
        lease.release_lease(session.pk, token)
        saver.delete_thread(str(session.pk))


# The bench's model (bench/llm_bound.py), without its latency: 3 calls per session, the
# lookups, the risk and the impact asked in one reply.
THREE_CALLS: dict[str, Any] = {
    "rules": [
        SCRIPT["rules"][0],
        SCRIPT["rules"][3],
        {
            **SCRIPT["rules"][4],
            "tool_calls": [
                *SCRIPT["rules"][4]["tool_calls"],
                {"name": "assess_risk", "arguments": {}},
                {"name": "analyze_impact", "arguments": {}},
            ],
        },
    ]
}


def test_the_steps_after_a_model_turn_are_one_transaction_and_the_next_turn_sees_it(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    """With model calls as waits, a session a model reasons for groups the steps between
    its model's turns like any other session: the job that runs the model's
    tools commits its reasoning step, then the tools, the compliance check and the next
    reasoning step up to its model wait as one transaction. The next turn's request still
    carries the model's earlier turn and every tool result, in order."""
    fake_llm.set_script(THREE_CALLS)
    fake_provider(fake_llm)
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )
    commits: list[int] = []
    for _ in range(10):
        if not run_the_runner():
            break
        with CaptureQueriesContext(connection) as queries:
            jobs.advance_session(str(session.pk))
        commits.append(sum(q["sql"] == "COMMIT" for q in queries.captured_queries))

    session.refresh_from_db()
    assert session.status == SessionStatus.WAITING_USER
    assert len(fake_llm.requests) == 3
    # The third call (after the tools): the conversation holds the first turn, its five
    # calls answered by five tool results, in the order the model asked.
    messages = fake_llm.requests[2]["body"]["messages"]
    assistant = [m for m in messages if m["role"] == "assistant"]
    assert [c["function"]["name"] for c in assistant[0]["tool_calls"]] == [
        "lookup_aircraft_info",
        "lookup_flight_plan",
        "lookup_stand_location",
        "assess_risk",
        "analyze_impact",
    ]
    first = messages.index(assistant[0])
    results = messages[first + 1 : first + 6]
    assert [m["role"] for m in results] == ["tool"] * 5
    assert [m["tool_call_id"] for m in results] == [c["id"] for c in assistant[0]["tool_calls"]]
    # The job between the second and the third call: its reasoning step, the tools up
    # to the model wait in one group; its start is one statement with its root run. The
    # request is written after the checkpoint, one fenced statement in autocommit.
    assert commits[1] == 2
    # The request the tools' group wrote is the one the runner answered.
    assert LLMRequest.objects.filter(session=session, status="done").count() == 3


@pytest.fixture
def enqueued(settings: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The rq backend, its queue replaced by a list: the sessions enqueued, in order."""
    settings.AERO_JOB_BACKEND = "rq"
    pushed: list[str] = []

    def enqueue(session_id: str, *, at_front: bool = False) -> bool:
        pushed.append(session_id)
        return True

    monkeypatch.setattr(job_enqueue, "_enqueue_rq", enqueue)
    return pushed


def test_a_new_session_asks_the_model_before_any_job_runs(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    enqueued: list[str],
) -> None:
    """The opening message's extraction is recorded with the session: no job
    runs until the model has answered, and the job the reply enqueues starts the session
    and goes on to the next model call. Each call is made once and counted once; three
    calls take three jobs, not four."""
    fake_llm.set_script(THREE_CALLS)
    fake_provider(fake_llm)
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )
    assert enqueued == []  # nothing for a worker to do yet
    (request,) = LLMRequest.objects.filter(session=session)
    message = Event.objects.get(session=session, type="user.message")
    assert request.key == f"extract:{session.pk}:{message.seq}"
    assert request.status == "pending" and request.purpose == "extract"
    sent = request.request["messages"]
    assert sent[-1]["data"]["content"] == MESSAGE  # what the parser would send
    assert Session.objects.get(pk=session.pk).status == SessionStatus.QUEUED
    assert jobs.stalled_sessions() == []  # the reconciler leaves it to the runner

    jobs_run: list[tuple[str, int]] = []
    for _ in range(10):
        before = len(enqueued)
        if not run_the_runner(enqueue=True):
            break
        assert enqueued[before:] == [str(session.pk)]  # the reply enqueued the session
        with CaptureQueriesContext(connection) as queries:
            status = jobs.advance_session(str(session.pk))
        jobs_run.append((status, len(queries)))

    session.refresh_from_db()
    assert session.status == SessionStatus.WAITING_USER
    assert [status for status, _ in jobs_run] == [
        jobs.WAITING_MODEL,
        jobs.WAITING_MODEL,
        SessionStatus.WAITING_USER,
    ]
    assert len(fake_llm.requests) == 3
    assert LLMCall.objects.filter(session=session, status="ok").count() == 3
    made = LLMCall.objects.filter(session=session)
    assert session.tokens_in == sum(c.tokens_in for c in made)
    assert session.snapshot["risk"]["rule"] == "OS-01"
    # The first job starts the session and resumes after the reply in one: within the
    # budget of a resume.
    assert jobs_run[0][1] <= RESUME_TO_NEXT_MODEL_WAIT
    statuses = [
        e.payload["to"]
        for e in Event.objects.filter(session=session, type="session.status_changed").order_by(
            "seq"
        )
    ]
    assert statuses == ["running", "waiting_user"]


@pytest.mark.parametrize(
    "setup",
    ["offline only", "calls inside the job"],
)
def test_a_new_session_that_needs_no_wait_is_queued_at_once(
    setup: str,
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    enqueued: list[str],
    settings: Any,
) -> None:
    """The offline provider needs no wait; in the blocking design (no runner) the job
    makes the call itself: either way no request, and the first job is enqueued."""
    if setup == "calls inside the job":
        settings.AERO_LLM_WAITS = False
        fake_provider(fake_llm)
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )
    assert enqueued == [str(session.pk)]
    assert not LLMRequest.objects.filter(session=session).exists()


def test_an_opening_call_that_cannot_be_made_goes_to_the_first_job(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    enqueued: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A provider that fails before its call can wait (its client cannot be built) does
    not fail the operator's request: the session is created and queued, and its job
    makes the call and records the failure and the fallback, as for any call."""
    from diagnosis.agent import providers

    fake_provider(fake_llm)

    def broken(config: Any) -> Any:
        raise RuntimeError("the provider's client cannot be built")

    monkeypatch.setattr(providers, "client_for", broken)
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )
    assert enqueued == [str(session.pk)]
    assert not LLMRequest.objects.filter(session=session).exists()
    assert Event.objects.filter(session=session, type="user.message").count() == 1


# The web request that creates a session a model reads: the session, its first
# events, the audit entry, and the opening request with the provider configs and the
# topology's stamp it is built from. Today's count, no margin.
CREATE_WITH_OPENING_REQUEST = 18


def test_creating_a_session_with_its_opening_request_stays_within_budget(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    enqueued: list[str],
) -> None:
    fake_provider(fake_llm)
    olga = make_user("olga", "operator")
    scenario = Scenario.objects.get(slug="oil_spill")
    do_create_session(olga, scenario, MESSAGE)  # the process's caches warm, as a web's
    with CaptureQueriesContext(connection) as queries:
        session = do_create_session(olga, scenario, MESSAGE)
    assert LLMRequest.objects.filter(session=session).count() == 1
    assert len(queries) <= CREATE_WITH_OPENING_REQUEST
    # The audit trail's chain lock is taken last: held only for the audit
    # entry and the commit, not while the request is built, so sessions opened together
    # are not created one after the other.
    sqls = [q["sql"] for q in queries.captured_queries]
    (lock,) = [i for i, sql in enumerate(sqls) if "pg_advisory_xact_lock" in sql]
    after = sqls[lock + 1 :]
    assert len(after) == 3 and "aero_auditlog" in after[1] and after[-1] == "COMMIT"


def test_a_job_reads_the_provider_configs_only_when_one_changed(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User]
) -> None:
    """The configs' stamp comes with the lease; a job whose stamp is the last
    read's reads nothing, and any change to a config (an edit; one disabled by a bulk
    update, which no `updated_at` records) is read by the next job."""
    from diagnosis.agent.providers import OpenAICompatibleProvider, configured_providers
    from scenarios_admin.models import ProviderConfig

    config = fake_provider(fake_llm)
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )

    def a_jobs_providers() -> tuple[list[str], int]:
        taken = lease.take_lease(str(session.pk), root={})
        assert taken is not None
        token, leased = taken
        with CaptureQueriesContext(connection) as queries:
            chain = configured_providers(leased.providers_stamp)  # type: ignore[attr-defined]
        lease.release_lease(str(session.pk), token)
        models = [p.model for p in chain if isinstance(p, OpenAICompatibleProvider)]
        return models, len(queries)

    models, _ = a_jobs_providers()
    assert models == [config.model]
    assert a_jobs_providers() == ([config.model], 0)  # unchanged: nothing read
    config.model = "fake-2"
    config.save()
    assert a_jobs_providers() == (["fake-2"], 1)
    ProviderConfig.objects.filter(pk=config.pk).update(enabled=False)
    assert a_jobs_providers() == ([], 1)
