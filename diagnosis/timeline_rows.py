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
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
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


def keys_of(events: Iterable[Event], definition: Any) -> list[str]:
    """The rows' keys, in the language active now."""
    context = f"{release()}|{get_language()}|{settings.TIME_ZONE}|{_definition_digest(definition)}"
    return [row_key(event, context) for event in events]


def _read(keys: list[str]) -> dict[str, str]:
    try:
        found: dict[str, str] = shared_cache(CACHE).get_many(keys)
    except Exception:  # Redis unreachable: the rows are rendered here, as before
        logger.warning("timeline rows: cache unreachable, rendering", exc_info=True)
        return {}
    return found


def _store(rendered: dict[str, str]) -> None:
    try:
        shared_cache(CACHE).set_many(rendered, timeout=ROW_TTL)
    except Exception:
        logger.warning("timeline rows: could not store", exc_info=True)


class Batch:
    """The rows of many renders in one thread (the live push's render_batch, a dozen
    sessions a batch): read with one cache call for all of them (`read`, before they
    render) and stored with one after (`batch`), where each session's rows cost a read
    and a store of their own, two Redis round trips a session."""

    def __init__(self) -> None:
        self.found: dict[str, str] = {}  # read, or rendered in this batch
        self.rendered: dict[str, str] = {}  # rendered in this batch, stored at its end
        self.asked: set[str] = set()  # read already (found or not)

    def read(self, keys: Iterable[str]) -> None:
        wanted = [key for key in dict.fromkeys(keys) if key not in self.asked]
        if wanted:
            self.asked.update(wanted)
            self.found.update(_read(wanted))


_local = threading.local()


@contextmanager
def batch() -> Iterator[Batch]:
    """Within it, `rows` in this thread reads what `Batch.read` read (any other key
    with one call of its own) and stores nothing until the end, then all in one call.
    Nested: the outer batch."""
    outer: Batch | None = getattr(_local, "batch", None)
    if outer is not None:
        yield outer
        return
    current = _local.batch = Batch()
    try:
        yield current
    finally:
        _local.batch = None
        if current.rendered:
            _store(current.rendered)


def rows(events: Sequence[Event], definition: Any) -> list[SafeString]:
    """Each event's timeline row (diagnosis/_event.html), in order: those rendered before
    read from the cache in one call, the others rendered now and stored (in a `batch`:
    read and stored with the batch's)."""
    if not events:
        return []
    keys = keys_of(events, definition)
    current: Batch | None = getattr(_local, "batch", None)
    if current is not None:
        current.read(keys)  # nothing to read when the batch read them all
        found = current.found
        rendered = current.rendered
    else:
        found = _read(keys)
        rendered = {}
    out: list[SafeString] = []
    for event, key in zip(events, keys, strict=True):
        html = found.get(key) or rendered.get(key)
        if html is None:
            html = rendered[key] = str(
                render_to_string(ROW_TEMPLATE, {"event": event, "definition": definition})
            )
            if current is not None:
                found[key] = html  # another pull of the batch showing it reuses it
        out.append(mark_safe(html))  # rendered by the template engine (escaped there)
    if rendered and current is None:
        _store(rendered)
    return out
