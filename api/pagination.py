"""One pagination style for every list of the API: `limit` and an opaque `cursor`, and
`next_cursor` in the page (null on the last). A cursor names the position after the last
row shown in the list's stable order (a keyset), so rows added meanwhile never push a row
onto two pages; it is only good for the list that made it."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from api.errors import ApiError

MAX_CURSOR = 200


def encode(kind: str, position: dict[str, Any]) -> str:
    raw = json.dumps({"k": kind, **position}, separators=(",", ":"), default=str)
    return base64.urlsafe_b64encode(raw.encode()).rstrip(b"=").decode()


def decode(kind: str, cursor: str) -> dict[str, Any]:
    """The position in `cursor`, or a 404 (no such page: the request is well-formed, the
    page it names does not exist) saying to start again from the first page."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error):
        data = None
    if not isinstance(data, dict) or data.pop("k", None) != kind:
        raise ApiError(404, "invalid_cursor", "No such page: start again without a cursor.")
    return data


CURSOR_PATTERN = r"^[A-Za-z0-9_-]*$"
CURSOR_DOC = "`next_cursor` of the previous page (omit for the first page)."


def cursor_query() -> Any:
    """The `cursor` query parameter every list operation takes (a fresh one each: ninja
    keeps the parameter's own object)."""
    from ninja import Query

    return Query("", max_length=MAX_CURSOR, pattern=CURSOR_PATTERN, description=CURSOR_DOC)
