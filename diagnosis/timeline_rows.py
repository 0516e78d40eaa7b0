"""Timeline rows rendered once and shared: an event never changes, so the row that shows
it is a function of what it holds (as this viewer may see it: a masked copy is another
row), the scenario's definition, the language, the zone and the release. The session
page, the paged timeline and the live fragments read rows here, rendered once for every
viewer and process (the `timeline_rows` cache: Redis in production), so a page of 50
rows costs one cache read instead of 50 renders once anyone has shown them.

Keys name the row's whole input, so a row is never stale (a masked copy, an event of a
re-created test database, another deploy: another key); the timeout only bounds what
old rows cost."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import get_language

from aero.release import release
from aero.shared_caches import shared_cache
from diagnosis.models import Event

logger = logging.getLogger("diagnosis.timeline_rows")

CACHE = "timeline_rows"
ROW_TTL = 10 * 60
ROW_TEMPLATE = "diagnosis/_event.html"

# id(definition) -> (definition, its digest): definitions are parsed once per process
# (presenters.version_definition), so a batch hashes its definition once; the definition
# is kept with its digest so the id cannot be reused by another object meanwhile.
_definition_digests: dict[int, tuple[Any, str]] = {}


def _definition_digest(definition: Any) -> str:
    if definition is None:
        return ""
    found = _definition_digests.get(id(definition))
    if found is not None and found[0] is definition:
        return found[1]
    text = json.dumps(definition, sort_keys=True, default=str).encode()
    digest = hashlib.blake2b(text, digest_size=12).hexdigest()
    if len(_definition_digests) > 256:
        _definition_digests.clear()
    _definition_digests[id(definition)] = (definition, digest)
    return digest


def row_key(event: Event, context: str) -> str:
    body = json.dumps(
        [context, str(event.session_id), event.seq, event.type, event.ts.isoformat(),
         event.payload],
        sort_keys=True,
        default=str,
    )  # fmt: skip
    return "timeline-row:" + hashlib.blake2b(body.encode(), digest_size=20).hexdigest()


def rows(events: Sequence[Event], definition: Any) -> list[SafeString]:
    """Each event's timeline row (diagnosis/_event.html), in order: those rendered before
    read from the cache in one call, the others rendered now and stored."""
    if not events:
        return []
    context = f"{release()}|{get_language()}|{settings.TIME_ZONE}|{_definition_digest(definition)}"
    keys = [row_key(event, context) for event in events]
    cache = shared_cache(CACHE)
    try:
        found: dict[str, str] = cache.get_many(keys)
    except Exception:  # Redis unreachable: the rows are rendered here, as before
        logger.warning("timeline rows: cache unreachable, rendering", exc_info=True)
        found = {}
    rendered: dict[str, str] = {}
    out: list[SafeString] = []
    for event, key in zip(events, keys, strict=True):
        html = found.get(key) or rendered.get(key)
        if html is None:
            html = rendered[key] = str(
                render_to_string(ROW_TEMPLATE, {"event": event, "definition": definition})
            )
        out.append(mark_safe(html))  # rendered by the template engine (escaped there)
    if rendered:
        try:
            cache.set_many(rendered, timeout=ROW_TTL)
        except Exception:
            logger.warning("timeline rows: could not store", exc_info=True)
    return out
