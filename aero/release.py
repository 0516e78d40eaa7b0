"""A digest of the code, templates and translations of this release: what is rendered
once and shared through Redis (queue cards, timeline rows) carries it in its key, so a
process of one deploy never shows what another deploy rendered."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from django.conf import settings

_PARTS = ("aero", "approvals", "diagnosis", "packs", "scenarios_admin", "templates", "locale")
_FILES = ("*.py", "*.html", "*.mo")


@cache
def release() -> str:
    digest = hashlib.blake2b(digest_size=8)
    root = Path(settings.BASE_DIR)
    paths: list[Path] = []
    for part in _PARTS:
        for pattern in _FILES:
            paths.extend((root / part).rglob(pattern))
    for path in sorted(paths):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
