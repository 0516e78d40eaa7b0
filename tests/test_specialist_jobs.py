"""Specialists are child agents with jobs of their own (issue 35 item 4): with waits on,
the orchestrator's job ends at its specialists (a request row each), each specialist runs
in a job of its own (two at once on two workers, neither waiting for the other), the last
to finish enqueues the orchestrator's resume exactly once, and a worker killed mid-
specialist is replaced: the specialist runs again and writes nothing twice. A
specialist's own question goes to the reporter naming it, and the answer goes back to
that specialist, not to the orchestrator."""

from __future__ import annotations

import signal
import subprocess
import tarfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import override_settings

from diagnosis.actions import do_answer
from diagnosis.chain import verify_chain
from diagnosis.events import LeaseLost, append_event, fenced
from diagnosis.jobs import child_jobs
from diagnosis.jobs import enqueue as job_enqueue
from diagnosis.jobs.job import WAITING_MODEL, advance_session
from diagnosis.llm_runner import run_pending_inline
from diagnosis.models import AgentRun, Event, LLMRequest, Session, ToolCall
from packs.diagnosis import specialists
from packs.diagnosis.sessions import start_from_bundle, summarize
from tests.servers import PYTHON, ROOT, service_env
from tests.test_diagnosis_sessions import EXPECTED, SPEC

pytestmark = pytest.mark.services
EXAMPLE = "ex-deploy-payments"
NAMES = ("logs", "metrics", "changes_code", "knowledge")


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "stored"
    with override_settings(AERO_BUNDLE_DIR=where):
        yield where


@pytest.fixture
def waits(settings: Any) -> None:
    settings.AERO_LLM_WAITS = True


def children_of(session: Session) -> dict[str, LLMRequest]:
    rows = LLMRequest.objects.filter(session=session, purpose__startswith="child:")
    return {row.request["name"]: row for row in rows}


def start_waiting(user: User, monkeypatch: pytest.MonkeyPatch) -> Session:
    """A hierarchical session whose job ran up to its specialists (the inline backend's
    loop runs no child: the test does)."""
    monkeypatch.setattr(job_enqueue, "run_children_inline", lambda session_id: False)
    session = start_from_bundle(
        user, SPEC / f"{EXAMPLE}.tar.gz", {"preferred_mode": "hierarchical", "producer": "test"}
    )
    session.refresh_from_db()
    return session


def assert_concluded_as_expected(session: Session) -> None:
    session.refresh_from_db()
    found = summarize(session)
    expected = EXPECTED[EXAMPLE]
    cause = found["root_cause"]
    assert (cause["hypothesis"], cause["service"]) == (expected["hypothesis"], expected["service"])
    assert found["mode"] == "hierarchical"


def test_the_orchestrators_job_ends_at_its_specialists_and_the_last_one_resumes_it_once(
    builtin: None,
    stored: Path,
    waits: None,
    make_user: Callable[..., User],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = start_waiting(make_user("olga", "operator"), monkeypatch)
    # The job ended at the wait: a row per specialist, none run, the session running.
    rows = children_of(session)
    assert sorted(rows) == sorted(NAMES)
    assert {row.status for row in rows.values()} == {"pending"}
    assert session.status == "running" and session.lease_token is None
    assert not AgentRun.objects.filter(session=session, agent_name__startswith="specialist_")

    # A duplicate job finds the session still waiting: nothing recorded twice.
    assert advance_session(str(session.pk)) == WAITING_MODEL
    assert len(children_of(session)) == 4

    # The four finish at once, on four threads: exactly one enqueues the session.
    enqueued: list[Any] = []
    # How a finishing child wakes its session (handed in by diagnosis.jobs.enqueue).
    monkeypatch.setattr(
        child_jobs._handed, "dispatch_after_commit", lambda sid, **kw: enqueued.append(sid)
    )
    finishing = threading.Barrier(4, timeout=120)
    real_finish = child_jobs._finish

    def finish_together(*args: Any) -> bool:
        finishing.wait()
        return real_finish(*args)

    monkeypatch.setattr(child_jobs, "_finish", finish_together)
    outcomes: dict[str, str] = {}

    def run(name: str) -> None:
        try:
            # The code specialist waits for its MCP reads (a slow tool each): the runner
            # makes them, and its job runs it again.
            while (found := child_jobs.run_child_job(str(session.pk), rows[name].key)) == "parked":
                assert run_pending_inline(session.pk)
            outcomes[name] = found
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(name,)) for name in NAMES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert outcomes == dict.fromkeys(NAMES, "done")
    assert [str(sid) for sid in enqueued] == [str(session.pk)]

    job_enqueue.dispatch(session.pk)  # the one resume
    assert_concluded_as_expected(session)
    types = Counter(Event.objects.filter(session=session).values_list("type", flat=True))
    assert types["agent.run_started"] == types["agent.run_ended"] == 4
    assert types["diagnosis.specialist_reported"] == 4
    assert types["diagnosis.evidence_aggregated"] == 1


def test_two_specialists_of_one_session_run_at_the_same_time(
    builtin: None,
    stored: Path,
    waits: None,
    make_user: Callable[..., User],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two jobs (two workers' threads) run the logs and the metrics specialists: each
    reaches its call while the other is in its own, so neither waits for the other."""
    session = start_waiting(make_user("olga", "operator"), monkeypatch)
    rows = children_of(session)
    both = threading.Barrier(2, timeout=60)
    real_gather = specialists.gather

    def gather_together(inv: Any, ctx: Any, run: Any, call: dict[str, Any]) -> Any:
        if call["tool"] in ("log_signatures", "anomalies"):
            both.wait()  # broken (and the test failed) unless the other is here too
        return real_gather(inv, ctx, run, call)

    monkeypatch.setattr(specialists, "gather", gather_together)
    outcomes: dict[str, str] = {}

    def run(name: str) -> None:
        try:
            outcomes[name] = child_jobs.run_child_job(str(session.pk), rows[name].key)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(name,)) for name in ("logs", "metrics")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert outcomes == {"logs": "done", "metrics": "done"}
    runs = {
        r.agent_name: r
        for r in AgentRun.objects.filter(session=session, agent_name__startswith="specialist_")
    }
    logs, metrics = runs["specialist_logs"], runs["specialist_metrics"]
    assert logs.started_at < metrics.ended_at and metrics.started_at < logs.ended_at  # type: ignore[operator]
    # The orchestrator still waits for the other two.
    assert Session.objects.get(pk=session.pk).status == "running"
    assert advance_session(str(session.pk)) == WAITING_MODEL

    # A specialist's job whose claim was taken over writes nothing more.
    claimed = child_jobs._claim(rows["knowledge"].key)
    assert claimed is not None
    row, token = claimed
    LLMRequest.objects.filter(pk=row.pk).update(claim_token=uuid.uuid4())
    before = Session.objects.get(pk=session.pk).last_seq
    with fenced(session.pk, token, claim=row.pk), pytest.raises(LeaseLost):
        append_event(session.pk, "agent.note", {"text": "late"}, producer="agent")
    assert Session.objects.get(pk=session.pk).last_seq == before


def test_a_worker_killed_mid_specialist_is_replaced_and_nothing_is_written_twice(
    builtin: None,
    clean_queue: None,
    db_url: str,
    redis_url: str,
    stored: Path,
    waits: None,
    make_user: Callable[..., User],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    session = start_waiting(make_user("olga", "operator"), monkeypatch)
    env = service_env(db_url, redis_url, AERO_LLM_CLAIM_SECONDS="3", AERO_BUNDLE_DIR=str(stored))
    log = (tmp_path / "workers.log").open("w")
    processes: list[subprocess.Popen[str]] = []

    def start_worker(command: str = "aero_worker") -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [PYTHON, "manage.py", command],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        processes.append(process)
        return process

    killed: LLMRequest | None = None
    try:
        start_worker("aero_llm_runner")  # the code specialist's MCP reads are slow tools
        first = start_worker()  # its reconciler enqueues the specialists' jobs
        deadline = time.monotonic() + 240
        while killed is None:
            assert time.monotonic() < deadline, "no specialist was caught running"
            held = LLMRequest.objects.filter(
                session=session, purpose__startswith="child:", claim_token__isnull=False
            ).first()
            if held is None:
                time.sleep(0.02)
                continue
            first.send_signal(signal.SIGSTOP)  # frozen where it is
            held.refresh_from_db()
            if held.status == "pending" and held.claim_token is not None:
                killed = held  # claimed and not finished: mid-specialist
                first.send_signal(signal.SIGKILL)
                first.wait(timeout=10)
            else:
                first.send_signal(signal.SIGCONT)
        start_worker()  # takes it over once the dead one's claim runs out
        concluded = Session.objects.filter(pk=session.pk, status__in=("waiting_user", "completed"))
        deadline = time.monotonic() + 400
        while not concluded.exists():
            assert time.monotonic() < deadline, (tmp_path / "workers.log").read_text()[-3000:]
            time.sleep(0.2)
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        log.close()
    killed.refresh_from_db()
    assert (killed.status, killed.claims) == ("done", 2)
    assert_concluded_as_expected(session)
    # Each specialist's start, end, report and calls are written once; the chain holds.
    events = list(Event.objects.filter(session=session))
    types = Counter(e.type for e in events)
    assert types["agent.run_started"] == types["agent.run_ended"] == 4
    assert types["diagnosis.specialist_reported"] == 4
    assert types["diagnosis.evidence_aggregated"] == 1
    calls = Counter(e.payload.get("call_id") for e in events if e.type == "tool.call_completed")
    assert calls and max(calls.values()) == 1
    assert (
        AgentRun.objects.filter(session=session, agent_name__startswith="specialist_").count() == 4
    )
    assert verify_chain(session.pk).ok


def reported_a_day_later(tmp_path: Path) -> Path:
    """The payments example reported a day after its logs: the window the playbook reads
    (before the reported time) holds none of them, so the logs specialist asks."""
    with tarfile.open(SPEC / f"{EXAMPLE}.tar.gz") as archive:
        archive.extractall(tmp_path / "late", filter="data")
    folder = tmp_path / "late" / EXAMPLE
    incident = folder / "incident.yaml"
    text = incident.read_text()
    assert "2026-10-02T11:20" in text
    incident.write_text(text.replace("2026-10-02T11:20", "2026-10-03T11:20"))
    return folder


def test_a_specialists_question_is_answered_to_that_specialist_not_the_orchestrator(
    builtin: None,
    stored: Path,
    waits: None,
    make_user: Callable[..., User],
    tmp_path: Path,
) -> None:
    olga = make_user("olga", "operator")
    session = start_from_bundle(
        olga, reported_a_day_later(tmp_path), {"preferred_mode": "hierarchical", "producer": "t"}
    )
    session.refresh_from_db()
    # The logs specialist asked, naming itself; its job parked; the others handed back;
    # the orchestrator still waits for it.
    rows = children_of(session)
    assert rows["logs"].status == "pending"
    assert rows["logs"].request["waiting"]["kind"] == "question"
    assert {rows[n].status for n in ("metrics", "changes_code", "knowledge")} == {"done"}
    (question,) = Event.objects.filter(session=session, type="agent.question")
    assert question.payload["specialist"] == "logs"
    assert question.payload["text"].startswith("日志专家：")  # the session is in Chinese
    assert session.status == "waiting_user"
    assert not Event.objects.filter(session=session, type="diagnosis.evidence_aggregated")

    do_answer(session.pk, olga, "between 10:30 and 11:20")
    answer = Event.objects.filter(session=session, type="user.message").order_by("seq").last()
    assert answer is not None and answer.payload["text"] == "between 10:30 and 11:20"

    # The answer went to the logs specialist: it read its logs over that window.
    rows["logs"].refresh_from_db()
    assert rows["logs"].status == "done"
    call = ToolCall.objects.get(session=session, call_id="ev-log_signatures")
    assert call.request_payload["since"].startswith("2026-10-02T10:30")
    assert call.request_payload["until"].startswith("2026-10-02T11:20")
    assert "error signatures" in call.response_payload["summary"]
    assert call.response_payload["total"] > 0
    assert Event.objects.filter(session=session, type="diagnosis.evidence_aggregated").exists()
    # ... and not to the orchestrator: it never read it as an answer of its own (no
    # read_answer step), and a question of its own after it is still open.
    assert not Event.objects.filter(
        session=session, type="agent.node_completed", payload__node="read_answer"
    ).exists()
    later = Event.objects.filter(session=session, type="agent.question", seq__gt=answer.seq)
    session.refresh_from_db()
    if later.exists():
        assert session.status == "waiting_user"
        assert session.snapshot["question"]["key"] == later.last().payload["key"]  # type: ignore[union-attr]
    else:
        assert session.status != "waiting_user"
