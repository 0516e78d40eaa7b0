"""Fenced leases: a job's heartbeat keeps its lease through a long step; a job
paused past its lease loses it to the next job and, once it resumes, writes nothing;
checkpoint writes are fenced like the rest."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from langgraph.checkpoint.base import empty_checkpoint

from diagnosis import jobs
from diagnosis.actions import do_create_session
from diagnosis.agent.state import AgentContext
from diagnosis.events import LeaseLost, fenced
from diagnosis.jobs import lease, model_requests
from diagnosis.jobs.job import _config
from diagnosis.models import AgentRun, Event, LLMCall, LLMRequest, Session, ToolCall
from packs.airport.agent.nodes import reasoning
from scenarios_admin.models import Scenario

pytestmark = pytest.mark.services

MESSAGE = "MU5678 stand 101 hydraulic leak, engines off"  # the agent asks one question


@pytest.fixture
def session(
    builtin: None, clean_queue: None, settings: Any, make_user: Callable[..., User]
) -> Session:
    # rq backend: creating the session only enqueues; the test runs the jobs itself.
    settings.AERO_JOB_BACKEND = "rq"
    settings.AERO_LEASE_SECONDS = 5
    return do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )


class PausingPlanner:
    """The first planning step blocks until released, its job's heartbeat frozen (as if
    the whole worker process were paused); later ones plan as usual."""

    def __init__(self) -> None:
        self.paused = threading.Event()
        self.release = threading.Event()
        self.frozen: set[uuid.UUID] = set()
        self.calls = 0

    def plan(self, state: Any, ctx: AgentContext) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 1:
            token = Session.objects.get(pk=ctx.session_id).lease_token
            assert token is not None
            self.frozen.add(token)
            self.paused.set()
            assert self.release.wait(60)
        return reasoning.default_plan(state, ctx)


@pytest.fixture
def planner(monkeypatch: pytest.MonkeyPatch) -> Iterator[PausingPlanner]:
    pausing = PausingPlanner()
    beat = lease.Heartbeat.beat

    def frozen_beat(self: lease.Heartbeat) -> bool:
        return True if self.token in pausing.frozen else beat(self)

    monkeypatch.setattr(lease.Heartbeat, "beat", frozen_beat)
    monkeypatch.setitem(reasoning.PLANNER, "plan", pausing.plan)
    yield pausing
    pausing.release.set()


def run_in_thread(session_id: str) -> tuple[threading.Thread, list[str]]:
    result: list[str] = []

    def run() -> None:
        try:
            result.append(jobs.advance_session(session_id))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def written(session: Session) -> dict[str, Any]:
    """Everything a job writes, as a reader would see it."""
    session.refresh_from_db()
    state = jobs.agent_graph().get_state(_config(session.pk))
    return {
        "events": list(Event.objects.filter(session=session).values_list("seq", "type")),
        "tool_calls": ToolCall.objects.filter(session=session).count(),
        "llm_calls": LLMCall.objects.filter(session=session).count(),
        "node_runs": AgentRun.objects.filter(session=session, parent__isnull=False).count(),
        "status": session.status,
        "snapshot": session.snapshot,
        "checkpoint": state.config["configurable"]["checkpoint_id"],
    }


def test_a_job_paused_past_its_lease_writes_nothing_after_losing_it(
    session: Session, planner: PausingPlanner
) -> None:
    first, first_result = run_in_thread(str(session.pk))
    assert planner.paused.wait(30)  # mid-step: the input parser's step is committed
    time.sleep(5.5)  # past the lease, no heartbeat
    session.refresh_from_db()
    assert session.lease_expires_at is not None and session.lease_token in planner.frozen

    # A second job takes over and runs the session to its question.
    assert jobs.advance_session(str(session.pk)) == "waiting_user"
    after_takeover = written(session)
    assert after_takeover["status"] == "waiting_user"
    assert after_takeover["snapshot"]["question"]["field"] == "continuous"
    assert [t for _, t in after_takeover["events"]].count("agent.question") == 1

    # The first job wakes up, finishes its step and tries to write it: refused.
    planner.release.set()
    first.join(timeout=30)
    assert first_result == ["lease_lost"]
    assert written(session) == after_takeover
    seqs = [seq for seq, _ in after_takeover["events"]]
    assert seqs == list(range(1, len(seqs) + 1))


def test_the_heartbeat_keeps_the_lease_through_a_step_longer_than_the_lease(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = threading.Event()

    def slow_plan(state: Any, ctx: AgentContext) -> dict[str, Any]:
        started.set()
        time.sleep(8)  # longer than the 5 s lease
        return reasoning.default_plan(state, ctx)

    monkeypatch.setitem(reasoning.PLANNER, "plan", slow_plan)
    first, first_result = run_in_thread(str(session.pk))
    assert started.wait(30)
    time.sleep(6)
    assert jobs.lease_is_live(session.pk)
    assert jobs.stalled_sessions() == []  # running, not stalled: no second job
    assert jobs.advance_session(str(session.pk)) == "busy"
    first.join(timeout=30)
    assert first_result == ["waiting_user"]
    assert Event.objects.filter(session=session, type="agent.question").count() == 1


def test_a_stale_token_cannot_save_a_checkpoint(session: Session) -> None:
    saver = jobs.agent_graph().checkpointer
    config: Any = {"configurable": {"thread_id": str(session.pk), "checkpoint_ns": ""}}
    token = lease.acquire_lease(session.pk)
    assert token is not None

    with fenced(session.pk, uuid.uuid4()), pytest.raises(LeaseLost):
        saver.put(config, empty_checkpoint(), {}, {})
    assert saver.get_tuple(config) is None

    with fenced(session.pk, token):
        saver.put(config, empty_checkpoint(), {}, {})
    assert saver.get_tuple(config) is not None
    saver.delete_thread(str(session.pk))


def test_a_run_killed_between_a_steps_writes_and_its_checkpoint_carries_on(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's writes were saved, the checkpoint after it was not (the worker died
    in between): the next attempt continues the graph, it does not take the run for
    finished (an empty `next`) and complete the session without its report."""
    saver = type(jobs.agent_graph().checkpointer)
    put = saver.put
    calls: list[int] = []

    def dies_once(self: Any, config: Any, checkpoint: Any, metadata: Any, versions: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:  # after the input parser's writes
            raise RuntimeError("the worker died before the checkpoint")
        return put(self, config, checkpoint, metadata, versions)

    monkeypatch.setattr(saver, "put", dies_once)
    assert jobs.advance_session(str(session.pk)) == "waiting_user"
    session.refresh_from_db()
    assert session.status == "waiting_user"
    assert session.snapshot["question"]["field"] == "continuous"
    assert Event.objects.filter(session=session, type="fields.extracted").count() == 1


def test_a_session_canceled_mid_step_ends_the_job_as_canceled_with_nothing_after(
    session: Session, monkeypatch: pytest.MonkeyPatch, make_user: Callable[..., User]
) -> None:
    """No status read before each step: canceling clears the lease, so the step
    running meanwhile has its write refused under the row lock and the job ends as
    canceled, not failed, with nothing of that step in the log."""
    from diagnosis.actions import do_cancel

    olga = User.objects.get(username="olga")
    canceled = threading.Event()

    def cancel_meanwhile(state: Any, ctx: AgentContext) -> dict[str, Any]:
        if not canceled.is_set():

            def cancel() -> None:
                try:
                    do_cancel(ctx.session_id, olga, "false alarm")
                finally:
                    connections.close_all()

            worker = threading.Thread(target=cancel)
            worker.start()
            worker.join()
            canceled.set()
        return reasoning.default_plan(state, ctx)

    monkeypatch.setitem(reasoning.PLANNER, "plan", cancel_meanwhile)
    assert jobs.advance_session(str(session.pk)) == "canceled"
    assert canceled.is_set()
    types = list(
        Event.objects.filter(session=session).order_by("seq").values_list("type", flat=True)
    )
    after = types[types.index("session.canceled") + 1 :]
    assert after == ["report.ready"], types  # the cancel's report, then nothing
    root = AgentRun.objects.get(session=session, parent__isnull=True)
    assert root.status == "completed" and root.output_summary == {"status": "canceled"}


def test_a_model_request_is_recorded_only_under_the_jobs_lease(session: Session) -> None:
    """The request a job stops at is one statement that checks the lease itself (ADR
    181): a job whose lease is gone records nothing and stops; the holder records it
    once, however often it runs again."""
    waiting: dict[str, Any] = {
        "key": f"reason:{session.pk}:1",
        "purpose": "reason",
        "request": {"messages": []},
        "providers": [],
    }
    held = lease.take_lease(session.pk)
    assert held is not None
    token, _ = held
    with fenced(session.pk, uuid.uuid4()), pytest.raises(LeaseLost):
        model_requests.record_model_request(session.pk, waiting)
    assert not LLMRequest.objects.filter(key=waiting["key"]).exists()
    with fenced(session.pk, token):
        model_requests.record_model_request(session.pk, waiting)
        model_requests.record_model_request(session.pk, waiting)  # a re-run of the job
    (row,) = LLMRequest.objects.filter(key=waiting["key"])
    assert (row.session_id, row.purpose, row.status) == (session.pk, "reason", "pending")
    assert row.request == {"messages": []}
    # A canceled session has no lease: nothing is recorded for it either.
    Session.objects.filter(pk=session.pk).update(lease_token=None)
    waiting["key"] += "-after"
    with fenced(session.pk, token), pytest.raises(LeaseLost):
        model_requests.record_model_request(session.pk, waiting)
    assert not LLMRequest.objects.filter(key=waiting["key"]).exists()


def test_one_keeper_renews_every_running_jobs_lease_and_reports_a_lost_one(
    builtin: None, settings: Any, make_user: Callable[..., User]
) -> None:
    """Jobs running side by side in one process (the embedded worker's threads) share
    the process's lease keeper: each lease is renewed past its expiry; one
    taken away is reported lost on its own job, and the other keeps being renewed; a
    job's exit stops its renewals."""
    settings.AERO_JOB_BACKEND = "rq"
    settings.AERO_LEASE_SECONDS = 1.5  # a beat every 0.5 s
    operator = make_user("olga", "operator")
    scenario = Scenario.objects.get(slug="oil_spill")
    first, second = (do_create_session(operator, scenario, MESSAGE) for _ in range(2))
    leases = []
    for session in (first, second):
        taken = lease.take_lease(str(session.pk))
        assert taken is not None
        leases.append(taken[0])
    kept = lease.Heartbeat(str(first.pk), leases[0])
    taken_away = lease.Heartbeat(str(second.pk), leases[1])
    with kept, taken_away:
        time.sleep(2)  # past the 1.5 s both leases were taken for
        assert jobs.lease_is_live(first.pk) and jobs.lease_is_live(second.pk)
        Session.objects.filter(pk=second.pk).update(lease_token=uuid.uuid4())
        assert taken_away.lost.wait(5)
        time.sleep(2)
        assert jobs.lease_is_live(first.pk) and not kept.lost.is_set()
    expires = Session.objects.get(pk=first.pk).lease_expires_at
    time.sleep(1)  # a beat would have come by now
    assert Session.objects.get(pk=first.pk).lease_expires_at == expires


def test_a_group_written_after_an_event_from_elsewhere_locks_and_keeps_the_chain(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's step group writes its events, runs and the session row in one statement
    without reading the row first, from the row as the job last wrote it. An event
    appended from elsewhere while the group runs moves the row on: that statement
    writes nothing, and the group locks the row and writes after that event, the chain
    whole and no event twice. Without the interference the job takes no row lock."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from diagnosis.chain import verify_chain
    from diagnosis.events import append_event

    def lock_reads(captured: CaptureQueriesContext) -> int:
        return sum(
            'FROM "diagnosis_session"' in q["sql"] and "FOR UPDATE" in q["sql"]
            for q in captured.captured_queries
        )

    with CaptureQueriesContext(connection) as quiet:
        assert jobs.advance_session(str(session.pk)) == "waiting_user"
    assert lock_reads(quiet) == 0

    other = do_create_session(
        User.objects.get(username="olga"), Scenario.objects.get(slug="oil_spill"), MESSAGE
    )
    noted = threading.Event()

    def note_meanwhile(state: Any, ctx: AgentContext) -> dict[str, Any]:
        if not noted.is_set():

            def note() -> None:
                try:
                    append_event(
                        ctx.session_id, "agent.note", {"text": "meanwhile"}, producer="test"
                    )
                finally:
                    connections.close_all()

            writer = threading.Thread(target=note)
            writer.start()
            writer.join()
            noted.set()
        return reasoning.default_plan(state, ctx)

    monkeypatch.setitem(reasoning.PLANNER, "plan", note_meanwhile)
    with CaptureQueriesContext(connection) as moved:
        assert jobs.advance_session(str(other.pk)) == "waiting_user"
    assert noted.is_set() and lock_reads(moved) >= 1
    events = list(Event.objects.filter(session=other).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.payload.get("text") for e in events].count("meanwhile") == 1
    # Written at the first try: no step failed, no retry.
    moves = [e.payload["to"] for e in events if e.type == "session.status_changed"]
    assert moves == ["running", "waiting_user"], moves
    assert not [e for e in events if e.type == "agent.node_failed"]
    assert [e.type for e in events].count("agent.question") == 1
    assert verify_chain(other.pk).ok
    other.refresh_from_db()
    assert other.last_seq == events[-1].seq and other.chain_head == events[-1].hash
    assert other.snapshot["question"]["field"] == "continuous"
