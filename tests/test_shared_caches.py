"""The shared caches are made once per process: a database call from a task of its own
(as the live hub makes one per batch, daphne one per request) reuses the process's
backend and its Redis connections instead of making new ones."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from django.core.cache import BaseCache
from django.test import override_settings

from aero.db_async import db_call
from aero.shared_caches import shared_cache

pytestmark = pytest.mark.services


def used_backend() -> BaseCache:
    cache = shared_cache("timeline_rows")
    cache.get("probe")  # connects, as a render's get_many does
    return cache


async def from_new_tasks() -> list[BaseCache]:
    # Each call from a fresh task: the context a hub's batch or a request starts in.
    return [await asyncio.ensure_future(db_call(used_backend)()) for _ in range(3)]


def test_database_calls_from_new_tasks_share_one_backend_and_pool() -> None:
    first, second, third = asyncio.run(from_new_tasks())
    assert first is second is third
    pools = {id(pool) for pool in cast(Any, first)._cache._pools.values()}
    assert len(pools) == 1  # one connection pool for the process, not one per call


def test_a_test_overriding_caches_gets_its_own_backend() -> None:
    before = shared_cache("timeline_rows")
    local = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "probe"}
    with override_settings(CACHES={"default": local, "timeline_rows": local}):
        inside = shared_cache("timeline_rows")
        assert inside is not before
        assert type(inside).__name__ == "LocMemCache"
    assert shared_cache("timeline_rows") is not inside
