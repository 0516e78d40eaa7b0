"""Where a session's bundle is kept: a folder per session under AERO_BUNDLE_DIR, the
checked bundle copied there when the session is created (an archive unpacked), read by
its jobs and only through views that check the session's access."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from django.conf import settings


def bundle_dir(session_id: Any) -> Path:
    return Path(settings.AERO_BUNDLE_DIR) / str(session_id)


def store_bundle(session_id: Any, checked_root: Path) -> Path:
    """Copy a checked bundle folder to the session's place (links were refused by the
    check; none are followed)."""
    target = bundle_dir(session_id)
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(checked_root, target, symlinks=True)
    return target


def delete_bundle(session_id: Any) -> None:
    shutil.rmtree(bundle_dir(session_id), ignore_errors=True)
