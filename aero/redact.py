"""Keep secrets out of records: provider error texts may echo the API key back (a
rejected key is often quoted in the error body, sometimes encoded), and those texts go
to LLM call rows, events every viewer of a session reads, the audit log and logs."""

from __future__ import annotations

import base64
import binascii
import logging
import re
import urllib.parse
from collections.abc import Iterable

REDACTED = "[redacted]"
# Key-shaped text whatever the provider: bearer tokens, OpenAI-style keys (and reversed),
# key=value.
_PATTERNS = [
    re.compile(r"(?i)(bearer\s+)[^\s\"',;]+"),
    re.compile(r"(?i)(basic\s+)(?=[A-Za-z0-9+/=_-]*[0-9+/=])[A-Za-z0-9+/=_-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"),
    re.compile(r"[A-Za-z0-9_\-]{6,}-ks\b"),
    re.compile(r"(?i)((?:api[_-]?key|authorization|x-api-key)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]+"),
]
# Runs of base64 / base64url / hex characters long enough to hide a key in an encoding.
_BLOB = re.compile(r"[A-Za-z0-9+/_\-]{12,}={0,2}")
# An opaque token (letters and digits mixed, this long) in a provider's error is a
# credential or an id nobody needs on a page: redacted in error texts (not in logs, whose
# lines name sessions by their ids).
_OPAQUE = re.compile(r"[A-Za-z0-9+/_\-]{32,}={0,2}")
# Errors are reasons, not documents: a provider's whole error page is not kept.
MAX_ERROR_CHARS = 500


def encodings(secret: str) -> set[str]:
    """`secret` as an error body may quote it: as is or reversed; in base64, URL-safe
    base64 (padded or not) or hex; percent-encoded."""
    found = {secret, secret[::-1], urllib.parse.quote(secret, safe="")}
    for raw in (secret.encode(), secret[::-1].encode()):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(raw).decode()
            found |= {text, text.rstrip("=")}
        found |= {raw.hex(), raw.hex().upper()}
    return {form for form in found if len(form) >= 4}


def _decodings(blob: str) -> Iterable[bytes]:
    """What a base64 run may say, at each of its alignments (a key inside a longer
    encoded text, "user:KEY", starts anywhere)."""
    body = blob.rstrip("=")
    for skip in range(4):
        part = body[skip:]
        part = part[: len(part) - len(part) % 4] if len(part) % 4 == 1 else part
        padded = part + "=" * (-len(part) % 4)
        for decode in (base64.b64decode, base64.urlsafe_b64decode):
            try:
                yield decode(padded)
            except (binascii.Error, ValueError):
                continue


def _opaque(token: str) -> str:
    mixed = any(c.isdigit() for c in token) and any(c.isalpha() for c in token)
    return REDACTED if mixed else token


def _hides(blob: str, secrets: list[bytes]) -> bool:
    return any(secret in decoded for decoded in _decodings(blob) for secret in secrets)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every known secret, in any of its encodings, and every key-shaped
    token replaced."""
    known = [s for s in secrets if s and len(s) >= 4]
    if known:
        # First the encoded texts that hold a key (all of them, not the key's part).
        raw = [s.encode() for s in known] + [s[::-1].encode() for s in known]
        text = _BLOB.sub(lambda m: REDACTED if _hides(m.group(), raw) else m.group(), text)
    for secret in known:
        for form in sorted(encodings(secret), key=len, reverse=True):
            text = text.replace(form, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(
            lambda m: (m.group(1) if m.groups() else "") + REDACTED,
            text,
        )
    return text


def redact_error(text: str, secrets: Iterable[str] = (), limit: int = MAX_ERROR_CHARS) -> str:
    """An error text fit for a record: redacted, opaque tokens too, and at most `limit`
    characters long (the end marked, so nobody takes it for the whole text)."""
    total = len(text)
    # Bounded before the work: a key cut at this edge lies far past the kept part.
    text = _OPAQUE.sub(lambda m: _opaque(m.group()), redact(text[: limit * 4], secrets))
    if len(text) > limit or total > limit * 4:
        text = text[:limit] + f"… ({total} characters in all)"
    return text


class RedactingFilter(logging.Filter):
    """On every AERO log handler: key-shaped text in a message never reaches the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
