"""The approval queue's page, rendered once per queue change and shared.

The page is the same for every approver who asks for the same path (filters, cursor,
incident) with the same roles, staff flag, notification setting, language and time zone,
until something it shows changes. Its text is rendered once per such key and the
queue's change stamp (aero.stamps.QUEUE, moved after every commit that changes an
approval, a restriction or a to-do, a session's facts, a scenario, a user or the
world), kept in the `queue_cards` cache (shared by every process) and, parsed, in the
process's memory. A request then reads one stamp and fills in what is its own: the
CSRF token, the user's name and each deadline's "times out in ..." (filled once a
second per page, the text must stand without JS). Marks hold a NUL, which no database
text can, so user text never forms one (approvals.cards).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone, translation
from django.utils.html import escape

from aero import stamps
from aero.release import release
from aero.session_store import read_stamp
from aero.shared_caches import shared_cache
from approvals import cards

# The stamp moves with every change; the timeout only bounds what old pages cost.
PAGE_TTL = 10 * 60
# Pages parsed and kept in this process (each ~0.5 MB with its filled copy): the
# common few (first page, a language or two, per role set); the rest come from Redis.
LOCAL_PAGES = 16
USER_MARK = "\x00user\x00"
_MARKS = re.compile("(\x00(?:csrf|user|dl:[^\x00]+)\x00)")
_CSRF = cards.CSRF_MARK.encode()
_USER = USER_MARK.encode()
_REQUEST_MARKS = re.compile(b"(" + re.escape(_CSRF) + b"|" + re.escape(_USER) + b")")


@dataclass
class Page:
    """A page's text cut at its marks (odd places), and its deadlines filled in as of
    `second`, cut at the CSRF and user marks left for the request (odd places)."""

    parts: list[str]
    second: int = -1
    filled: list[bytes] = field(default_factory=list)


class MarkedUser:
    """What the page's templates read of the viewer, with the name a mark: the roles
    and the staff flag are in the page's key."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, user: Any) -> None:
        self.is_staff = bool(user.is_staff)
        self.pk = None

    def get_username(self) -> str:
        return USER_MARK


_local: OrderedDict[str, Page] = OrderedDict()
_lock = threading.Lock()


def page_key(request: HttpRequest, variant: str, roles: frozenset[str], notify_on: bool) -> str:
    """The key of the page `variant` (the whole page or an htmx part) at the request's
    path for its viewer, under the queue's current stamp (read first, with the
    sign-in's: a page is never older than the stamp it is kept under)."""
    body = repr(
        (
            release(),
            read_stamp(request, stamps.QUEUE),
            variant,
            request.get_full_path(),
            sorted(roles),
            bool(request.user.is_staff),
            notify_on,
            translation.get_language(),
            timezone.get_current_timezone_name(),
            settings.AERO_TWO_PERSON_RULE,
        )
    ).encode()
    return "queue-page:" + hashlib.blake2b(body, digest_size=20).hexdigest()


def find(key: str) -> Page | None:
    page = _local.get(key)
    if page is not None:
        return page
    text = shared_cache(cards.CACHE).get(key)
    return None if text is None else _remember(key, text)


def keep(key: str, text: str) -> Page:
    shared_cache(cards.CACHE).set(key, text, timeout=PAGE_TTL)
    return _remember(key, text)


def _remember(key: str, text: str) -> Page:
    page = Page(_MARKS.split(text))
    with _lock:
        _local[key] = page
        while len(_local) > LOCAL_PAGES:
            _local.popitem(last=False)
    return page


def body(page: Page, csrf_token: str, username: str) -> bytes:
    """The page as this request shows it: deadlines as of this second, the viewer's
    token and name."""
    now = timezone.now()
    second = int(now.timestamp())
    filled = page.filled
    if page.second != second:
        # Cut once a second: a join per request, not two searches of the whole page
        # (bytes.replace took ~0.2 ms of a ~1.5 ms page).
        filled = _REQUEST_MARKS.split(_fill_deadlines(page.parts, now))
        # Two threads may both fill a second: the same bytes, whichever stays.
        page.filled, page.second = filled, second
    # The token is letters and digits; the name is escaped here (the page's text was
    # escaped by the template engine).
    own = {_CSRF: csrf_token.encode(), _USER: escape(username).encode()}
    out = filled.copy()
    for i in range(1, len(out), 2):
        out[i] = own[out[i]]
    return b"".join(out)


def _fill_deadlines(parts: list[str], now: datetime) -> bytes:
    out = parts.copy()
    for i in range(1, len(out), 2):
        mark = out[i]
        if mark.startswith("\x00dl:"):
            # Only open approvals are listed: each has time left, or none.
            deadline = datetime.fromisoformat(mark[4:-1])
            out[i] = cards.deadline_span(deadline, max(0, int((deadline - now).total_seconds())))
    return "".join(out).encode()
