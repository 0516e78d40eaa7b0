"""The session page's panels rendered once and shared (issue 37 item 3).

A panel (status, answer box, reasoning, agent tree, actions, facts, report) is the same
HTML for every viewer with the same roles, language and zone as long as what it reads
is the same, so it is rendered once and kept in the `session_panels` cache (Redis in
production, shared by every process) under a key naming all of that: the session row
(its last_seq, status, snapshot, tokens...), its action calls and approvals, the world
the panels word with (the topology's stamp and every restriction in force), the agent
tree's rows (agent tree only), the masking, the role flags, the language, the zone and
the release. These are read on every request (the reads the panels render from), so a
change that moves no seq (an approval timing out, a run's end written with the lease's
release, another session's closure) makes another key: a panel is never stale. The
page and the live push share the renders: a reload, or a second viewer, renders none.

What differs per request stays out of the cached text as a mark filled in on the way
out, as the queue's cards do (approvals/cards.py): the viewer's CSRF token, each open
approval's "times out in ..." and a running run's elapsed time (both change with the
clock alone). Marks hold a NUL, which no database text can, so user text never forms
one. Panels are kept as the push sends them (hx-swap-oob on the section); the page
drops that attribute.

Not kept: a pack's own facts panel (its context reads what this key does not name:
linked cases, saved knowledge), and an answer box holding a viewer's draft."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.template.loader import render_to_string
from django.utils import timezone, translation
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from aero.packs import pack_for
from aero.release import release
from aero.shared_caches import shared_cache
from diagnosis import presenters
from diagnosis.eventlog.masking import SessionMask
from diagnosis.models import Session
from diagnosis.templatetags.timeline import duration

logger = logging.getLogger("diagnosis.page_panels")

CACHE = "session_panels"
# Keys are content-addressed (never stale); the timeout only bounds what old keys cost.
PANEL_TTL = 10 * 60
PANELS = (
    "session-status",
    "session-composer",
    "session-thinking",
    "session-agents",
    "session-actions",
    "session-facts",
    "session-report",
)
TEMPLATE = "diagnosis/session_detail.html"
OOB = ' hx-swap-oob="true"'
CSRF_MARK = "\x00csrf\x00"
CSRF_INPUT = f'<input type="hidden" name="csrfmiddlewaretoken" value="{CSRF_MARK}">'
_MARK = re.compile("\x00(csrf|dl:[^\x00]+|el:[^\x00]+)\x00")

Context = dict[str, Any]


# The session row's columns no panel shows, which a running job rewrites without a new
# event (its lease's heartbeat): keyed on, they would only make every panel miss.
SESSION_UNSHOWN = frozenset(
    {"updated_at", "lease_token", "lease_expires_at", "lease_holder", "job_attempts", "chain_head"}
)


def _fields(obj: Any, leave: frozenset[str] = frozenset()) -> tuple[Any, ...]:
    return tuple(
        getattr(obj, f.attname) for f in obj._meta.concrete_fields if f.attname not in leave
    )


def _user(user: Any) -> str | None:
    return user.get_username() if user is not None else None


def state_key(
    session: Session,
    reads: presenters.SessionReads,
    roles: frozenset[str],
    mask: SessionMask | None,
) -> tuple[Any, ...]:
    """What every panel but the agent tree shows, apart from the clock."""
    world = reads.world
    version = session.scenario_version
    return (
        release(),
        translation.get_language(),
        timezone.get_current_timezone_name(),
        settings.AERO_TWO_PERSON_RULE,
        tuple(sorted(presenters.flags_for_roles(roles).items())),
        None if mask is None else (tuple(sorted(mask.secrets)), tuple(sorted(mask.pairs))),
        _fields(session, SESSION_UNSHOWN),
        (version.pk, version.checksum, version.number),
        (session.scenario.name_en, session.scenario.name_zh, _user(session.created_by)),
        tuple((_fields(c), _user(c.decided_by)) for c in reads.calls),
        tuple(
            (_fields(a), _user(a.first_approved_by), _user(a.approver), _user(a.edited_by))
            for a in reads.approvals
        ),
        world.key() if world is not None else None,
        _pack_templates(session.scenario.kind),
    )


def _pack_templates(kind: str) -> tuple[str | None, ...]:
    # The pack's templates a panel includes (its facts, its approval cards): a
    # deployment that points the pack at others shows them without a new release.
    pack = pack_for(kind)
    return (pack.facts_template, pack.card_template)


def panel_keys(
    panels: Iterable[str],
    state: tuple[Any, ...],
    reads: presenters.SessionReads,
) -> dict[str, str]:
    """Each panel's cache key: the state, and for the agent tree its runs' rows."""
    digest = hashlib.blake2b(repr(state).encode(), digest_size=20)
    keys: dict[str, str] = {}
    for panel in panels:
        own = digest.copy()
        own.update(panel.encode())
        if panel == presenters.AGENTS_PANEL:
            own.update(repr(reads.agent_tree.rows()).encode())
        keys[panel] = "session-panel:" + own.hexdigest()
    return keys


def _render(panel: str, context: Context) -> str:
    """A panel as the push sends it, with marks where the per-request parts go."""
    return str(
        render_to_string(
            f"{TEMPLATE}#{panel}",
            {**context, "oob": True, "csrf_token": CSRF_MARK, "elapsed_marks": True},
        )
    )


def _with_marks(context: Context) -> Context:
    """The context with a mark where each open approval's deadline goes."""
    rows = [
        {**row, "deadline_mark": f"\x00dl:{row['approval'].pk}\x00"}
        if row.get("approval") is not None and row["approval"].deadline
        else row
        for row in context.get("actions") or []
    ]
    return {**context, "actions": rows}


def shared(
    panels: Iterable[str],
    session: Session,
    reads: presenters.SessionReads,
    roles: frozenset[str],
    mask: SessionMask | None,
    context: Callable[[], Context],
    *,
    keep: Callable[[str], bool] = lambda panel: True,
) -> dict[str, str]:
    """Each panel with its marks (finish fills them in): read from the cache when
    rendered before for the same state, else rendered from `context()` (built once, only
    when a panel is missing) and kept. `keep(panel)`: whether that panel may be kept
    (rendered each time otherwise)."""
    wanted = list(panels)
    kept = [panel for panel in wanted if keep(panel)]
    keys = panel_keys(kept, state_key(session, reads, roles, mask), reads) if kept else {}
    cache = shared_cache(CACHE)
    found: dict[str, str] = {}
    if keys:
        try:
            found = cache.get_many(list(keys.values()))
        except Exception:  # Redis unreachable: the panels are rendered here, as before
            logger.warning("session panels: cache unreachable, rendering", exc_info=True)
    out: dict[str, str] = {}
    built: Context | None = None
    rendered: dict[str, str] = {}
    for panel in wanted:
        key = keys.get(panel)
        html = found.get(key) if key is not None else None
        if html is None:
            if built is None:
                built = _with_marks(context())
            html = _render(panel, built)
            if key is not None:
                rendered[key] = html
        out[panel] = html
    if rendered:
        try:
            cache.set_many(rendered, timeout=PANEL_TTL)
        except Exception:
            logger.warning("session panels: could not store", exc_info=True)
    return out


def finish(
    html: str,
    reads: presenters.SessionReads,
    *,
    csrf_token: str | None,
    oob: bool,
    now: datetime | None = None,
) -> SafeString:
    """A kept panel as this request shows it: the deadlines and elapsed times as of now,
    the viewer's CSRF token (None: a pushed fragment, whose forms take the page's from
    its htmx header), the hx-swap-oob attribute only in a pushed fragment."""
    if not oob:
        head = html.find(">")
        at = html.find(OOB, 0, head)
        if at >= 0:
            html = html[:at] + html[at + len(OOB) :]
    if csrf_token is None:
        html = html.replace(CSRF_INPUT, "")
    if "\x00" not in html:
        return mark_safe(html)  # rendered (escaped) by the template engine
    moment = now or timezone.now()
    approvals = {str(a.pk): a for a in reads.approvals}

    def fill(mark: re.Match[str]) -> str:
        what = mark.group(1)
        if what == "csrf":
            return csrf_token or ""
        if what.startswith("dl:"):
            approval = approvals.get(what[3:])
            if approval is None:
                return ""
            return str(render_to_string("approvals/_deadline.html", {"approval": approval}))
        started = datetime.fromisoformat(what[3:])
        return str(escape(duration(max(moment - started, timedelta(0)))))

    # The marks' fillings are escaped by the template engine or here, or are a token
    # of letters and digits.
    return mark_safe(_MARK.sub(fill, html))
