"""What a worker pays around each job, besides the job (issue 11 item 9): its
connections' health checks are a poll of the socket, not a `SELECT 1` round trip each,
yet a connection whose backend ended is still replaced before the job uses it; and the
worker's heartbeat row names the job's session at once but says "idle" only once the
worker stayed idle, not between two jobs that follow each other."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

import django_rq
import pytest
import redis
from django.conf import settings
from django.db import close_old_connections, connection, connections

from diagnosis import conn_health, jobs, worker
from diagnosis.jobs import checkpoints
from diagnosis.jobs.job import _config
from diagnosis.models import WorkerBeat

pytestmark = pytest.mark.services


def terminate_backend(pid: int) -> None:
    """End one backend from another connection (what a PostgreSQL restart does to all)."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    time.sleep(0.2)  # its FATAL message and hang-up reach our socket


def count_usable(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Django's own health check (`SELECT 1`), recorded each time it runs."""
    checks: list[bool] = []
    original = type(connections["default"]).is_usable

    def is_usable(self: Any) -> bool:
        checks.append(result := original(self))
        return bool(result)

    monkeypatch.setattr(type(connections["default"]), "is_usable", is_usable)
    return checks


def test_a_healthy_connection_is_checked_without_a_round_trip(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection.ensure_connection()
    checks = count_usable(monkeypatch)
    close_old_connections()  # what the worker does before each job
    conn_health.check_django_connections()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert checks == []  # no SELECT 1 of Django's before the job's first query


def test_a_connection_whose_backend_ended_is_replaced_before_the_job_uses_it(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    terminate_backend(pid)
    checks = count_usable(monkeypatch)
    close_old_connections()
    conn_health.check_django_connections()
    with connection.cursor() as cursor:  # would raise on the dead socket
        cursor.execute("SELECT pg_backend_pid()")
        (new_pid,) = cursor.fetchone()
    assert checks == [False] and new_pid != pid  # Django's check ran, and reconnected


def test_the_checkpointer_connection_is_checked_without_a_round_trip(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = jobs.agent_graph()
    runtime = checkpoints._runtime
    assert runtime is not None
    executed: list[str] = []
    original = runtime.conn.execute

    def execute(query: Any, *args: Any, **kwargs: Any) -> Any:
        executed.append(str(query))
        return original(query, *args, **kwargs)

    monkeypatch.setattr(runtime.conn, "execute", execute)
    assert jobs.agent_graph() is graph  # reused, nothing sent to check it
    assert executed == []

    pid = runtime.conn.info.backend_pid
    terminate_backend(pid)
    rebuilt = jobs.agent_graph()  # its backend ended: a new connection, a working graph
    assert rebuilt is not graph
    assert checkpoints._runtime is not None and checkpoints._runtime.conn.info.backend_pid != pid
    rebuilt.get_state(_config(str(uuid.uuid4())))


def wait_for(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_the_row_names_the_job_at_once_and_says_idle_once_the_worker_settles(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker, "IDLE_SETTLE_SECONDS", 0.5)
    beats = worker.WorkerHeartbeat(f"overhead-{uuid.uuid4().hex}", reconciling=False)
    beats.start()
    writes: list[str | None] = []
    original = beats.beat_job

    def beat_job() -> None:
        writes.append(beats.session_id)
        original()

    monkeypatch.setattr(beats, "beat_job", beat_job)
    row = WorkerBeat.objects.filter(name=beats.name)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())

    def names(session: str) -> bool:
        return str(row.get().session_id) == session

    try:
        beats.job_started(first)
        assert wait_for(lambda: names(first), 3.0)  # from the start of the job
        beats.job_ended()
        beats.job_started(second)  # the next job, within the settle time
        assert wait_for(lambda: names(second), 3.0)
        beats.job_ended()
        assert str(row.get().session_id) == second  # not yet: it may start another
        assert wait_for(lambda: row.get().session_id is None, 3.0)  # then idle
        # Two jobs' starts and one "idle": the idle in between was never written.
        assert writes == [first, second, None]
    finally:
        beats.stop()
    assert not row.exists()


def test_an_idle_write_never_overwrites_a_job_that_started_meanwhile(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The beat thread decides to write "idle" under the lock job_started() takes: an
    idle write due when the next job started is dropped, not written over the job."""
    monkeypatch.setattr(worker, "IDLE_SETTLE_SECONDS", 3600.0)  # the thread never writes
    beats = worker.WorkerHeartbeat(f"overhead-{uuid.uuid4().hex}", reconciling=False)
    beats.start()
    row = WorkerBeat.objects.filter(name=beats.name)
    session = str(uuid.uuid4())
    try:
        beats.job_ended()
        monkeypatch.setattr(worker, "IDLE_SETTLE_SECONDS", 0.0)  # the idle write is due
        beats.job_started(session)  # ... and the next job starts first
        beats.write_settled_idle()  # the beat thread's turn
        assert wait_for(lambda: str(row.get().session_id) == session, 3.0)
        beats.write_settled_idle()
        assert str(row.get().session_id) == session
        beats.job_ended()
        beats.write_settled_idle()
        assert row.get().session_id is None
    finally:
        beats.stop()


def test_a_jobs_start_costs_the_job_no_statement_and_the_row_still_names_it(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row naming the running job is written by the beat thread, not on the
    job's own connection (a round trip per job on the path of every session behind it);
    /healthz still reads the job's session within moments."""
    from django.test.utils import CaptureQueriesContext

    beats = worker.WorkerHeartbeat(f"overhead-{uuid.uuid4().hex}", reconciling=False)
    beats.start()
    row = WorkerBeat.objects.filter(name=beats.name)
    session = str(uuid.uuid4())
    try:
        with CaptureQueriesContext(connection) as queries:
            beats.job_started(session)
        assert len(queries) == 0
        assert wait_for(lambda: str(row.get().session_id) == session, 3.0)
    finally:
        beats.stop()


# Where each job of the test below starts: the worker's Redis sends so far.
_sends_at_start: list[int] = []
_sends: list[bytes] = []


def noop_job(session_id: str) -> None:
    """A job that does nothing: what rq itself pays around it is what is left."""
    _sends_at_start.append(len(_sends))


def test_rq_pays_few_redis_round_trips_between_two_jobs(
    transactional_db: None, clean_queue: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rq beat the worker's key four times around each job (three round trips
    each, unless in a pipeline) and set its state to "idle" twice: 20 round trips from
    one job's start to the next one's, each on the path of every session queued behind.
    A beat is one round trip, skipped when the last one set the same TTL moments ago; an
    unchanged state is not written again."""
    queue = django_rq.get_queue(settings.AERO_QUEUE)
    for _ in range(6):
        queue.enqueue(noop_job, str(uuid.uuid4()))
    _sends_at_start.clear()
    _sends.clear()
    original = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        _sends.append(command)  # one request: a command, or a pipeline's all at once
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", send)
    assert worker.AeroWorker([queue], connection=queue.connection).work(burst=True)

    assert len(_sends_at_start) == 6
    between = [b - a for a, b in itertools.pairwise(_sends_at_start)]
    # The start (the execution, the job "started": one transaction), the end (the
    # job's last beat, its result, the registries, the state back to idle and the
    # worker's beat: one transaction), the dequeue and the next job's read: 4. rq 3.0's
    # own handling sent 11 (a WATCH and a read of the job's dependents, the job's last
    # beat, the state, the beat and the suspension check each on its own).
    assert max(between) <= 4, between


def _redis_shape(client: Any, job_id: str, worker_key: str) -> dict[str, Any]:
    """What a finished job left in Redis, ids and times left out: its keys and their
    types, the hash fields and the TTLs rounded to the minute, the worker's state."""
    shape: dict[str, Any] = {}
    for raw in client.scan_iter(match=f"*{job_id}*", count=1000):
        key = raw.decode().replace(job_id, "<job>")
        key = key.split(":<job>:")[0] + ":<job>:<id>" if ":<job>:" in key else key
        kind = client.type(raw).decode()
        fields = sorted(f.decode() for f in client.hkeys(raw)) if kind == "hash" else None
        shape[key] = (kind, fields, round(client.ttl(raw) / 60))
    shape["finished"] = [
        r.decode().replace(job_id, "<job>")
        for r in client.zrange("rq:finished:" + settings.AERO_QUEUE, 0, -1)
    ]
    shape["wip"] = client.zcard("rq:wip:" + settings.AERO_QUEUE)
    worker = {k.decode(): v.decode() for k, v in client.hgetall(worker_key).items()}
    shape["worker"] = (
        worker.get("state"),
        worker.get("successful_job_count"),
        sorted(worker),
        round(client.ttl(worker_key) / 10),
    )
    return shape


def test_a_job_leaves_in_redis_what_rqs_own_handling_leaves(
    transactional_db: None, clean_queue: None
) -> None:
    """AeroWorker sends a job's start and end in one transaction each, with rq 3.0's
    own calls: the job, its result, the registries and the worker's key end as rq's own
    worker leaves them (an rq that changes what it writes fails here)."""
    from rq.worker import SimpleWorker

    queue = django_rq.get_queue(settings.AERO_QUEUE)
    shapes = []
    for worker_class in (SimpleWorker, worker.AeroWorker):
        queue.connection.delete("rq:finished:" + settings.AERO_QUEUE)  # earlier tests' jobs
        job = queue.enqueue(
            noop_job, str(uuid.uuid4()), job_timeout=600, result_ttl=300, failure_ttl=86400
        )
        rq_worker = worker_class([queue], connection=queue.connection)
        assert rq_worker.work(burst=True)
        shapes.append(_redis_shape(queue.connection, job.id, rq_worker.key))
        assert job.get_status(refresh=True) == "finished"
        assert job.latest_result() is not None
    assert worker.LEAN_RQ
    assert shapes[1] == shapes[0]
