"""The audit log's keyed hash chain.

Each entry stores `prev_digest` (the digest of the entry before it; 64 zeros for the
first) and `digest` = HMAC-SHA256(key, canonical(entry with prev_digest)). Editing,
deleting or inserting an entry anywhere breaks the chain from there on, and without the
key nobody can forge a digest that verifies. The database refuses an entry whose digest
is not 64 hex characters or whose prev_digest does not continue the chain (migration
aero 0003); the HMAC itself is checked by `manage.py verify_audit`, which holds the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.conf import settings

GENESIS = "0" * 64
# pg_advisory_xact_lock key ("AERO"): appends are serialised, so the chain never forks.
CHAIN_LOCK = 0x4145524F


def audit_key() -> bytes:
    return _key_of(getattr(settings, "AERO_AUDIT_KEY", ""), settings.SECRET_KEY)


@lru_cache(maxsize=4)
def _key_of(configured: str, secret_key: str) -> bytes:
    # Read for every event a job writes (diagnosis.chain): derived once per setting,
    # not an HMAC per call; keyed by the settings' values, which tests override.
    if configured:
        return configured.encode()
    return hmac.new(secret_key.encode(), b"aero-audit-chain", hashlib.sha256).digest()


def canonical(entry: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "prev": entry["prev_digest"],
            "at": entry["created_at"].isoformat(),
            "actor": entry["actor_label"],
            "actor_id": entry["actor_id"],
            "action": entry["action"],
            "object": f"{entry['object_type']}:{entry['object_id']}",
            "session": str(entry["session_id"]) if entry["session_id"] else None,
            "detail": entry["detail"],
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


def digest_of(entry: dict[str, Any], key: bytes | None = None) -> str:
    return hmac.new(key or audit_key(), canonical(entry), hashlib.sha256).hexdigest()


FIELDS = (
    "id",
    "prev_digest",
    "digest",
    "created_at",
    "actor_label",
    "actor_id",
    "action",
    "object_type",
    "object_id",
    "session_id",
    "detail",
)


@dataclass
class AuditChainReport:
    ok: bool
    checked: int
    first_bad_id: int | None
    problem: str
    head: str


def verify(entries: Any) -> AuditChainReport:
    """Walk `entries` (dicts with FIELDS, in id order) and name the first broken link."""
    key = audit_key()
    previous = GENESIS
    checked = 0
    for entry in entries:
        checked += 1
        if entry["prev_digest"] != previous:
            return AuditChainReport(
                False,
                checked,
                entry["id"],
                "does not continue the chain (an entry before it was changed, removed or inserted)",
                previous,
            )
        if not hmac.compare_digest(entry["digest"], digest_of(entry, key)):
            return AuditChainReport(
                False, checked, entry["id"], "its digest does not match its content", previous
            )
        previous = entry["digest"]
    return AuditChainReport(True, checked, None, "", previous)
