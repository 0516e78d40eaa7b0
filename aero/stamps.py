"""Change stamps: a random token per named thing, replaced after every commit that
changes it, read by what is rendered once and shared until it changes (the approval
queue's pages, approvals.page_cache).

A stamp is a new random value on every change (never a counter: a Redis emptied by a
restart never brings back an old value under which a page was kept). It moves in
`transaction.on_commit`, so a reader that sees the new stamp reads the committed rows;
a reader that read the old stamp just before may keep a page newer than its stamp,
never an older one. Kept in Redis (REDIS_URL) as plain strings through one client per
process (read on every queue page: no cache backend's client built per call, no
pickling), in the process's own memory in embedded mode (one process).
"""

from __future__ import annotations

import threading
import uuid
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.db import transaction

# What the approval queue shows: approvals, the sessions' facts on their cards (title,
# snapshot), the board (restrictions, to-dos, the world), scenarios' names, users.
QUEUE = "approval-queue"
# Who is signed in as whom with which roles (aero.session_store): users, their groups
# and the groups themselves. Each sign-in session also has its own (session_stamp).
SIGN_IN = "sign-in"
# Stamps outlive pages many times over; the expiry only drops names no longer used.
TTL = 7 * 24 * 3600

_memory: dict[str, str] = {}
_memory_lock = threading.Lock()


@cache
def _client() -> Any:
    return redis.Redis.from_url(settings.REDIS_URL) if settings.REDIS_URL else None


def _key(name: str) -> str:
    return f"{settings.AERO_CHANNEL_PREFIX}:stamp:{name}"


def touch_now(*names: str) -> None:
    """Move the stamps of `names` now (the caller has committed)."""
    client = _client()
    if client is None:
        with _memory_lock:
            _memory.update({name: uuid.uuid4().hex for name in names})
        return
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.set(_key(name), uuid.uuid4().hex, ex=TTL)
        pipe.execute()


def touch(*names: str) -> None:
    """Move the stamps of `names` once the current transaction commits (at once outside
    one). Call it inside the transaction that changed what they stamp."""
    transaction.on_commit(lambda: touch_now(*names))


def session_stamp(session_key: str) -> str:
    """The name of a sign-in session's own stamp (moved when its row is saved or
    deleted)."""
    return f"session:{session_key}"


def read(name: str) -> str:
    """The stamp of `name`; one not kept yet (first read, Redis emptied) is created, so
    an old value never returns."""
    return read_many(name)[0]


def read_many(*names: str) -> list[str]:
    """The stamps of `names`, in one round trip to Redis (as `read` each)."""
    client = _client()
    if client is None:
        with _memory_lock:
            return [_memory.setdefault(name, uuid.uuid4().hex) for name in names]
    keys = [_key(name) for name in names]
    values = client.mget(keys)
    for i, value in enumerate(values):
        if value is None:
            # SET NX: of two first readers, one value wins and both read it.
            client.set(keys[i], uuid.uuid4().hex, ex=TTL, nx=True)
            values[i] = client.get(keys[i])
    # Still none (evicted at once): this request's own value, shared by nobody.
    return [value.decode() if value is not None else uuid.uuid4().hex for value in values]
