"""Renders shared by every web process (production: several daphne processes, one Redis).

A live fragment is a function of the pull (session, seq it follows, roles, answer box,
language) and of the session's last_seq when rendered, never of the viewer: the first
process to need one renders it and stores it here under that key for SHARE_SECONDS; the
others fetch it. A process that finds another one rendering the same key (its claim
taken) first renders and stores what it claimed itself, then waits up to
AERO_LIVE_SHARE_WAIT_SECONDS for the other's result, then renders it itself:
sharing saves work, it never holds a viewer back for long. Redis unreachable: every process renders
its own, as before. Embedded mode (no REDIS_URL) has one process: nothing to share.

Only what would be rendered anyway is stored: the key holds last_seq, so a newer event
makes a new key, and the short TTL bounds what a panel read from the rows may lag (as
the hub's per-process sharing does)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
from django.conf import settings

logger = logging.getLogger("diagnosis.live_shared")

SHARE_SECONDS = 5  # the processes a notice woke ask within milliseconds of each other
CLAIM_SECONDS = 2  # a claimer that died stops blocking others after this
POLL_SECONDS = 0.005

_client: redis.Redis | None = None
_client_lock = threading.Lock()


def _redis() -> redis.Redis | None:
    """One client per process (its pool is thread-safe), made once under a lock."""
    global _client
    if not settings.REDIS_URL:
        return None
    if _client is None:
        with _client_lock:
            if _client is None:
                _client = redis.Redis.from_url(
                    settings.REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5
                )
    return _client


def key_of(
    session_id: str,
    after: int,
    last_seq: int,
    roles: Iterable[str],
    composer_key: str | None,
    language: str | None,
) -> str:
    """The store's key for one render: everything the fragment depends on, hashed (a
    composer key or a role name has no length limit)."""
    what = json.dumps([after, last_seq, sorted(roles), composer_key, language])
    digest = hashlib.sha256(what.encode()).hexdigest()[:32]
    return f"{settings.AERO_CHANNEL_PREFIX}:live:{session_id}:{digest}"


def claim(keys: list[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The renders other processes stored for `keys`, and the keys another process has
    claimed (it is rendering them: `wait_for` them). Every other key is claimed for this
    process, which renders it and `put`s it before it waits for anyone else's: two
    processes that each claimed some sessions of a burst and then waited for the other's
    first each waited the whole AERO_LIVE_SHARE_WAIT_SECONDS, then rendered it all again."""
    client = _redis()
    if client is None or not keys:
        return {}, []
    try:
        found = _found(keys, client.mget(keys))
        missing = [key for key in keys if key not in found]
        if not missing:
            return found, []
        pipe = client.pipeline(transaction=False)
        for key in missing:
            pipe.set(f"{key}:claim", 1, nx=True, ex=_claim_seconds())
        return found, [key for key, mine in zip(missing, pipe.execute(), strict=True) if not mine]
    except redis.RedisError:
        logger.warning("shared live renders: Redis unreachable, rendering here", exc_info=True)
        return {}, []


def _claim_seconds() -> int:
    """A claim lasts at least as long as the others wait for it: one expiring first would
    let a third pull claim the key again and render it a second time."""
    return max(CLAIM_SECONDS, math.ceil(float(settings.AERO_LIVE_SHARE_WAIT_SECONDS)))


def wait_for(keys: list[str]) -> dict[str, dict[str, Any]]:
    """The renders of `keys` (claimed by other processes) stored within
    AERO_LIVE_SHARE_WAIT_SECONDS; the rest are left to this process to render."""
    client = _redis()
    if client is None or not keys:
        return {}
    found: dict[str, dict[str, Any]] = {}
    waiting = list(keys)
    deadline = time.monotonic() + float(settings.AERO_LIVE_SHARE_WAIT_SECONDS)
    try:
        while waiting:
            more = _found(waiting, client.mget(waiting))
            found.update(more)
            waiting = [key for key in waiting if key not in more]
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(POLL_SECONDS)
    except redis.RedisError:
        logger.warning("shared live renders: Redis unreachable, rendering here", exc_info=True)
        return found
    if waiting:
        # Said in the log: a render made twice is sharing's fallback, never silent.
        logger.info("shared live renders: %d not stored in time, rendered here", len(waiting))
    return found


def take(keys: list[str]) -> dict[str, dict[str, Any]]:
    """`claim` and `wait_for` in one: what is stored or arrives in time; the keys not
    found are this process's to render (and `put`)."""
    found, others = claim(keys)
    return {**found, **wait_for(others)}


def _found(keys: list[str], values: list[Any]) -> dict[str, dict[str, Any]]:
    return {key: json.loads(value) for key, value in zip(keys, values, strict=True) if value}


def put(renders: dict[str, dict[str, Any]]) -> None:
    """Store this process's renders for the others (and free their claims)."""
    client = _redis()
    if client is None or not renders:
        return
    try:
        pipe = client.pipeline(transaction=False)
        for key, value in renders.items():
            pipe.set(key, json.dumps(value), ex=SHARE_SECONDS)
            pipe.delete(f"{key}:claim")
        pipe.execute()
    except redis.RedisError:
        logger.warning("shared live renders: could not store", exc_info=True)
