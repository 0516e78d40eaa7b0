"""Keep secrets out of records: provider error texts may echo the API key back (a
rejected key is often quoted in the error body), and those texts go to LLM call rows,
events, the audit log and logs."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

REDACTED = "[redacted]"
# Key-shaped text whatever the provider: bearer tokens, OpenAI-style keys, key=value.
_PATTERNS = [
    re.compile(r"(?i)(bearer\s+)[^\s\"',;]+"),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"),
    re.compile(r"(?i)((?:api[_-]?key|authorization|x-api-key)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]+"),
]
# Errors are reasons, not documents: a provider's whole error page is not kept.
MAX_ERROR_CHARS = 500


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every known secret and every key-shaped token replaced."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(
            lambda m: (m.group(1) if m.groups() else "") + REDACTED,
            text,
        )
    return text


def redact_error(text: str, secrets: Iterable[str] = ()) -> str:
    """An error text fit for a record: redacted and at most MAX_ERROR_CHARS long (the
    end marked, so nobody takes it for the whole text)."""
    text = redact(text, secrets)
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + f"… ({len(text) - MAX_ERROR_CHARS} more characters)"
    return text


class RedactingFilter(logging.Filter):
    """On every AERO log handler: key-shaped text in a message never reaches the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
