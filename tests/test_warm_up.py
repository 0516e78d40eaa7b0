"""A worker and the runner pay for the model client before they say they are up (ADR
183): the first session after a start, often the first incident after a deploy, no
longer waits for LangChain's OpenAI client to be imported and built (~1.2 s in a
worker's first ReAct step, ~0.7 s in the runner's first call, on the bench's machine)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from typing import Any

import django_rq
import pytest
from django.conf import settings
from django.db import DatabaseError, connections

from diagnosis import jobs
from diagnosis.agent import clients as agent_clients
from diagnosis.jobs import checkpoints
from diagnosis.jobs import job as the_job
from diagnosis.llm_runner import runner as llm_runner
from diagnosis.worker import AeroWorker, WorkerHeartbeat
from packs.airport import world as airport_world
from scenarios_admin.models import ProviderConfig
from tests.servers import ROOT


def provider(name: str, *, enabled: bool = True) -> ProviderConfig:
    config = ProviderConfig(
        name=name,
        kind="openai",
        base_url="http://127.0.0.1:9/v1",  # never called: building a client sends nothing
        model="fake-1",
        enabled=enabled,
        timeout_seconds=5,
    )
    config.set_api_key("sk-test-123")
    config.save()
    return config


@pytest.fixture(autouse=True)
def no_clients() -> None:
    agent_clients._clients.clear()


def printed_by(code: str) -> list[str]:
    """What `code` prints, run in a new Python process on the test settings: a start-up
    as a server process makes it, not this test process's."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_warm_up_builds_each_enabled_providers_client_the_first_call_then_uses(
    db: None,
) -> None:
    enabled = provider("primary")
    provider("retired", enabled=False)

    clients = agent_clients.warm_up()

    assert len(clients) == 1
    # The first call finds the client built: nothing is built on its path.
    assert agent_clients.client_for(enabled) is clients[0]


def test_warm_up_without_a_readable_database_builds_nothing_and_says_so(
    db: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker started before the migrations ran: it starts, and its first call builds
    the client as before."""
    provider("primary")

    def unreadable() -> list[ProviderConfig]:
        raise DatabaseError('relation "scenarios_admin_providerconfig" does not exist')

    monkeypatch.setattr(agent_clients.enabled_configs, "rows", unreadable)
    assert agent_clients.warm_up() == []
    assert "warm-up: the provider configs could not be read" in caplog.text


@pytest.mark.services
def test_a_worker_has_its_model_client_before_its_first_beat(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = provider("primary")
    at_first_beat: list[list[Any]] = []
    start = WorkerHeartbeat.start

    def first_beat(self: WorkerHeartbeat) -> None:
        at_first_beat.append(list(agent_clients._clients.values()))
        start(self)

    monkeypatch.setattr(WorkerHeartbeat, "start", first_beat)
    queue = django_rq.get_queue(settings.AERO_QUEUE)
    AeroWorker([queue], connection=queue.connection).work(burst=True)

    assert len(at_first_beat) == 1 and len(at_first_beat[0]) == 1
    assert agent_clients.client_for(config) is at_first_beat[0][0]


@pytest.mark.services
def test_a_worker_has_its_agent_graph_and_airport_before_its_first_beat(
    builtin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first job after a start found neither, and paid ~0.4 s for them with
    every new session queued behind it."""
    jobs.close_agent_runtime()
    airport_world.forget_cached_graph()
    at_first_beat: list[tuple[bool, bool]] = []
    start = WorkerHeartbeat.start

    def first_beat(self: WorkerHeartbeat) -> None:
        at_first_beat.append(
            (checkpoints._runtime is not None, "active" in airport_world._graph_cache)
        )
        start(self)

    monkeypatch.setattr(WorkerHeartbeat, "start", first_beat)
    queue = django_rq.get_queue(settings.AERO_QUEUE)
    try:
        AeroWorker([queue], connection=queue.connection).work(burst=True)
        graph = checkpoints._runtime.graphs.get("apron") if checkpoints._runtime else None
        # What the first job asks for is what the warm-up built: nothing built again.
        assert graph is not None and jobs.agent_graph() is graph
    finally:
        jobs.close_agent_runtime()

    assert at_first_beat == [(True, True)]


def test_a_worker_starts_when_its_agent_graph_cannot_be_built_yet(
    db: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker started before the migrations: it says so and its first job builds the
    graph."""

    def unbuildable(kind: str | None = None) -> None:
        raise DatabaseError('relation "checkpoints" does not exist')

    monkeypatch.setattr(the_job, "agent_graph", unbuildable)
    jobs.warm_up_worker()
    assert "warm-up: the agent or its world is not ready yet" in caplog.text


@pytest.mark.services
def test_the_runner_has_its_clients_and_pool_before_its_first_beat(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = provider("primary")
    runner = llm_runner.Runner(enqueue=None)
    stop = asyncio.Event()
    at_first_beat: list[tuple[list[Any], int]] = []
    beat = llm_runner.beat

    def first_beat(name: str, started_at: Any) -> None:
        at_first_beat.append((list(agent_clients._clients.values()), len(runner.sdk_clients)))
        beat(name, started_at)
        stop.set()

    monkeypatch.setattr(llm_runner, "beat", first_beat)

    def serve() -> None:
        try:
            asyncio.run(runner.serve(stop))
        finally:
            connections.close_all()

    # In a thread of its own: the runner's loop must not be this thread's (pytest's).
    thread = threading.Thread(target=serve)
    thread.start()
    thread.join(timeout=30)

    assert at_first_beat, "the runner never beat"
    clients, pools = at_first_beat[0]
    assert len(clients) == 1 and agent_clients.client_for(config, under_lease=False) is clients[0]
    assert pools == 1  # its own connection pool, for this loop, built already


def test_the_web_process_imports_the_model_client_at_its_start() -> None:
    """The first new session's request records its extraction through LangChain's
    OpenAI client: the web process imports it at its start, on a thread, so that it
    listens meanwhile (the app's import itself loads neither the OpenAI SDK, the MCP
    client nor LangGraph, which only a job needs: a restart waited for them). A worker
    has the MCP client from its start."""
    code = (
        "import sys, threading, django; django.setup(); "
        "from django.urls import get_resolver; get_resolver().url_patterns; "
        "print('openai' in sys.modules, 'mcp' in sys.modules, 'langgraph' in sys.modules); "
        "import aero.asgi; "
        "[t.join() for t in threading.enumerate() if t.name == 'aero-warm-up']; "
        "print('langchain_openai' in sys.modules, 'diagnosis.agent.react' in sys.modules); "
        "import diagnosis.worker; print('mcp.client.stdio' in sys.modules)"
    )
    assert printed_by(code) == ["False", "False", "False", "True", "True", "True"]


def test_a_websocket_only_daphne_imports_no_model_client() -> None:
    """With rq, daphne serves only the WebSockets and never calls a model: importing the
    clients there took CPU from the first pushes after a restart."""
    code = (
        "import sys, threading, django; django.setup(); from django.conf import settings; "
        "settings.AERO_JOB_BACKEND = 'rq'; import aero.asgi; "
        "[t.join() for t in threading.enumerate() if t.name == 'aero-warm-up']; "
        "print('langchain_openai' in sys.modules)"
    )
    assert printed_by(code) == ["False"]


def test_the_web_process_prepares_the_live_renders_at_its_start() -> None:
    """The first live push after a start found the release digest and the session page's
    templates unmade (~0.3 s of CPU that every viewer of that event waited for): daphne
    makes them at its start, on a thread."""
    code = (
        "import threading, django; django.setup(); import aero.asgi; "
        "[t.join() for t in threading.enumerate() if t.name == 'aero-warm-up-live']; "
        "from aero.release import release; from django.template import engines; "
        "from diagnosis.startup import LIVE_TEMPLATES; "
        "cached = engines.all()[0].engine.template_loaders[0].get_template_cache; "
        "print(release.cache_info().currsize, all(n in cached for n in LIVE_TEMPLATES))"
    )
    assert printed_by(code) == ["1", "True"]


@pytest.mark.parametrize(
    ("start", "frozen", "young"),
    [
        ("import aero.wsgi", True, 700),  # a gunicorn worker: Python's default threshold
        ("import aero.asgi", True, 50_000),  # daphne, holding thousands of sockets
        ("import django; django.setup(); import aero.asgi", False, 700),  # a test's import
    ],
)
def test_a_server_process_freezes_its_start_up_and_daphne_collects_young_less_often(
    start: str, frozen: bool, young: int
) -> None:
    """Two facts of one start-up, read from one process (each process start is ~3 s of
    the suite's CPU). A full collection walked everything start-up made (~180,000
    objects, ~100 ms with the GIL held in a gunicorn worker: the queue's p99 at 50
    clients): the servers import every view, then move it all out of the collector's
    reach at their start. At 700 allocations a young collection promoted the objects of
    the fan-outs under way, until a full collection fell due in the middle of the
    events: with 10,000 sockets open it walked them all, 0.3-1.0 s with the GIL held
    (bench/RESULTS.md); daphne collects its youngest generation less often."""
    code = (
        # Frozen objects are in no generation the collector walks.
        f"{start}; import gc; from approvals import views; "
        "print(all(o is not views.approval_queue for o in gc.get_objects())); "
        "print(gc.get_threshold()[0])"
    )
    printed = printed_by(code)
    assert printed[0] == str(frozen), "frozen"
    assert printed[1] == str(young), "young generation's threshold"
