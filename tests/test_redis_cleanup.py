"""A run's Redis keys are removed at its end (tests/redis_cleanup.py), and only its own:
another run sharing the database keeps its queues, jobs and workers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from rq import Queue, Worker

from tests.redis_cleanup import remove_run_keys
from tests.settings import TEST_DB_NAME

pytestmark = pytest.mark.services


def _noop() -> None:
    """A job's function (rq stores its dotted name; nothing runs it here)."""


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(str(settings.REDIS_URL))
    yield client
    for run in (f"{TEST_DB_NAME}-probe", f"{TEST_DB_NAME}-probe0"):
        remove_run_keys(client, run)
    client.close()


def _plant(client: redis.Redis, run: str) -> dict[str, str]:
    """What a run leaves: a queue with a job, a worker listening on it, its priority
    queue, a rate counter without expiry and a replay cache entry."""
    queue = Queue(f"aero-{run}", connection=client)
    job = queue.enqueue(_noop)
    Queue(f"aero-{run}-first", connection=client).enqueue(_noop)
    worker = Worker([queue], connection=client, name=f"probe-{run}")
    worker.register_birth()
    client.set(f"aero-{run}:rate:login:addr-127.0.0.1:1", 1)
    client.set(f"aero-{run}:1:replay-checkpoint", b"x")
    return {"job": _text(job.key), "worker": _text(worker.key), "queue": _text(queue.key)}


def _text(key: bytes | str) -> str:
    return key.decode() if isinstance(key, bytes) else key


def _keys(client: redis.Redis) -> set[str]:
    return {key.decode() for key in client.scan_iter(count=1000)}


def test_a_runs_keys_go_and_another_runs_stay(client: redis.Redis) -> None:
    mine, theirs = f"{TEST_DB_NAME}-probe", f"{TEST_DB_NAME}-probe0"
    planted, kept = _plant(client, mine), _plant(client, theirs)
    client.sadd("rq:workers", "rq:worker:killed-long-ago")  # its hash expired
    before = _keys(client)
    assert set(planted.values()) <= before

    assert remove_run_keys(client, mine) >= 6
    after = _keys(client)
    assert not {key for key in after if f"aero-{mine}:" in key or key.endswith(f"aero-{mine}")}
    assert not after & set(planted.values())
    assert not any(f"aero-{mine}-first" in key for key in after)
    assert planted["worker"].encode() not in client.smembers("rq:workers")
    assert planted["queue"].encode() not in client.smembers("rq:queues")
    assert b"rq:worker:killed-long-ago" not in client.smembers("rq:workers")
    # The other run (a name that starts with this one's) keeps everything.
    assert set(kept.values()) <= after
    assert kept["worker"].encode() in client.smembers("rq:workers")
    assert kept["queue"].encode() in client.smembers("rq:queues")
