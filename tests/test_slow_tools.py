"""Slow tools are waits (issue 36 item 5): a session whose metrics come from a real
Prometheus ends its job at the read, the LLM runner makes it, and the session resumes
from its checkpoint with the samples and concludes as the bundle's file does. A runner
killed mid-read is replaced and the read is recorded once; a failed or timed-out read
fails that call only and the session says what it lacked."""

from __future__ import annotations

import json
import signal
import subprocess
import tarfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import override_settings

from diagnosis.agent import slow_tools
from diagnosis.jobs import checkpoints, dispatch
from diagnosis.jobs import enqueue as job_enqueue
from diagnosis.models import Event, LLMRequest, Session, ToolCall
from packs.diagnosis import intake as diagnosis_intake
from packs.diagnosis import slow
from packs.diagnosis.models import MetricsSource
from packs.diagnosis.sessions import start_from_bundle, summarize
from tests.prometheus_helpers import fake_server, prometheus_with
from tests.servers import PYTHON, ROOT, service_env
from tests.test_diagnosis_prometheus import EXAMPLES, without_metrics_file

pytestmark = pytest.mark.services
EXAMPLE = "ex-deploy-payments"
# What two sessions reading the same incident must agree on.
SAME = ("status", "root_cause", "confidence", "missing_sources", "problem_type")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus holding the example's metrics.csv."""
    with tarfile.open(EXAMPLES / f"{EXAMPLE}.tar.gz") as archive:
        where = tmp_path_factory.mktemp("example")
        archive.extractall(where, filter="data")
    (csv,) = where.glob("*/metrics.csv")
    with prometheus_with(csv, tmp_path_factory.mktemp("prom")) as url:
        yield url


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "stored"
    with override_settings(AERO_BUNDLE_DIR=where):
        yield where


@pytest.fixture
def waits(settings: Any) -> None:
    settings.AERO_LLM_WAITS = True


def start(user: User, folder: Path, source: str = "") -> Session:
    session = start_from_bundle(user, folder, {"metrics_source": source, "producer": "test"})
    session.refresh_from_db()
    return session


def start_live(user: User, tmp_path: Path) -> Session:
    """The example without its metrics.csv, its metrics from the source "shop-prom"."""
    return start(user, without_metrics_file(EXAMPLE, tmp_path / "live"), "shop-prom")


def read_requests(session: Session) -> list[LLMRequest]:
    return list(LLMRequest.objects.filter(session=session, purpose="tool:metrics_read"))


def test_a_prometheus_read_is_a_wait_and_the_session_concludes_as_from_the_file(
    builtin: None,
    stored: Path,
    waits: None,
    prometheus: str,
    make_user: Callable[..., User],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user = make_user("olga", "operator")
    from_file = summarize(start(user, EXAMPLES / f"{EXAMPLE}.tar.gz"))
    MetricsSource.objects.create(name="shop-prom", base_url=prometheus, timeout_seconds=10)
    # While the read runs, no job holds the session: its worker is free.
    leases: list[Any] = []
    real = slow_tools.slow_tool(slow.METRICS_READ)

    def watched(args: dict[str, Any]) -> dict[str, Any]:
        waiting = Session.objects.filter(llm_requests__purpose="tool:metrics_read")
        leases.append(waiting.values_list("lease_token", flat=True).get())
        return real.run(args)

    monkeypatch.setitem(
        slow_tools._TOOLS, slow.METRICS_READ, slow_tools.SlowTool(real.name, watched, real.timeout)
    )
    folder = without_metrics_file(EXAMPLE, tmp_path / "x")
    session = start(user, folder, "shop-prom")
    live = summarize(session)

    assert leases == [None]  # run once, by the runner, with no job holding the session
    (request,) = read_requests(session)
    assert request.status == "done" and request.reply is not None
    assert len(slow.samples_of(request.reply["result"])) > 100
    outcomes = Event.objects.filter(session=session, type="tool.slow_call")
    (outcome,) = outcomes.filter(payload__tool="metrics_read")
    assert outcome.payload["status"] == "ok"
    # The code tool's MCP exchanges are slow tools too: each made once, by the runner.
    codes = ToolCall.objects.filter(session=session, tool_name="code")
    assert codes and all(c.status == "completed" for c in codes)
    assert outcomes.filter(payload__tool="code_read").count() == codes.count()
    assert live["metrics"]["source"] == "prometheus"
    assert {k: live[k] for k in SAME} == {k: from_file[k] for k in SAME}
    anomalies = ToolCall.objects.get(session=session, tool_name="anomalies")
    first = ToolCall.objects.get(session_id=from_file["session"], tool_name="anomalies")
    assert anomalies.status == "completed"
    assert anomalies.response_payload == first.response_payload
    # Jobs ended at the waits and resumed: more than one job ran the session.
    assert Event.objects.filter(session=session, type="agent.node_started").count() > 3


@pytest.mark.parametrize(
    "checkpointer",
    [
        "postgres",
        # The proof this test needs the checkpoint: a job that lost it runs the steps
        # before the wait again (strict).
        pytest.param("memory", marks=pytest.mark.xfail(strict=True, raises=AssertionError)),
    ],
)
def test_the_session_resumes_from_its_checkpoint_with_the_result(
    builtin: None,
    stored: Path,
    waits: None,
    prometheus: str,
    make_user: Callable[..., User],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    checkpointer: str,
) -> None:
    monkeypatch.setattr(job_enqueue, "run_pending_inline", lambda session_id: False)
    MetricsSource.objects.create(name="shop-prom", base_url=prometheus, timeout_seconds=10)
    session = start(
        make_user("olga", "operator"), without_metrics_file(EXAMPLE, tmp_path), "shop-prom"
    )
    # The job ended at the read: the request pending, the session running with no lease.
    (request,) = read_requests(session)
    assert request.status == "pending" and session.lease_token is None
    assert session.status == "running"
    assert not ToolCall.objects.filter(session=session, tool_name="anomalies").exists()

    monkeypatch.undo()
    from diagnosis.llm_runner import run_pending_inline

    assert run_pending_inline(session.pk)
    # As a new process would: the checkpointer's connection (and memory) start afresh.
    checkpoints.close_agent_runtime()
    if checkpointer == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        real = checkpoints._postgres_saver
        monkeypatch.setattr(checkpoints, "_postgres_saver", lambda: (real()[0], InMemorySaver()))
    chosen: list[str] = []
    choose = diagnosis_intake.choose_mode

    def spy(*args: Any) -> Any:
        chosen.append("intake")
        return choose(*args)

    monkeypatch.setattr(diagnosis_intake, "choose_mode", spy)
    try:
        dispatch(session.pk)
    finally:
        checkpoints.close_agent_runtime()
    session.refresh_from_db()
    assert chosen == []  # the steps before the wait did not run again
    assert session.status in ("waiting_user", "completed")
    assert session.snapshot.get("root_cause")
    assert ToolCall.objects.get(session=session, tool_name="anomalies").status == "completed"


@pytest.mark.parametrize("case", ["slow", "hung"])
def test_a_failed_or_timed_out_read_fails_that_call_only(
    builtin: None,
    stored: Path,
    waits: None,
    make_user: Callable[..., User],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    """slow: the source answers after its own timeout (the read fails with Prometheus's
    words); hung: the tool overruns the runner's limit for the call."""
    if case == "hung":
        real = slow_tools.slow_tool(slow.METRICS_READ)

        def hang(args: dict[str, Any]) -> dict[str, Any]:
            time.sleep(3)
            return {"samples": []}

        monkeypatch.setitem(
            slow_tools._TOOLS,
            slow.METRICS_READ,
            slow_tools.SlowTool(real.name, hang, lambda args: 0.5),
        )
    with fake_server(200, b"{}", delay=3) as url:
        MetricsSource.objects.create(name="shop-prom", base_url=url, timeout_seconds=0.5)
        session = start(
            make_user("olga", "operator"), without_metrics_file(EXAMPLE, tmp_path), "shop-prom"
        )
        result = summarize(session)

    reason = (
        f"Prometheus at {url} did not answer within 0.5 s"
        if case == "slow"
        else "metrics_read did not answer within 0.5 s"
    )
    (request,) = read_requests(session)
    assert request.status == "failed" and reason in request.error
    outcomes = Event.objects.filter(session=session, type="tool.slow_call")
    (outcome,) = outcomes.filter(payload__tool="metrics_read")
    assert outcome.payload["status"] == "error" and reason in outcome.payload["error"]
    call = ToolCall.objects.get(session=session, tool_name="anomalies")
    assert call.status == "failed" and reason in call.error
    # The session goes on with the logs and the changes, and says what it lacked.
    assert result["status"] in ("completed", "waiting_user")
    assert "metrics" in result["missing_sources"]
    other = {c.tool_name: c.status for c in ToolCall.objects.filter(session=session)}
    assert other["log_signatures"] == other["deploys"] == "completed"


# --- a runner killed mid-read -----------------------------------------------------------


class HoldFirst:
    """A proxy in front of the Prometheus: it holds the first request it gets (a read in
    flight when its runner is killed) and forwards every other one."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.seen, self.held = upstream, 0, threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy.seen += 1
                if proxy.seen == 1:
                    proxy.held.set()
                    time.sleep(300)  # its client is killed meanwhile
                    return
                answer = httpx.get(proxy.upstream + self.path, timeout=10)
                try:
                    self.send_response(answer.status_code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer.content)))
                    self.end_headers()
                    self.wfile.write(answer.content)
                except OSError:
                    pass

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_runner_killed_mid_read_is_replaced_and_the_read_recorded_once(
    builtin: None,
    clean_queue: None,
    db_url: str,
    redis_url: str,
    stored: Path,
    waits: None,
    prometheus: str,
    make_user: Callable[..., User],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(job_enqueue, "run_pending_inline", lambda session_id: False)
    proxy = HoldFirst(prometheus)
    MetricsSource.objects.create(name="shop-prom", base_url=proxy.url, timeout_seconds=90)
    session = start(
        make_user("olga", "operator"), without_metrics_file(EXAMPLE, tmp_path), "shop-prom"
    )
    (request,) = read_requests(session)
    env = service_env(db_url, redis_url, AERO_LLM_CLAIM_SECONDS="2", AERO_BUNDLE_DIR=str(stored))
    log = (tmp_path / "processes.log").open("w")
    processes: list[subprocess.Popen[str]] = []

    def start_process(command: str) -> subprocess.Popen[str]:
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

    try:
        first = start_process("aero_llm_runner")
        assert proxy.held.wait(180), "the first runner never read the metrics"
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        request.refresh_from_db()
        assert request.status == "pending" and request.claims == 1
        assert not Event.objects.filter(session=session, type="tool.slow_call").exists()

        start_process("aero_llm_runner")  # takes the read over once the dead one's claim ends
        start_process("aero_worker")  # runs the jobs the runner enqueues
        concluded = Session.objects.filter(pk=session.pk, status__in=("waiting_user", "completed"))
        wait_until(concluded.exists, 400, "the session to conclude")
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        proxy.close()
        log.close()
    session.refresh_from_db()
    request.refresh_from_db()
    assert session.status in ("waiting_user", "completed"), (
        tmp_path / "processes.log"
    ).read_text()[-3000:]
    assert (request.status, request.claims) == ("done", 2)
    # The read is recorded once, the evidence once; the session concluded from it.
    types = Counter(Event.objects.filter(session=session).values_list("type", flat=True))
    assert types["tool.slow_call"] >= 1
    assert (
        Event.objects.filter(
            session=session, type="tool.slow_call", payload__request=request.key
        ).count()
        == 1
    )
    calls = ToolCall.objects.filter(session=session)
    assert calls.count() == len(set(calls.values_list("call_id", flat=True)))
    assert calls.get(tool_name="anomalies").status == "completed"
    assert session.snapshot["root_cause"]["service"] == "payments"


def test_a_metrics_read_is_stored_compactly_and_read_back_as_the_same_samples() -> None:
    """The stored answer holds each series once (times in epoch milliseconds): read back,
    the samples are Prometheus's, in the order prometheus.samples gives them."""
    from datetime import UTC, datetime, timedelta

    start = datetime(2026, 10, 5, 8, 0, tzinfo=UTC)
    rows = sorted(
        (
            (start + timedelta(seconds=15 * n, milliseconds=n % 7), service, metric, n / 3)
            for n in range(200)
            for service, metric in (("inventory", "up"), ("orders", "latency_p99_ms"))
        ),
        key=lambda r: (r[1], r[2], r[0]),
    )
    stored = slow.samples_result(rows)
    assert len(stored["series"]) == 2
    assert slow.samples_of(stored) == rows
    as_rows = {"samples": [[ts.isoformat(), s, m, v] for ts, s, m, v in rows]}
    assert len(json.dumps(stored)) < len(json.dumps(as_rows)) / 2
    assert slow.samples_of(as_rows) == rows  # an answer stored before, as rows
