"""What a test run leaves in Redis, removed at its end (tests/conftest.py's
pytest_sessionfinish): the keys named after the run (tests/settings.py names its queues,
channel and cache prefix `aero-<test database>`), the rq jobs and workers of those
queues (their keys carry random ids, so they are found by their queue), and the queues'
entries in rq's shared sets. Other runs sharing the database keep theirs."""

from __future__ import annotations

import re

import redis

# rq's keys holding one job: the job, its dependents and its results.
_JOB_KEYS = ("rq:job:{id}", "rq:job:{id}:dependents", "rq:job:{id}:dependencies", "rq:results:{id}")


def _decode(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def run_pattern(run: str) -> re.Pattern[str]:
    """Keys naming `aero-<run>` as a whole word: the run's own queue, a `-first` or
    `-run` queue derived from it, `:`-separated keys under it. Not `aero-<run>0`, another
    xdist worker's."""
    return re.compile(rf"aero-{re.escape(run)}(?=$|[-:])")


def remove_run_keys(client: redis.Redis, run: str) -> int:
    """Delete what run `run` left in `client`'s database; the number of keys deleted."""
    mine = run_pattern(run)
    doomed: set[str] = set()
    for raw in client.scan_iter(count=1000):
        key = _decode(raw)
        if mine.search(key):
            doomed.add(key)
            continue
        kind = _decode(client.type(raw))
        if key.startswith("rq:job:") and key.count(":") == 2 and kind == "hash":
            if mine.search(_decode(client.hget(raw, "origin"))):
                job = key.removeprefix("rq:job:")
                doomed.update(k.format(id=job) for k in _JOB_KEYS)
        elif (
            key.startswith("rq:worker:")
            and kind == "hash"
            and mine.search(_decode(client.hget(raw, "queues")))
        ):
            doomed.add(key)
    # rq's sets of every queue and every worker, shared by all runs: only ours leave.
    for member in client.smembers("rq:queues"):
        if mine.search(_decode(member)):
            client.srem("rq:queues", member)
    # A member whose hash is gone is a dead worker (one a test killed): rq's own
    # registry clean-up drops those too, whichever run they were.
    for worker in client.smembers("rq:workers"):
        if _decode(worker) in doomed or not client.exists(worker):
            client.srem("rq:workers", worker)
    deleted = 0
    ordered = sorted(doomed)
    for start in range(0, len(ordered), 500):
        deleted += int(client.delete(*ordered[start : start + 500]))
    return deleted
