"""The shared caches (settings.CACHES: timeline rows, session panels, queue cards and
pages, replay steps and exports), one backend object per process and alias.

Django's `caches[alias]` is context-local (asgiref's Local): under daphne every
request, and every database call the live hub makes from a task of its own, starts in a
fresh context, so each made a new RedisCache, with a new connection pool, a new TCP
connection to Redis and redis-py's driver metadata read again (about a third of a live
render's CPU in py-spy, bench/RESULTS.md). Redis's and the local-memory backends are
thread-safe, so one object serves every thread and task of the process."""

from __future__ import annotations

import threading
from typing import Any

from django.core.cache import BaseCache, caches
from django.core.signals import setting_changed
from django.dispatch import receiver

_made: dict[str, BaseCache] = {}
_lock = threading.Lock()


def shared_cache(alias: str) -> BaseCache:
    """The process's backend for `alias`, made on first use."""
    found = _made.get(alias)
    if found is None:
        with _lock:
            found = _made.get(alias)
            if found is None:
                found = _made[alias] = caches.create_connection(alias)
    return found


@receiver(setting_changed)
def _forget(setting: str, **kwargs: Any) -> None:
    # A test overriding CACHES gets backends made from its settings.
    if setting == "CACHES":
        with _lock:
            _made.clear()
