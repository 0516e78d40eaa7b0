"""The approval queue's incident cards, rendered once per change and shared.

A card (an incident with its page of open actions, their forms and its impact map) is
most of the queue page's cost, and it is the same for every approver who reads the
queue in one language with the same filters. It is rendered once and kept in the
`queue_cards` cache (Redis in production, shared by every process) under a key made of
everything it shows: the session's last event seq and the facts it shows, each action's
state, the airport board (topology stamp and restrictions in force), the viewer's
filters, whether they decide, the language and the release's code and words. Any change
makes a new key, so a stale card is never shown; old keys expire.

What differs per request stays out of the cached text as a mark filled in on the way
out: the viewer's CSRF token and each deadline's "times out in ..." (the text must be
right without JS, and it changes every minute). Marks hold a NUL, which no database text
can (PostgreSQL refuses it), so user text never forms one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from datetime import datetime
from functools import cache
from typing import Any

from django.conf import settings
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.template.loader import render_to_string
from django.utils import timezone, translation
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext

from aero.compiled import AnyOf, Arg, Compiled
from aero.release import release
from aero.shared_caches import shared_cache
from approvals.models import OPEN_STATUSES, Approval

CACHE = "queue_cards"
# Keys are content-addressed (never stale); the timeout only bounds what old keys cost.
CARD_TTL = 15 * 60
CSRF_MARK = "\x00csrf\x00"
CSRF_INPUT = f'<input type="hidden" name="csrfmiddlewaretoken" value="{CSRF_MARK}">'
_MARK = re.compile("\x00(csrf|dl:[^\x00]+)\x00")
_BETWEEN_TAGS = re.compile(r">\s*\n\s*<")


def board_stamp(topology: tuple[Any, Any] | None, restrictions: list[Any]) -> tuple[Any, ...]:
    """What the cards read of the board: the active world's stamp and every
    restriction in force (consequences and maps follow them)."""
    return (
        topology,
        tuple(
            (r.pk, r.kind, r.target, str(r.session_id), r.tool_call_id, r.created_at)
            for r in restrictions
        ),
    )


# What a card shows of each of its actions and of their session, read for every request
# (the key) by a statement compiled once per connection: one row per action. The facts
# it shows from the session's snapshot (risk, impact, enrichment) are not read: the
# snapshot changes only with an event, which moves last_seq (they were most of the
# row's bytes and of the JSON every request decoded, 250 values a page).
APPROVAL_FACTS = (
    "id",
    "status",
    "risk_class",
    "action_name",
    "digest",
    "created_at",
    "deadline",
    "tool_call__tool_name",
    "tool_call__request_payload",
    "first_approved_by__username",
    "edited_by__username",
    "edited_at",
    "args_before_edit",
    "edit_reason",
)
SESSION_FACTS = (
    "session_id",
    "session__last_seq",
    "session__updated_at",
    "session__title",
    "session__scenario_id",
    "session__scenario__name_en",
    "session__scenario__name_zh",
    "session__created_by__username",
)
# Where a row's session facts start.
SESSION_AT = len(APPROVAL_FACTS)


def _window(approvals: Any, per_incident: Any) -> Any:
    """Each session's first `per_incident` of `approvals`, riskiest first, then the
    nearest deadline, in card order."""
    return (
        approvals.annotate(
            place=Window(
                RowNumber(),
                partition_by=[F("session_id")],
                order_by=[
                    F("risk_class").desc(),
                    F("deadline").asc(nulls_last=True),
                    F("id").asc(),
                ],
            )
        )
        .filter(place__lte=per_incident)
        .order_by("session_id", "place")
    )


def _page_rows(risk: bool) -> Compiled[Approval]:
    """The open approvals of the sessions given (Arg 0), each session's first Arg 1; of
    risk class Arg 2 when `risk`."""

    def build() -> Any:
        approvals = Approval.objects.filter(AnyOf("session_id", 0), status__in=OPEN_STATUSES)
        if risk:
            approvals = approvals.filter(risk_class=Arg(2, Approval._meta.get_field("risk_class")))
        # The window's filter selects its value: an integer, typed as one.
        return _window(approvals, Arg(1, Approval._meta.pk)).values_list(
            *APPROVAL_FACTS, *SESSION_FACTS
        )

    return Compiled(Approval, build)


_PAGE_ROWS = {False: _page_rows(False), True: _page_rows(True)}


def page_rows(session_ids: list[Any], per_incident: int, risk: str) -> list[tuple[Any, ...]]:
    """APPROVAL_FACTS + SESSION_FACTS of each session's first `per_incident` open
    approvals (of class `risk`, if given), in card order, session by session."""
    return list(_PAGE_ROWS[bool(risk)].rows(session_ids, per_incident, risk))


def page_approvals(session_ids: list[Any], per_incident: int, risk: str) -> list[Approval]:
    """The same approvals read whole, with their sessions, calls and users: what a card
    is rendered from."""
    approvals = Approval.objects.open().filter(session_id__in=session_ids)
    if risk:
        approvals = approvals.filter(risk_class=risk)
    return list(
        _window(approvals, per_incident).select_related(
            "session__scenario",
            "session__created_by",
            "tool_call",
            "first_approved_by",
            "edited_by",
        )
    )


def facts_of(a: Approval) -> tuple[Any, ...]:
    """APPROVAL_FACTS + SESSION_FACTS of an approval read whole."""
    session = a.session
    return (
        a.pk,
        a.status,
        a.risk_class,
        a.action_name,
        a.digest,
        a.created_at,
        a.deadline,
        a.tool_call.tool_name,
        a.tool_call.request_payload,
        a.first_approved_by.get_username() if a.first_approved_by else None,
        a.edited_by.get_username() if a.edited_by else None,
        a.edited_at,
        a.args_before_edit,
        a.edit_reason,
        session.pk,
        session.last_seq,
        session.updated_at,
        session.title,
        session.scenario_id,
        session.scenario.name_en,
        session.scenario.name_zh,
        session.created_by.get_username(),
    )


def card_key(open_count: int, rows: list[tuple[Any, ...]], shared: tuple[Any, ...]) -> str:
    """The key of an incident's card: everything it shows (`rows`: APPROVAL_FACTS +
    SESSION_FACTS of its actions; `shared`: the page's filters, role, language and
    board)."""
    body = repr((release(), shared, open_count, rows)).encode()
    return "queue-card:" + hashlib.blake2b(body, digest_size=20).hexdigest()


def shared_facts(
    *, risk: str, scenario: str, incident: str, can_decide: bool, board: tuple[Any, ...]
) -> tuple[Any, ...]:
    return (
        risk,
        scenario,
        incident,
        can_decide,
        settings.AERO_TWO_PERSON_RULE,
        translation.get_language(),
        timezone.get_current_timezone_name(),
        board,
    )


def cached_cards(keys: Iterable[str]) -> dict[str, str]:
    return shared_cache(CACHE).get_many(list(keys))


def keep_cards(cards: dict[str, str]) -> None:
    if cards:
        shared_cache(CACHE).set_many(cards, timeout=CARD_TTL)


def render_card(group: dict[str, Any], context: dict[str, Any]) -> str:
    """An incident's card with marks where the CSRF token and the deadlines go."""
    for item in group["items"]:
        deadline = item["a"].deadline
        item["deadline_mark"] = f"\x00dl:{deadline.isoformat()}\x00" if deadline else ""
    card = render_to_string(
        "approvals/_incident.html", {**context, "group": group, "csrf_token": CSRF_MARK}
    )
    # The templates' indentation between tags (a card holds no <pre> or <textarea>):
    # fifty actions a page, it was a tenth of the page's bytes.
    return _BETWEEN_TAGS.sub(">\n<", card)


def finish(card: str, csrf_token: str) -> SafeString:
    """The card as this request shows it: its deadlines as of now, the viewer's CSRF
    token (none in a pushed fragment: the page's htmx header carries it)."""
    if not csrf_token:
        card = card.replace(CSRF_INPUT, "")
    now = timezone.now()

    def fill(mark: re.Match[str]) -> str:
        what = mark.group(1)
        if what == "csrf":
            return csrf_token
        # Only open approvals are in the queue: each has time left, or none.
        deadline = datetime.fromisoformat(what[3:])
        return deadline_span(deadline, max(0, int((deadline - now).total_seconds())))

    # The card was rendered (escaped) by the template engine; the marks' fillings are
    # escaped by deadline_span or are a token of letters and digits.
    return mark_safe(_MARK.sub(fill, card))


def deadline_html(approval: Approval) -> SafeString:
    """Time left on an open approval (nothing once it is decided)."""
    return deadline_span(approval.deadline, approval.seconds_left())


def deadline_span(deadline: datetime | None, left: int | None) -> SafeString:
    """Time left (`left` seconds, None: no longer open): whole minutes until the last
    two, then seconds; red in the last minute. aero.js counts it down each second from
    the data attributes; the text stands without JS."""
    if left is None:
        text = ""
    elif left > 120:
        # Rounded up: "4 min" at 4:59 left would read as earlier than it is.
        text = gettext("times out in %(n)s min") % {"n": -(-left // 60)}
    elif left > 0:
        text = gettext("times out in %(n)s s") % {"n": left}
    else:
        text = gettext("deadline passed: becoming a manual to-do")
    urgent = " deadline-urgent" if left is not None and left <= 60 else ""
    # Fifty of these a page: the attributes' words are escaped once per language; the
    # rest is escaped here.
    return mark_safe(
        f'<span class="deadline{urgent}" data-deadline="{_iso(deadline)}" '
        f"{_data_texts(translation.get_language())}>{escape(text)}</span>"
    )


@cache
def _data_texts(language: str | None) -> str:
    """The countdown's words for aero.js, in `language` (the active one)."""
    return str(
        format_html(
            'data-text-min="{}" data-text-sec="{}" data-text-over="{}"',
            gettext("times out in {n} min"),
            gettext("times out in {n} s"),
            gettext("deadline passed: becoming a manual to-do"),
        )
    )


def _iso(moment: datetime | None) -> str:
    """As the template filter `date:"c"` writes it, in the current time zone."""
    return timezone.localtime(moment).isoformat() if moment else ""
