"""WhiteNoise's scan of the static finders, once per test process. Every test client
builds its own request handler at its first request, and WhiteNoise's middleware walks
and stats every app's and STATICFILES_DIRS' static files when it is made: most of the
CPU (about 30 ms) of a client's first request, and the suite makes a client for each
`call()` and `login()`. The files
found are the same for the same settings (no test adds a static file under a finder's
directory), so the scan is kept per settings that shape it; STATIC_ROOT's files (read
apart, `add_files`) are not kept."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from whitenoise.middleware import WhiteNoiseMiddleware

_scan = WhiteNoiseMiddleware.add_files_from_finders
_found: dict[tuple[Any, ...], dict[str, Any]] = {}


def _key(middleware: WhiteNoiseMiddleware) -> tuple[Any, ...]:
    return (
        middleware.static_prefix,
        tuple(map(str, settings.STATICFILES_DIRS)),
        tuple(settings.STATICFILES_FINDERS),
        tuple(settings.INSTALLED_APPS),
    )


def add_files_from_finders(middleware: WhiteNoiseMiddleware) -> None:
    key = _key(middleware)
    found = _found.get(key)
    if found is None:
        before = dict(middleware.files)
        _scan(middleware)
        found = {url: f for url, f in middleware.files.items() if before.get(url) is not f}
        _found[key] = found
    else:
        middleware.files.update(found)


@contextmanager
def kept() -> Iterator[None]:
    """WhiteNoise's middleware made meanwhile reuses the scan."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WhiteNoiseMiddleware, "add_files_from_finders", add_files_from_finders)
        yield
