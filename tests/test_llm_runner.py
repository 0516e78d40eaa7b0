"""Model calls are waits, through the simulated server over real HTTP: the job
records the request and ends (its worker free, nothing sent), the LLM runner makes the
call with the chain's retries and fallback, streams the text into the log, records the
call once and enqueues the session; a runner that loses its claim or a job that re-runs
its node never repeats a finished call nor counts its tokens twice."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone

from diagnosis import jobs, llm_runner
from diagnosis.actions import do_cancel, do_close, do_create_session
from diagnosis.agent import clients
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.jobs import enqueue as job_enqueue
from diagnosis.llm_runner import runner as runner_module
from diagnosis.maintenance import run_periodic_tasks
from diagnosis.models import Event, LLMCall, LLMRequest, Session, SessionStatus
from packs.airport.agent import grounding
from scenarios_admin import breaker
from scenarios_admin.models import ProviderConfig, Scenario
from tests.llm_helpers import fake_llm, fake_provider
from tests.servers import PYTHON, ROOT, run_worker_burst, service_env

__all__ = ["fake_llm"]  # the fixture

pytestmark = pytest.mark.services

EXAMPLE_ONE = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"
REPLY = {
    "flight_no": {"value": "CA1234", "quote": "CA1234"},
    "position": {"value": "105", "quote": "105机位"},
    "fluid_type": {"value": "FUEL", "quote": "燃油"},
    "engine_status": {"value": "RUNNING", "quote": "发动机仍在运转"},
    "continuous": {"value": True, "quote": "还在持续漏"},
}
ANSWER = {"json": REPLY, "usage": {"prompt_tokens": 120, "completion_tokens": 30}}


@pytest.fixture(autouse=True)
def model_waits(settings: Any) -> None:
    settings.AERO_LLM_WAITS = True
    settings.AERO_LLM_REACT = False  # one extraction call per message: easy to count
    settings.AERO_LLM_STREAM_FLUSH = 0.05


@pytest.fixture
def no_inline_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's side alone: nobody makes the calls until the test runs a runner."""
    monkeypatch.setattr(job_enqueue, "run_pending_inline", lambda session_id: False)


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    asked: list[float] = []

    async def record(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr(runner_module, "backoff_sleep", record)
    return asked


def in_thread(coro: Callable[[], Any]) -> Any:
    """Run a runner coroutine on its own loop and thread, as the runner process does."""
    result: list[Any] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coro()))
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    return result[0] if result else None


def start(make_user: Callable[..., User], text: str = EXAMPLE_ONE) -> Session:
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), text
    )
    session.refresh_from_db()
    return session


def attempts(session: Session) -> list[tuple[str, str]]:
    return [(a.provider, a.status) for a in LLMCall.objects.filter(session=session).order_by("id")]


def test_the_runner_waits_the_providers_whole_timeout(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    no_inline_runner: None,
    settings: Any,
) -> None:
    """The runner holds no job lease: a provider's timeout is not cut to three quarters
    of one there. A reply slower than that cut, within the provider's own timeout, is the
    model's reply, not a timeout and a fallback."""
    settings.AERO_LEASE_SECONDS = 4  # a job's own call would be cut at 3 s
    fake_llm.set_script({"rules": [{**ANSWER, "latency": 3.5}]})
    config = fake_provider(fake_llm, retries=1, timeout_seconds=8)
    assert clients.call_timeout(config) == 3.0
    session = start(make_user)

    assert in_thread(lambda: llm_runner.Runner(enqueue=None).process_pending_now()) == 1
    assert attempts(session) == [("fake", "ok")]
    request = LLMRequest.objects.get(session=session)
    assert (request.status, request.answered_by) == ("done", "fake")


def test_a_model_call_is_a_wait_and_the_worker_is_free(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User], no_inline_runner: None
) -> None:
    fake_llm.set_script({"latency": 0.3, "chunk_size": 4, "chunk_delay": 0.02, "rules": [ANSWER]})
    fake_provider(fake_llm)
    session = start(make_user)

    # The job ended at the model call: nothing was sent, nothing counted, no lease held.
    request = LLMRequest.objects.get(session=session)
    assert (request.status, request.purpose) == ("pending", "extract")
    assert fake_llm.requests == []
    assert not LLMCall.objects.filter(session=session).exists()
    assert session.lease_token is None and session.status == SessionStatus.RUNNING
    assert "risk" not in session.snapshot
    # The reconciler leaves a session waiting for the model alone (no job per pass).
    assert str(session.pk) not in jobs.stalled_sessions()

    made = in_thread(
        lambda: llm_runner.Runner(enqueue=jobs.dispatch_after_commit).process_pending_now()
    )
    assert made == 1

    session.refresh_from_db()
    request.refresh_from_db()
    assert request.status == "done" and request.answered_by == "fake"
    # The runner enqueued the session: the resumed node read the reply, did not call.
    assert session.snapshot["risk"]["rule"] == "OS-01"
    assert session.status == SessionStatus.WAITING_USER
    assert len(fake_llm.requests) == 1 and fake_llm.requests[0]["body"]["stream"] is True
    assert attempts(session) == [("fake", "ok")]
    assert (session.tokens_in, session.tokens_out, session.cost) == (120, 30, Decimal("0.0018"))
    # The text streamed into the log in pieces, and adds up to the reply.
    deltas = list(Event.objects.filter(session=session, type="llm.delta").order_by("seq"))
    assert len(deltas) > 1
    assert "".join(d.payload["text"] for d in deltas) == request.text
    call = Event.objects.get(session=session, type="llm.call", payload__provider="fake")
    assert call.payload["text"] == request.text and '"CA1234"' in request.text
    # The page (no JavaScript needed) shows the call's final text.
    assert session.snapshot["thinking"]["status"] == "done"
    assert session.snapshot["thinking"]["text"] == request.text


def test_a_reply_that_comes_in_one_burst_is_in_the_log_whole(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    no_inline_runner: None,
    settings: Any,
) -> None:
    # No periodic flush comes before the reply is complete: its text is written with the
    # reply, still as a delta, so the live page and a reload agree.
    settings.AERO_LLM_STREAM_FLUSH = 3  # longer than the whole call
    fake_llm.set_script({"chunk_size": 4, "rules": [ANSWER]})
    fake_provider(fake_llm)
    session = start(make_user)
    assert (
        in_thread(
            lambda: llm_runner.Runner(enqueue=jobs.dispatch_after_commit).process_pending_now()
        )
        == 1
    )

    request = LLMRequest.objects.get(session=session)
    deltas = list(Event.objects.filter(session=session, type="llm.delta").order_by("seq"))
    call = Event.objects.get(session=session, type="llm.call", payload__provider="fake")
    assert len(deltas) == 1 and deltas[0].seq < call.seq
    assert deltas[0].payload["text"] == request.text == call.payload["text"]
    assert '"CA1234"' in request.text


def test_offline_provider_needs_no_wait(builtin: None, make_user: Callable[..., User]) -> None:
    session = start(make_user)
    assert session.snapshot["risk"]["rule"] == "OS-01"
    assert not LLMRequest.objects.exists()
    assert attempts(session) == [("offline", "ok")]


def test_429_then_success(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User], backoffs: list[float]
) -> None:
    fake_llm.set_script(
        {"rules": [{"match": {"call": 1}, "fault": "429", "retry_after": 2}, ANSWER]}
    )
    fake_provider(fake_llm)
    session = start(make_user)  # inline backend: the runner runs between two jobs

    assert attempts(session) == [("fake", "error"), ("fake", "ok")]
    assert backoffs == [2.0]  # the server's Retry-After, not the exponential wait
    assert session.snapshot["risk"]["rule"] == "OS-01"
    assert (session.tokens_in, session.tokens_out) == (120, 30)
    assert not Event.objects.filter(session=session, type="llm.fallback").exists()


def test_every_real_provider_down_falls_back_to_offline_on_the_timeline(
    whole_timeline_on_page: None,
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    backoffs: list[float],
    client: Any,
) -> None:
    fake_llm.set_script({"rules": [{"fault": "500"}]})
    fake_provider(fake_llm, name="fake", priority=1)
    fake_provider(fake_llm, name="fake2", priority=2)
    session = start(make_user)

    assert attempts(session) == [("fake", "error")] * 3 + [("fake2", "error")] * 3 + [
        ("offline", "ok")
    ]
    assert len(backoffs) == 4  # two waits per provider, then the next one
    fallbacks = [
        (e.payload["from"], e.payload["to"])
        for e in Event.objects.filter(session=session, type="llm.fallback").order_by("seq")
    ]
    assert fallbacks == [("fake", "fake2"), ("fake2", "offline")]
    assert LLMRequest.objects.get(session=session).status == "failed"
    # The offline extractor carried on: same facts and rule as without a model.
    assert session.snapshot["risk"]["rule"] == "OS-01"
    client.force_login(User.objects.get(username="olga"))
    page = client.get(f"/sessions/{session.pk}/").content.decode()
    assert "falling back to offline" in page


def test_a_runner_that_loses_its_claim_mid_call_neither_loses_nor_pays_twice(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User], no_inline_runner: None
) -> None:
    """Runner A claims the call and stops renewing (killed, paused): its claim runs out,
    runner B takes the request over and answers it. A's reply, arriving later, is
    refused: one LLMCall row, the tokens counted once, the session resumed once."""
    # A's reply comes back after B's: a runner without the claim check would record it.
    fake_llm.set_script(
        {"rules": [{**ANSWER, "match": {"call": 1}, "latency": 2.5}, {**ANSWER, "latency": 0.2}]}
    )
    fake_provider(fake_llm)
    session = start(make_user)
    runner_a = threading.Thread(
        target=lambda: in_thread(lambda: llm_runner.Runner(enqueue=None).process_pending_now())
    )
    runner_a.start()
    deadline = time.monotonic() + 10
    while not fake_llm.requests and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(fake_llm.requests) == 1  # A's call is in flight
    LLMRequest.objects.update(claim_expires_at=timezone.now())  # A stopped renewing

    assert (
        in_thread(
            lambda: llm_runner.Runner(enqueue=jobs.dispatch_after_commit).process_pending_now()
        )
        == 1
    )  # B took it over
    runner_a.join(timeout=30)

    session.refresh_from_db()
    assert len(fake_llm.requests) == 2  # B made the call again: A had not finished it
    assert attempts(session) == [("fake", "ok")]
    assert (session.tokens_in, session.tokens_out) == (120, 30)
    assert Event.objects.filter(session=session, type="llm.call").count() == 1
    assert LLMRequest.objects.get(session=session).claims == 2
    assert session.snapshot["risk"]["rule"] == "OS-01"


def test_a_finished_call_is_never_made_again_by_a_rerun_of_its_node(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job dies in the node after reading the reply (here: the step fails once and
    the job runs it again from its first line): the stored reply is read again, the
    model is not asked twice and nothing is counted twice."""
    fake_llm.set_script({"rules": [ANSWER]})
    fake_provider(fake_llm)
    settle = grounding.settle
    crashes: list[int] = []

    def crash_once(*args: Any, **kwargs: Any) -> Any:
        if LLMRequest.objects.filter(status="done").exists() and not crashes:
            crashes.append(1)
            raise RuntimeError("the worker died here")
        return settle(*args, **kwargs)

    monkeypatch.setattr(grounding, "settle", crash_once)
    session = start(make_user)

    assert crashes == [1]
    assert Event.objects.filter(session=session, type="agent.node_failed").count() == 1
    assert len(fake_llm.requests) == 1
    assert attempts(session) == [("fake", "ok")]
    assert (session.tokens_in, session.tokens_out) == (120, 30)
    assert session.snapshot["risk"]["rule"] == "OS-01"


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def start_runner(db_url: str, redis_url: str, log: Any) -> subprocess.Popen[str]:
    """A real `manage.py aero_llm_runner` on the test database (rq backend: it enqueues
    the session it answered), with a short claim so that a killed one is replaced fast."""
    return subprocess.Popen(
        [PYTHON, "manage.py", "aero_llm_runner"],
        cwd=ROOT,
        env=service_env(
            db_url, redis_url, AERO_LLM_CLAIM_SECONDS="2", AERO_LLM_STREAM_FLUSH="0.05"
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_runner_killed_mid_stream_is_replaced_and_the_call_is_paid_once(
    builtin: None,
    clean_queue: None,
    db_url: str,
    redis_url: str,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    no_inline_runner: None,
    tmp_path: Any,
) -> None:
    """Issue 11 item 8: `aero_llm_runner` gets SIGKILL while the model's reply streams in
    (part of its text already in the log). A new runner takes the request over once the
    dead one's claim runs out, makes the call again (it was not finished: recorded means
    finished) and records it once; the session goes on with the model's reading, its
    tokens counted once and the request's text the reply's, not the dead attempt's
    half plus the whole."""
    # About 4 s of streaming per call: time to kill the first runner mid-stream.
    fake_llm.set_script({"chunk_size": 8, "chunk_delay": 0.15, "rules": [ANSWER]})
    fake_provider(fake_llm)
    session = start(make_user)
    request = LLMRequest.objects.get(session=session)
    log_path = tmp_path / "runners.log"
    with log_path.open("w") as log:
        first = start_runner(db_url, redis_url, log)
        second: subprocess.Popen[str] | None = None
        try:
            wait_until(
                lambda: LLMRequest.objects.filter(pk=request.pk).exclude(text="").exists(),
                60,
                "the first runner to stream part of the reply",
            )
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
            request.refresh_from_db()
            assert request.status == "pending" and request.claims == 1
            assert not LLMCall.objects.filter(session=session).exists()  # nothing paid yet
            partial = request.text

            second = start_runner(db_url, redis_url, log)
            wait_until(
                lambda: LLMRequest.objects.filter(pk=request.pk, status="done").exists(),
                60,
                "the second runner to answer the request",
            )
        finally:
            for runner in (first, second):
                if runner is not None and runner.poll() is None:
                    runner.send_signal(signal.SIGTERM)
                    runner.wait(timeout=30)
    request.refresh_from_db()
    assert request.claims == 2, log_path.read_text()[-3000:]
    assert len(fake_llm.requests) == 2  # made again: the killed attempt had not finished
    assert len(partial) < len(request.text)
    # The text is the reply, once: the dead attempt's part was not kept in front of it.
    assert request.text.count('"flight_no"') == 1

    # The session goes on (the runner enqueued it; a worker runs the job).
    # (One model call per message, as in this file's other tests.)
    burst = run_worker_burst(db_url, redis_url, AERO_LLM_REACT="0")
    assert burst.returncode == 0, burst.stderr[-2000:]
    session.refresh_from_db()
    assert session.snapshot["risk"]["rule"] == "OS-01"
    assert session.status == SessionStatus.WAITING_USER
    assert attempts(session) == [("fake", "ok")]
    assert (session.tokens_in, session.tokens_out) == (120, 30)
    calls = Event.objects.filter(session=session, type="llm.call")
    assert [c.payload["text"] for c in calls] == [request.text]
    assert len(fake_llm.requests) == 2  # the resumed node read the reply, asked nothing


def test_the_maintenance_loop_prunes_the_requests_of_ended_sessions(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    no_inline_runner: None,
) -> None:
    """A request's reply is kept for a re-run of the node that asked; an ended session
    runs no node. The loop deletes the requests of completed and canceled sessions (a
    canceled session's pending call is never made), keeps those of sessions still going
    and of failed ones (a retry re-runs the node and must read the reply, not pay
    again), and the ended sessions' calls stay on their timeline."""
    fake_llm.set_script({"rules": [ANSWER]})
    fake_provider(fake_llm)
    olga = make_user("olga", "operator")
    oil_spill = Scenario.objects.get(slug="oil_spill")
    going, closed, canceled, failed = (
        do_create_session(olga, oil_spill, EXAMPLE_ONE) for _ in range(4)
    )
    assert (
        in_thread(
            lambda: llm_runner.Runner(enqueue=jobs.dispatch_after_commit).process_pending_now()
        )
        == 4
    )
    pending = do_create_session(olga, oil_spill, EXAMPLE_ONE)  # its call not made yet
    do_close(closed.pk, olga, "spill contained")
    do_cancel(canceled.pk, olga, "duplicate report")
    do_cancel(pending.pk, olga, "duplicate report")
    Session.objects.filter(pk=failed.pk).update(status=SessionStatus.FAILED)
    assert LLMRequest.objects.count() == 5

    run_periodic_tasks()

    kept = set(LLMRequest.objects.values_list("session_id", flat=True))
    assert kept == {going.pk, failed.pk}
    # What the ended sessions' model said stays in their log (replay shows it).
    for ended in (closed, canceled):
        assert Event.objects.filter(session=ended, type="llm.call", payload__status="ok").exists()
    # Nobody makes the canceled session's call any more.
    assert (
        in_thread(
            lambda: llm_runner.Runner(enqueue=jobs.dispatch_after_commit).process_pending_now()
        )
        == 0
    )
    assert len(fake_llm.requests) == 4


def test_an_edited_provider_config_is_used_from_the_next_call_on(
    builtin: None, fake_llm: FakeLLMServer, make_user: Callable[..., User], no_inline_runner: None
) -> None:
    """The runner builds a provider once per version of its config's row (the
    claim reads the versions, xmin): an admin's edit (model, base URL, key) and a write
    that leaves updated_at alone (a queryset update) are both used by the next call."""
    other = FakeLLMServer().start()
    try:
        for server in (fake_llm, other):
            server.set_script({"rules": [ANSWER]})
        config = fake_provider(fake_llm)
        user = make_user("olga", "operator")
        scenario = Scenario.objects.get(slug="oil_spill")

        def one_call() -> Session:
            session = do_create_session(user, scenario, EXAMPLE_ONE)
            assert in_thread(lambda: llm_runner.Runner(enqueue=None).process_pending_now()) == 1
            assert attempts(session) == [("fake", "ok")]
            return session

        one_call()
        one_call()  # the cached provider, and a new loop's own connections
        sent = [(r["body"]["model"], r["auth"]) for r in fake_llm.requests]
        assert sent == [("fake-1", "Bearer sk-test-123")] * 2

        config.model, config.base_url = "fake-2", other.url
        config.set_api_key("sk-new-456")
        config.save()  # the admin's edit
        session = one_call()
        assert [(r["body"]["model"], r["auth"]) for r in other.requests] == [
            ("fake-2", "Bearer sk-new-456")
        ]
        assert LLMCall.objects.get(session=session).model == "fake-2"

        ProviderConfig.objects.filter(pk=config.pk).update(model="fake-3")  # updated_at kept
        session = one_call()
        assert [r["body"]["model"] for r in other.requests] == ["fake-2", "fake-3"]
        assert LLMCall.objects.get(session=session).model == "fake-3"
        assert len(fake_llm.requests) == 2
    finally:
        other.stop()


def test_a_breaker_opened_in_one_process_is_skipped_by_a_runner_in_another(
    builtin: None,
    clean_queue: None,
    db_url: str,
    redis_url: str,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    no_inline_runner: None,
    tmp_path: Any,
    settings: Any,
) -> None:
    """The circuit breaker is one state for every process: opened by failures counted
    here (this test's process), a real `aero_llm_runner` process skips the provider at
    once: no request reaches it, the session's log says so, the offline provider goes on."""
    fake_llm.set_script({"rules": [ANSWER]})
    config = fake_provider(fake_llm)
    for _ in range(settings.AERO_LLM_BREAKER_FAILURES):
        breaker.failed(config.pk, "5xx", 503, "HTTP 503: simulated", False)
    session = start(make_user)
    request = LLMRequest.objects.get(session=session)
    log_path = tmp_path / "runner.log"
    with log_path.open("w") as log:
        runner = start_runner(db_url, redis_url, log)
        try:
            wait_until(
                lambda: LLMRequest.objects.filter(pk=request.pk, status="failed").exists(),
                60,
                "the runner to skip the provider",
            )
        finally:
            runner.send_signal(signal.SIGTERM)
            runner.wait(timeout=30)
    assert fake_llm.requests == [], log_path.read_text()[-2000:]
    assert not LLMCall.objects.filter(session=session, provider="fake").exists()
    skip = Event.objects.get(session=session, type="llm.skipped")
    assert (skip.payload["provider"], skip.payload["to"], skip.payload["state"]) == (
        "fake",
        "offline",
        "open",
    )
