"""Change stamps: a random token per named thing, replaced after every commit that
changes it, read by what is rendered once and shared until it changes (the approval
queue's pages, approvals.page_cache).

A stamp is a new random value on every change (never a counter: a cache emptied by a
restart never brings back an old value under which a page was kept). It moves in
`transaction.on_commit`, so a reader that sees the new stamp reads the committed rows;
a reader that read the old stamp just before may keep a page newer than its stamp,
never an older one. Kept in the `queue_cards` cache: Redis shared by every process in
production, the process's own memory in embedded mode (one process).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.core.cache import caches
from django.db import transaction

CACHE = "queue_cards"
PREFIX = "stamp:"
# What the approval queue shows: approvals, the sessions' facts on their cards (title,
# snapshot), the board (restrictions, to-dos, the world), scenarios' names, users.
QUEUE = "approval-queue"


def touch_now(*names: str) -> None:
    """Move the stamps of `names` now (the caller has committed)."""
    caches[CACHE].set_many({PREFIX + name: uuid.uuid4().hex for name in names}, timeout=None)


def touch(*names: str) -> None:
    """Move the stamps of `names` once the current transaction commits (at once outside
    one). Call it inside the transaction that changed what they stamp."""
    transaction.on_commit(lambda: touch_now(*names))


def read(names: Iterable[str]) -> tuple[str, ...]:
    """The stamps of `names`, in order; a stamp not kept yet (first read, a cache
    emptied) is created, so two readers never disagree for long and an old value never
    returns."""
    names = list(names)
    cache = caches[CACHE]
    found = cache.get_many([PREFIX + name for name in names])
    missing = [name for name in names if PREFIX + name not in found]
    if missing:
        for name in missing:
            # add: of two first readers, one value wins and both use it.
            cache.add(PREFIX + name, uuid.uuid4().hex, timeout=None)
        found.update(cache.get_many([PREFIX + name for name in missing]))
    # Still none (the cache refused it): a value of this request's own, shared by nobody
    # and so never stale.
    return tuple(str(found.get(PREFIX + name) or uuid.uuid4().hex) for name in names)
