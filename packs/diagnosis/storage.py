"""Where a session's bundle is kept: a folder per session under AERO_BUNDLE_DIR, the
checked bundle copied there when the session is created (an archive unpacked), read by
its jobs and only through views that check the session's access; the soft delete
removes it (DomainPack.on_deleted)."""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import StreamingHttpResponse

from aero.models import audit
from aero.roles import VIEW_SESSIONS
from diagnosis.eventlog.masking import masks_roles

# Read and zipped a piece at a time: a bundle of 1M log lines never sits in memory.
CHUNK = 256 * 1024


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


def may_download_bundle(roles: frozenset[str]) -> bool:
    """The stored bundle is raw (logs and config as the reporter sent them, unmasked): it
    is for those who read the session unmasked, never a masked viewer (an auditor)."""
    return bool(roles & set(VIEW_SESSIONS)) and not masks_roles(roles)


def stored_files(session_id: Any) -> list[Path]:
    """The stored bundle's files in a stable order (empty: nothing stored). Links are
    skipped, never followed (the check refused them; a later one is not read)."""
    root = bundle_dir(session_id)
    if not root.is_dir():
        return []
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not (Path(folder) / d).is_symlink())
        found += [
            Path(folder) / name
            for name in sorted(files)
            if not (Path(folder) / name).is_symlink() and (Path(folder) / name).is_file()
        ]
    return found


class _Pipe:
    """Where zipfile writes: collects the bytes for the next chunk of the response (no
    tell(), so zipfile writes a stream: sizes after each entry, nothing seeks back)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes, /) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


def zip_stream(session_id: Any, files: list[Path]) -> Iterator[bytes]:
    """The stored bundle as a zip, produced as it is sent (paths relative to the bundle's
    root, under a folder named for the session)."""
    root = bundle_dir(session_id)
    pipe = _Pipe()
    with zipfile.ZipFile(pipe, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            name = f"bundle-{session_id}/{path.relative_to(root).as_posix()}"
            with path.open("rb") as source, archive.open(name, "w") as target:
                while chunk := source.read(CHUNK):
                    target.write(chunk)
                    if data := pipe.take():
                        yield data
            if data := pipe.take():
                yield data
    yield pipe.take()


def audit_download(session: Any, user: Any, files: list[Path], *, via: str) -> None:
    """A raw bundle leaving the system is an audit entry, as every export is."""
    listing = hashlib.sha256()
    size = 0
    for path in files:
        stat = path.stat()
        size += stat.st_size
        listing.update(f"{path.relative_to(bundle_dir(session.pk))}\0{stat.st_size}\n".encode())
    audit(
        "session.bundle_downloaded",
        obj=session,
        actor=user,
        session_id=session.pk,
        detail={
            "files": len(files),
            "bytes": size,
            "listing_sha256": listing.hexdigest(),
            "via": via,
        },
    )


def bundle_response(session: Any, user: Any, *, via: str) -> StreamingHttpResponse | None:
    """The session's stored bundle as a streamed zip, audited; None: nothing stored."""
    files = stored_files(session.pk)
    if not files:
        return None
    audit_download(session, user, files, via=via)
    response = StreamingHttpResponse(zip_stream(session.pk, files), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="bundle-{session.pk}.zip"'
    return response
