"""Live session timeline over WebSocket. Notices say "something new up to seq N"; the
consumer reads what it has not sent from the event log, so a dropped notice loses nothing.

Render once, send to many: what a fragment shows depends on the session, the seq range
and the viewer's roles (the forms they get), never on who the viewer is. The process-wide
`hub` renders a given (session, after, roles, composer) once and hands the same fragment
to every viewer asking for it; viewers with other roles get their own render, so masking
never mixes. The hub also batches the viewers' access checks: every pull re-reads the
viewer's roles from the database (a role removed stops the stream at the next push), in
one query for all the viewers a notice woke.

One notice per process, not per viewer: the hub holds one subscription to each
session watched in this process (a channel of its own in the session's group) and fans a
notice out itself: the idle viewers behind it get their roles read in one query and one
render per role set (one database call, batched with other sessions' fan-outs), then the
same frames written to each, one after another. A viewer whose socket breaks meanwhile
is skipped; one already pulling pulls again on its own, under its lock.

A notice can be lost (Redis down or restarting, a channel over its capacity): the hub
also re-reads the last seq of every session watched in this process every
AERO_LIVE_RESYNC_SECONDS, in one query, and wakes the viewers behind it, so the newest
event reaches an idle page with no further notice.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Protocol
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import translation
from django.utils.html import format_html
from django.utils.translation import gettext

from aero import metrics
from aero.db_async import db_call
from aero.i18n import supported
from aero.roles import ALL_ROLES, VIEW_SESSIONS
from aero.sessions import Viewer, signed_in
from aero.templatetags.aero_text import when
from diagnosis import presenters
from diagnosis.eventlog.masking import SessionMask, mask_of, masks_roles
from diagnosis.models import Event, Session
from diagnosis.push import (
    AIRPORT_GROUP,
    register_server_loop,
    session_digest,
    session_group,
    user_group,
)

BATCH = presenters.TIMELINE_PAGE
# Largest WebSocket message the consumers send: half of daphne's 1 MB limit (over it,
# daphne closes the socket with 1011), leaving room for any framing overhead.
FRAME_BYTES = 512 * 1024
CLOSE_SIGNED_OUT = 4401  # the sign-in the socket was opened with ended
CLOSE_FORBIDDEN = 4403  # no (longer a) role that may watch this, or no longer signed in
CLOSE_GONE = 4404  # the session does not exist or was deleted
RENDER_CACHE_SIZE = 256

logger = logging.getLogger("diagnosis.consumers")


class Watcher(Protocol):
    """A live viewer of one session's events (the page's timeline, the API stream)."""

    sent_seq: int

    async def catch_up(self) -> None: ...


def last_seqs(session_ids: Iterable[str]) -> dict[str, int]:
    """Each session's last seq, one query (deleted ones too: their viewers are closed
    by the pull that follows)."""
    rows = Session.objects.filter(pk__in=list(session_ids)).values_list("pk", "last_seq")
    return {str(pk): last_seq for pk, last_seq in rows}


def current_roles(user_ids: Iterable[Any]) -> dict[Any, frozenset[str]]:
    """Each user's roles as the database says now (never a copy cached on a user object:
    a connection lives for hours). Inactive and unknown users have none. One query."""
    ids = list(user_ids)
    found: dict[Any, set[str]] = {pk: set() for pk in ids}
    rows = (
        get_user_model()
        .objects.filter(pk__in=ids, is_active=True)
        .values_list("pk", "is_superuser", "groups__name")
    )
    for pk, superuser, group in rows:
        if superuser:
            found[pk].update(ALL_ROLES)
        elif group in ALL_ROLES:
            found[pk].add(group)
    return {pk: frozenset(roles) for pk, roles in found.items()}


def viewer_roles(viewers: Iterable[Viewer]) -> dict[Viewer, frozenset[str]]:
    """Each viewer's roles now, none when the sign-in it came with has ended (signed
    out, expired, the password changed): current_roles and aero.sessions.signed_in."""
    wanted = list(viewers)
    found = current_roles({user_id for user_id, _ in wanted if user_id is not None})
    live = signed_in(wanted)
    return {v: found.get(v[0], frozenset()) if v in live else frozenset() for v in wanted}


def user_id_of(scope: dict[str, Any]) -> Any:
    user = scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return user.pk


def session_key_of(scope: dict[str, Any]) -> str | None:
    """The key of the sign-in session the socket was opened with (its cookie's)."""
    return getattr(scope.get("session"), "session_key", None) or None


@dataclass(frozen=True)
class Update:
    """A rendered pull: the WebSocket messages to send (none when nothing is new), the
    last seq they hold, the composer key the page shows after them, and the session's
    last_seq when rendered."""

    frames: tuple[str, ...]
    seq: int
    composer_key: str | None
    as_of: int

    @property
    def html(self) -> str:
        return "".join(self.frames)


def size_of(html: str) -> int:
    """Bytes on the wire: a text message is sent as UTF-8."""
    return len(html.encode())


def too_large_row(event: Event) -> str:
    """What stands in the timeline for an event whose row would not fit in one message:
    where to read it, over HTTP, where no frame limit applies."""
    url = reverse("diagnosis:session-events", args=[event.session_id])
    return format_html(
        '<div hx-swap-oob="beforeend:#timeline-list"><li id="event-{seq}" data-seq="{seq}" '
        'class="ev too-large"><time datetime="{ts}">{time}</time> '
        '<span class="warn">{warning}</span> <a href="{url}?after={before}#event-{seq}">{link}</a>'
        "</li></div>",
        seq=event.seq,
        ts=event.ts.isoformat(),
        time=when(event.ts),
        warning=gettext("This entry (%(type)s) is too large to show live:") % {"type": event.type},
        link=gettext("open it in the full timeline"),
        url=url,
        before=event.seq - 1,
    )


def too_large_panel(panel: str, session_id: Any) -> str:
    """What replaces a panel that would not fit in one message: a pointer to the page."""
    return format_html(
        '<section id="{panel}" class="card" hx-swap-oob="true"><p class="warn">{warning} '
        '<a href="{url}">{link}</a>.</p></section>',
        panel=panel,
        warning=gettext("This part changed and is too large to update live:"),
        link=gettext("reload the page"),
        url=reverse("diagnosis:session-detail", args=[session_id]),
    )


def timeline_rows(events: list[Event], definition: Any) -> tuple[str, list[Event]]:
    """The events' timeline rows, as few messages' worth as fit: all of them in one
    render when they fit in a frame (the usual case, one template call), else one by
    one, up to the first that would overflow the frame; and the events they hold. Always
    at least one: an event
    whose row alone is too large is replaced by a pointer (too_large_row)."""
    html = render_to_string(
        "diagnosis/_timeline_append.html", {"events": events, "definition": definition}
    )
    if size_of(html) <= FRAME_BYTES:
        return html, events
    rows: list[str] = []
    used = 0
    for event in events:
        row: str = render_to_string(
            "diagnosis/_timeline_append.html", {"events": [event], "definition": definition}
        )
        if size_of(row) > FRAME_BYTES:
            row = too_large_row(event)
        if rows and used + size_of(row) > FRAME_BYTES:
            break
        rows.append(row)
        used += size_of(row)
    return "".join(rows), events[: len(rows)]


def pack(parts: list[str]) -> tuple[str, ...]:
    """Consecutive parts joined into messages of at most FRAME_BYTES each."""
    frames: list[str] = []
    current: list[str] = []
    used = 0
    for part in parts:
        size = size_of(part)
        if current and used + size > FRAME_BYTES:
            frames.append("".join(current))
            current, used = [], 0
        current.append(part)
        used += size
    if current:
        frames.append("".join(current))
    return tuple(frames)


@dataclass(frozen=True)
class Pull:
    """One render a viewer asks for: the events of `session_id` after `after`, for
    viewers holding `roles`, whose page shows `composer_key`, in `language`."""

    roles: frozenset[str]
    session_id: str
    after: int
    composer_key: str | None = None
    language: str | None = None


def render_updates(
    roles: frozenset[str],
    session_id: Any,
    after: int,
    composer_key: str | None = None,
    language: str | None = None,
) -> Update | None:
    """In `language` (the page's, see SessionConsumer.connect); the default otherwise."""
    return render_batch([Pull(roles, str(session_id), after, composer_key, language)])[0]


def render_batch(pulls: list[Pull]) -> list[Update | None]:
    """The updates for `pulls`, in order, with one query for their sessions and one for
    their events whatever their number (notices that arrive while a batch renders wait
    for the next one, so a burst over many sessions costs a few round trips, not two
    per session). The panels' rows are read once per session (PanelContexts); each pull
    renders in its page's language."""
    ids = {pull.session_id for pull in pulls}
    sessions = {
        str(session.pk): session
        for session in Session.objects.visible()
        .select_related("scenario", "scenario_version", "created_by")
        .defer("scenario_version__definition")  # parsed once per process (presenters)
        .filter(pk__in=ids)
    }
    # Seqs are gap-free, so (after, after + BATCH] holds at most one batch: every pull's
    # range goes into the one query, bounded by its session's last_seq as read above.
    ranges: dict[tuple[str, int], int] = {}
    for pull in pulls:
        session = sessions.get(pull.session_id)
        if session is not None and session.last_seq > pull.after:
            ranges[(pull.session_id, pull.after)] = min(session.last_seq, pull.after + BATCH)
    found: dict[str, list[Event]] = {}
    if ranges:
        wanted = Q()
        for (session_id, after), upto in ranges.items():
            wanted |= Q(session_id=session_id, seq__gt=after, seq__lte=upto)
        for event in Event.objects.filter(wanted).order_by("session_id", "seq"):
            found.setdefault(str(event.session_id), []).append(event)
    contexts = PanelContexts()
    updates: list[Update | None] = []
    for pull in pulls:
        session = sessions.get(pull.session_id)
        if session is None:
            updates.append(None)
            continue
        upto = ranges.get((pull.session_id, pull.after), pull.after)
        events = [e for e in found.get(pull.session_id, []) if pull.after < e.seq <= upto]
        if not events and upto > pull.after:
            # Not reached while seqs stay gap-free; if one were missing, read by count.
            events = list(
                Event.objects.filter(
                    session_id=pull.session_id, seq__gt=pull.after, seq__lte=session.last_seq
                ).order_by("seq")[:BATCH]
            )
        with translation.override(pull.language or settings.LANGUAGE_CODE):
            updates.append(_render_updates(pull, session, events, contexts))
    return updates


@dataclass(frozen=True)
class Ask:
    """A viewer a notice woke: who (their roles are read now) and what their page shows."""

    user_id: Any
    session_id: str
    after: int
    composer_key: str | None
    language: str | None
    # The roles the viewer's last check found: the render reads the events under them,
    # then the check reads the roles now (check_and_render).
    roles: frozenset[str] = frozenset()
    # The viewer's sign-in session: checked with the roles (none, or ended: no roles).
    session_key: str | None = None


# A viewer whose roles change at every check is given up on after this many renders (its
# socket closes 4403; the page reconnects and is checked afresh).
CHECK_ROUNDS = 3


def check_and_render(asks: list[Ask]) -> list[tuple[frozenset[str] | None, Update | None]]:
    """For each viewer: their roles as the database says now (None when they may no
    longer watch) and the update their page needs (None when the session is gone). One
    render_batch, in which viewers with the same roles and page share one render (so
    masking stays per role set), then one query for the roles of all of them.

    The events are read first (under the roles each viewer's last check found), the roles
    after (as the API stream does): an event committed after a
    role was taken away can only have been read before a check that sees it gone, so it
    is never sent. A viewer whose roles changed otherwise gets a render under the new
    ones (its masks and forms follow them), checked again; after CHECK_ROUNDS, closed."""
    pulls = [Pull(a.roles, a.session_id, a.after, a.composer_key, a.language) for a in asks]
    answers: list[tuple[frozenset[str] | None, Update | None]] = [(None, None)] * len(asks)
    unsettled = list(range(len(asks)))
    for _ in range(CHECK_ROUNDS):
        distinct = list(dict.fromkeys(pulls[i] for i in unsettled))
        updates = dict(zip(distinct, render_batch(distinct), strict=True))
        found = viewer_roles({(asks[i].user_id, asks[i].session_key) for i in unsettled})
        changed: list[int] = []
        for i in unsettled:
            roles = found.get((asks[i].user_id, asks[i].session_key), frozenset())
            if not roles & set(VIEW_SESSIONS):
                answers[i] = (None, None)
            elif roles != pulls[i].roles:
                pulls[i] = replace(pulls[i], roles=roles)
                changed.append(i)
            else:
                answers[i] = (roles, updates[pulls[i]])
        unsettled = changed
        if not unsettled:
            break
    return answers


class PanelContexts:
    """The panels' context for the pulls of one batch: the airport read once, each
    session's rows read once, worded once per language (labels and consequences are
    worded when the context is built); only the role flags differ per pull."""

    def __init__(self) -> None:
        self.airport: tuple[Any, Any] | None = None
        self.reads: dict[str, presenters.SessionReads] = {}
        # Worded per language and per masking (a read-only viewer's panels hide values).
        self.worded: dict[tuple[str, str | None, bool], dict[str, Any]] = {}
        self.masks: dict[str, SessionMask] = {}

    def mask(self, pull: Pull, session: Session) -> SessionMask | None:
        """The masking for the pull's viewers (None: they see everything), its hidden
        values read once per session."""
        if not masks_roles(pull.roles):
            return None
        if pull.session_id not in self.masks:
            self.masks[pull.session_id] = mask_of(session.pk)
        return self.masks[pull.session_id]

    def context(self, pull: Pull, session: Session) -> dict[str, Any]:
        key = (pull.session_id, pull.language, masks_roles(pull.roles))
        worded = self.worded.get(key)
        if worded is None:
            reads = self.reads.get(pull.session_id)
            if reads is None:
                self.airport = self.airport or presenters.read_airport()
                reads = self.reads[pull.session_id] = presenters.read_session(session, self.airport)
            worded = self.worded[key] = presenters.session_context(
                session, None, roles=pull.roles, reads=reads, mask=self.mask(pull, session)
            )
        return {**worded, **presenters.flags_for_roles(pull.roles)}


def _render_updates(
    pull: Pull, session: Session, events: list[Event], contexts: PanelContexts
) -> Update:
    """HTML with hx-swap-oob fragments for `events` (at most one batch, the events after
    `pull.after` up to the session's last_seq as read with `session`) and the panels they
    change, for viewers holding `pull.roles`, as WebSocket messages of at most
    FRAME_BYTES each. `contexts` holds the panels' context, shared by the pulls of one
    batch.

    Only events up to the session row's last_seq are sent: panels and timeline then
    describe the same moment, even while a job keeps appending.
    The composer (the answer box) is sent exactly when its key changes, whatever the
    events were: replacing it on every status event would wipe what the operator is
    typing, and tying it to event types missed a question committed between two reads.

    A batch is bounded by count (BATCH) and by bytes: the rows that fit in one frame;
    the rest follow in the next pull. Daphne closes the socket with 1011 on a message
    over 1 MB, which broke every catch-up of a session holding a large event."""
    if not events:
        return Update((), pull.after, pull.composer_key, session.last_seq)
    mask = contexts.mask(pull, session)
    shown = mask.events(events) if mask is not None else events
    rows, sent = timeline_rows(shown, presenters.version_definition(session))
    panels: set[str] = set()
    for event in sent:
        panels |= presenters.panels_of(event)
    new_key = presenters.composer_key(session)
    if new_key != pull.composer_key:
        panels.add("session-composer")
    context = contexts.context(pull, session) if panels else {}
    parts = [rows]
    for panel in sorted(panels):
        html = render_to_string(f"diagnosis/session_detail.html#{panel}", {**context, "oob": True})
        parts.append(html if size_of(html) <= FRAME_BYTES else too_large_panel(panel, session.pk))
    return Update(pack(parts), sent[-1].seq, new_key, session.last_seq)


# A hub's channel in one session's group, and the task that reads its notices.
Subscription = tuple[str, asyncio.Task[None]]


class Hub:
    """Per process (and event loop): one subscription to each watched session's notices,
    fanned out to its viewers here; shared renders and batched role checks."""

    def __init__(self) -> None:
        self.renders: OrderedDict[Hashable, asyncio.Future[Any]] = OrderedDict()
        self.latest: dict[str, int] = {}  # session -> highest seq a notice announced
        self.pending_roles: dict[Viewer, list[asyncio.Future[frozenset[str]]]] = {}
        self.roles_task: asyncio.Task[None] | None = None
        # session -> its viewers here, in the order they joined (a dict as an ordered set):
        # a fan-out writes to them in that order.
        self.watchers: dict[str, dict[Watcher, None]] = {}
        self.resync_task: asyncio.Task[None] | None = None
        self.catching_up: set[asyncio.Future[None]] = set()
        self.pending_pulls: dict[Pull, asyncio.Future[Update | None]] = {}
        self.pulls_task: asyncio.Task[None] | None = None
        # session -> this process's subscription to its notices (a channel of the hub's
        # in the session's group, and the task reading it), shared by all its viewers.
        self.subscriptions: dict[str, asyncio.Future[Subscription]] = {}
        self.fanning: dict[str, asyncio.Task[None]] = {}  # session -> its running fan-out
        self.pending_asks: list[tuple[list[Ask], asyncio.Future[Any]]] = []
        self.asks_task: asyncio.Task[None] | None = None

    # --- access -----------------------------------------------------------------------

    async def roles_of(self, user_id: Any, session_key: str | None) -> frozenset[str]:
        """The viewer's roles now; none once the sign-in `session_key` has ended."""
        if user_id is None or not session_key:
            return frozenset()
        future: asyncio.Future[frozenset[str]] = asyncio.get_running_loop().create_future()
        self.pending_roles.setdefault((user_id, session_key), []).append(future)
        if self.roles_task is None:
            self.roles_task = asyncio.ensure_future(self._load_roles())
        return await future

    async def _load_roles(self) -> None:
        """One query per batch: the viewers one notice woke all ask within a few loop
        turns, and those asking while a query runs join the next one."""
        try:
            await asyncio.sleep(0)
            while self.pending_roles:
                batch, self.pending_roles = self.pending_roles, {}
                try:
                    found = await db_call(viewer_roles)(list(batch))
                except Exception as exc:
                    for futures in batch.values():
                        for future in futures:
                            if not future.done():
                                future.set_exception(exc)
                    continue
                for viewer, futures in batch.items():
                    for future in futures:
                        if not future.done():
                            future.set_result(found.get(viewer, frozenset()))
        finally:
            self.roles_task = None

    # --- resync -----------------------------------------------------------------------

    def watch(self, session_id: str, viewer: Watcher) -> None:
        self.watchers.setdefault(session_id, {})[viewer] = None
        interval = float(settings.AERO_LIVE_RESYNC_SECONDS)
        if interval > 0 and self.resync_task is None:
            self.resync_task = asyncio.ensure_future(self._resync(interval))

    def unwatch(self, session_id: str, viewer: Watcher) -> None:
        viewers = self.watchers.get(session_id)
        if viewers is not None:
            viewers.pop(viewer, None)
            if not viewers:
                del self.watchers[session_id]

    async def _resync(self, interval: float) -> None:
        """Every `interval` while anyone watches: one query for the last seq of every
        watched session; each viewer behind it pulls (its own lock keeps that pull from
        overlapping one a notice started, so nothing is sent twice)."""
        try:
            while self.watchers:
                await asyncio.sleep(interval)
                if not self.watchers:
                    return
                try:
                    found = await db_call(last_seqs)(list(self.watchers))
                except Exception:
                    # PostgreSQL restarting: the next pass reads again.
                    logger.warning("live resync: could not read the sessions", exc_info=True)
                    continue
                for session_id, last in found.items():
                    self.notice(session_id, last)
        finally:
            self.resync_task = None

    # --- notices: one subscription per session and process, fanned out here ------------

    async def join(self, session_id: str, viewer: Watcher) -> None:
        """Watch `session_id`: its notices reach `viewer` through this hub. The first
        viewer of a session in this process subscribes the hub to the session's group (one
        channel-layer message per notice and process, not one per viewer); the others
        wait for that subscription, so a notice published once `join` returns is seen."""
        self.watch(session_id, viewer)
        subscription = self.subscriptions.get(session_id)
        if subscription is None:
            subscription = asyncio.ensure_future(self._subscribe(session_id))
            self.subscriptions[session_id] = subscription
        try:
            await asyncio.shield(subscription)
        except Exception:
            # Redis unreachable: the next viewer tries again; this one is refused.
            if self.subscriptions.get(session_id) is subscription:
                del self.subscriptions[session_id]
            self.unwatch(session_id, viewer)
            raise

    async def leave(self, session_id: str, viewer: Watcher) -> None:
        """`viewer` stops watching; the last viewer of a session in this process ends the
        hub's subscription (a later viewer makes a new one, on a new channel)."""
        self.unwatch(session_id, viewer)
        if session_id in self.watchers or session_id not in self.subscriptions:
            return
        subscription = self.subscriptions.pop(session_id)
        try:
            channel, reader = await subscription
        except Exception:
            return  # it never subscribed
        try:
            await get_channel_layer().group_discard(session_group(session_id), channel)
        finally:
            reader.cancel()

    async def _subscribe(self, session_id: str) -> Subscription:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(session_group(session_id), channel)
        return channel, asyncio.ensure_future(self._listen(session_id, channel))

    async def _listen(self, session_id: str, channel: str) -> None:
        layer = get_channel_layer()
        while True:
            try:
                message = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Redis restarting: wait, join the group again (a flushed Redis forgot
                # it); notices lost meanwhile are made up by the resync.
                logger.warning("live notices of %s: receive failed", session_id, exc_info=True)
                await asyncio.sleep(1)
                try:
                    await layer.group_add(session_group(session_id), channel)
                except Exception:
                    logger.debug("live notices of %s: rejoin failed", session_id, exc_info=True)
                continue
            if message.get("type") == "session.notice":
                self.notice(session_id, int(message.get("seq", 0)))

    def notice(self, session_id: str, seq: int) -> None:
        """Events up to `seq` exist: bring every viewer of the session here up to it.
        One fan-out per session at a time; notices arriving while it runs only raise
        `latest`, and it goes round again (coalesced)."""
        self.announce(session_id, seq)
        if session_id not in self.fanning:
            self.fanning[session_id] = asyncio.ensure_future(self._fan_out(session_id))

    async def _fan_out(self, session_id: str) -> None:
        done = 0
        try:
            while (target := self.latest.get(session_id, 0)) > done:
                done = target
                try:
                    await self._fan_out_once(session_id, target)
                except Exception:  # a database error: the next notice or resync retries
                    logger.warning("live fan-out of %s failed", session_id, exc_info=True)
        finally:
            # Here, not in a done callback: between the last check of `latest` and a
            # callback, a notice would find this task still registered and be skipped.
            self.fanning.pop(session_id, None)

    async def _fan_out_once(self, session_id: str, target: int) -> None:
        """One round for the viewers behind `target`: the page viewers that are idle
        are checked together (one role read for their users), share one render per
        (roles, seq, answer box, language) and get the same frames, written one after
        another with no task or channel-layer message per viewer. A viewer already
        pulling (its lock held), and API streams, pull on their own, after."""
        behind = [v for v in list(self.watchers.get(session_id, ())) if v.sent_seq < target]
        pages: list[SessionConsumer] = []
        for viewer in behind:
            if isinstance(viewer, SessionConsumer) and not viewer.flushing.locked():
                await viewer.flushing.acquire()  # free: taken without waiting
                pages.append(viewer)
            else:
                self.later(viewer)
        if not pages:
            return
        try:
            asks = [
                Ask(
                    v.user_id,
                    session_id,
                    v.sent_seq,
                    v.composer_key,
                    v.language,
                    v.roles,
                    v.session_key,
                )
                for v in pages
            ]
            answers = await self.check_and_render(asks)
            for viewer, (roles, update) in zip(pages, answers, strict=True):
                try:
                    caught_up = await viewer.apply(roles, update)
                except Exception:  # this socket broke: the others still get theirs
                    logger.debug("live push to a viewer of %s failed", session_id, exc_info=True)
                    continue
                if not caught_up:
                    self.later(viewer)  # more than one batch behind: it pulls the rest
        finally:
            for viewer in pages:
                viewer.flushing.release()

    async def check_and_render(
        self, asks: list[Ask]
    ) -> list[tuple[frozenset[str] | None, Update | None]]:
        """`check_and_render` for `asks`, batched with the fan-outs of other sessions
        that ask meanwhile: one database call (one thread hop) for all of them."""
        future: asyncio.Future[list[tuple[frozenset[str] | None, Update | None]]]
        future = asyncio.get_running_loop().create_future()
        self.pending_asks.append((asks, future))
        if self.asks_task is None:
            self.asks_task = asyncio.ensure_future(self._check_and_render_asks())
        return await future

    async def _check_and_render_asks(self) -> None:
        try:
            await asyncio.sleep(0)
            while self.pending_asks:
                batch, self.pending_asks = self.pending_asks, []
                try:
                    answers = await db_call(check_and_render)(
                        [ask for asks, _ in batch for ask in asks]
                    )
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                start = 0
                for asks, future in batch:
                    if not future.done():
                        future.set_result(answers[start : start + len(asks)])
                    start += len(asks)
        finally:
            self.asks_task = None

    def later(self, viewer: Watcher) -> None:
        """`viewer` pulls on its own (after any pull it is running)."""
        task = asyncio.ensure_future(viewer.catch_up())
        self.catching_up.add(task)
        task.add_done_callback(self.catching_up.discard)

    # --- renders ----------------------------------------------------------------------

    def announce(self, session_id: str, seq: int) -> None:
        if seq > self.latest.get(session_id, 0):
            self.latest[session_id] = seq

    async def shared(
        self, key: Hashable, fresh: Callable[[Any], bool], compute: Callable[[], Awaitable[Any]]
    ) -> Any:
        """The result of `compute` for `key`, computed once for every caller that asks
        while it runs and reused while `fresh(result)` holds."""
        future = self.renders.get(key)
        if (
            future is not None
            and future.done()
            and (future.cancelled() or future.exception() is not None or not fresh(future.result()))
        ):
            future = None
        if future is None:
            future = asyncio.ensure_future(compute())
            self.renders[key] = future
            while len(self.renders) > RENDER_CACHE_SIZE:
                self.renders.popitem(last=False)
        else:
            self.renders.move_to_end(key)
        return await asyncio.shield(future)

    async def session_update(
        self,
        roles: frozenset[str],
        session_id: str,
        after: int,
        composer_key: str | None,
        language: str | None = None,
    ) -> Update | None:
        # Reused only while no notice announced anything newer than the render saw: a
        # reused fragment is then exactly what a fresh render would give.
        def fresh(update: Update | None) -> bool:
            return update is not None and update.as_of >= self.latest.get(session_id, 0)

        pull = Pull(roles, session_id, after, composer_key, language)
        return await self.shared(("session", pull), fresh, lambda: self._render(pull))

    async def _render(self, pull: Pull) -> Update | None:
        future = self.pending_pulls.get(pull)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self.pending_pulls[pull] = future
        if self.pulls_task is None:
            self.pulls_task = asyncio.ensure_future(self._render_pulls())
        return await future

    async def _render_pulls(self) -> None:
        """One database call per batch of pulls (render_batch): the pulls one notice
        woke, or that many notices woke while the previous batch rendered."""
        try:
            await asyncio.sleep(0)
            while self.pending_pulls:
                batch, self.pending_pulls = self.pending_pulls, {}
                pulls = list(batch)
                try:
                    updates = await db_call(render_batch)(pulls)
                except Exception as exc:
                    for future in batch.values():
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for pull, update in zip(pulls, updates, strict=True):
                    if not batch[pull].done():
                        batch[pull].set_result(update)
        finally:
            self.pulls_task = None


_hubs: dict[asyncio.AbstractEventLoop, Hub] = {}


def hub() -> Hub:
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        for stale in [known for known in _hubs if known.is_closed()]:
            del _hubs[stale]
        found = _hubs[loop] = Hub()
    return found


class SignedInSocket(AsyncWebsocketConsumer):
    """A page socket lasts only as long as the sign-in it was opened with: it joins its
    user's group, and signing out of that sign-in (diagnosis.push.notify_signed_out,
    naming the session by its digest) closes it at once; the user's sockets of other
    sign-ins stay. Every push re-checks the sign-in as well (viewer_roles), so one whose
    notice was lost, or that ended otherwise (expired, a changed password), stops at the
    next push."""

    user_id: Any = None
    session_key: str | None = None
    user_joined: bool = False

    async def join_user(self) -> None:
        await self.channel_layer.group_add(user_group(self.user_id), self.channel_name)
        self.user_joined = True

    async def leave_user(self) -> None:
        if self.user_joined:
            self.user_joined = False
            await self.channel_layer.group_discard(user_group(self.user_id), self.channel_name)

    async def auth_ended(self, message: dict[str, Any]) -> None:
        if self.session_key and message.get("session") == session_digest(self.session_key):
            await self.signed_out()

    async def signed_out(self) -> None:
        await self.disconnect(CLOSE_SIGNED_OUT)
        await self.close(code=CLOSE_SIGNED_OUT)


class SessionConsumer(SignedInSocket):
    """The session page's live timeline. It joins no channel-layer group itself: the hub
    holds one subscription per session and process and fans each notice out."""

    session_id: str
    group: str = ""
    user_id: Any = None
    sent_seq: int = 0
    composer_key: str | None = None
    language: str | None = None
    # The roles the last check found: the next pull reads the events under them, then
    # checks again.
    roles: frozenset[str] = frozenset()

    async def connect(self) -> None:
        register_server_loop(asyncio.get_running_loop())
        # One pull at a time: a notice and the hub's resync may both ask for one.
        self.flushing = asyncio.Lock()
        self.session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        self.user_id = user_id_of(self.scope)
        self.session_key = session_key_of(self.scope)
        roles = await self.allowed()
        if not roles:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.roles = roles
        await self.join_user()
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            self.sent_seq = max(0, int(query.get("last_seq", ["0"])[0]))
        except ValueError:
            self.sent_seq = 0
        # What the page's answer box shows now, so it is replaced only when that changes.
        self.composer_key = query.get("composer", [None])[0]
        # The page's language: fragments must match the page they are swapped into.
        self.language = supported(query.get("lang", [None])[0])
        # Notices reach this viewer through the hub's subscription (one per session and
        # process), taken before the catch-up below reads the log.
        await hub().join(self.session_id, self)
        self.group = session_group(self.session_id)
        await self.accept()
        metrics.ws_connected("page", self.sent_seq)
        await self.flush()  # catch up on everything after last_seq

    async def allowed(self) -> frozenset[str] | None:
        roles = await hub().roles_of(self.user_id, self.session_key)
        return roles if roles & set(VIEW_SESSIONS) else None

    async def disconnect(self, code: int) -> None:
        await self.leave_user()
        if self.group:
            self.group = ""  # a pull running now stops at its next turn
            await hub().leave(self.session_id, self)

    async def signed_out(self) -> None:
        await self.stop(CLOSE_SIGNED_OUT)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        # The page sends nothing we act on: decisions and answers are plain POSTs, so a
        # WebSocket message can never count as an approval.
        return

    async def catch_up(self) -> None:
        """The hub's resync found events this viewer has not been sent."""
        try:
            await self.flush()
        except Exception:  # the socket closed meanwhile: nothing to catch up
            logger.debug("live resync of %s failed", self.session_id, exc_info=True)

    async def flush(self) -> None:
        async with self.flushing:
            await self._flush()

    async def _flush(self) -> None:
        """Send everything new: the events read under the roles of the last check, then
        access checked again (roles may have changed, the session may have been deleted):
        what was committed after a role was taken away is never sent. Roles
        that changed otherwise: read again under the new ones (CHECK_ROUNDS, then
        closed)."""
        rounds = 0
        while self.group:
            used = self.roles
            update = await hub().session_update(
                used, self.session_id, self.sent_seq, self.composer_key, self.language
            )
            roles = await self.allowed()
            if roles is not None and roles != used:
                rounds += 1
                self.roles = roles
                if rounds < CHECK_ROUNDS:
                    continue  # the masks and forms follow the new roles: render again
                roles = None
            if await self.apply(roles, update):
                return
            rounds = 0

    async def apply(self, roles: frozenset[str] | None, update: Update | None) -> bool:
        """One turn of a pull, with the flushing lock held (by `flush` or the hub's
        fan-out): close the socket if the viewer may no longer watch (`roles` None) or
        the session is gone (`update` None), else send the update. True when nothing is
        left to send."""
        if not self.group:
            return True  # disconnected while the render ran
        if roles is None:
            await self.stop(CLOSE_FORBIDDEN)
            return True
        self.roles = roles
        if update is None:
            await self.stop(CLOSE_GONE)
            return True
        if not update.frames:
            return True
        for frame in update.frames:
            await self.send(text_data=frame)
        metrics.events_sent("page", update.seq - self.sent_seq)
        self.sent_seq, self.composer_key = update.seq, update.composer_key
        # Sent all the render saw and all any notice announced: done. Another turn
        # would cost every viewer a role check and a read that finds nothing; a
        # notice arriving later starts its own fan-out.
        return update.seq >= max(update.as_of, hub().latest.get(self.session_id, 0))

    async def stop(self, code: int) -> None:
        await self.disconnect(code)
        await self.close(code=code)


def render_board(roles: frozenset[str]) -> str:
    context = presenters.airport_board_context(roles)
    return render_to_string("diagnosis/airport_board.html#airport-board", {**context, "oob": True})


class PageNoticeConsumer(SignedInSocket):
    """A page that re-reads itself on a notice (no content in the notice, as for the
    session timeline): the airport board, the to-dos page. Each pull re-checks the
    viewer's roles and shares one render per notice and role set."""

    group: str = AIRPORT_GROUP
    may_view: tuple[str, ...] = VIEW_SESSIONS
    page: str = "board"
    user_id: Any = None
    joined: bool = False
    language: str | None = None

    def render(self, roles: frozenset[str]) -> str:
        return render_board(roles)

    def render_in_language(self, roles: frozenset[str]) -> str:
        # In the page's language: the fragment replaces part of that page.
        with translation.override(self.language or settings.LANGUAGE_CODE):
            return self.render(roles)

    def read_query(self, query: dict[str, list[str]]) -> None:
        """The page's own parameters (a subclass adds its filters): its language."""
        self.language = supported(query.get("lang", [None])[0])

    def page_key(self) -> tuple[Any, ...]:
        """What makes two viewers' renders the same, beside the notice and the roles."""
        return (self.page, self.language)

    async def connect(self) -> None:
        register_server_loop(asyncio.get_running_loop())
        self.user_id = user_id_of(self.scope)
        self.session_key = session_key_of(self.scope)
        self.read_query(parse_qs(self.scope.get("query_string", b"").decode()))
        if await self.allowed() is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.join_user()
        await self.channel_layer.group_add(self.group, self.channel_name)
        self.joined = True
        await self.accept()
        # Whatever changed between page render and connect: a render of its own.
        await self.refresh(uuid.uuid4().hex)

    async def allowed(self) -> frozenset[str] | None:
        roles = await hub().roles_of(self.user_id, self.session_key)
        return roles if roles & set(self.may_view) else None

    async def disconnect(self, code: int) -> None:
        await self.leave_user()
        if self.joined:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            self.joined = False

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        return  # changes are POSTs; nothing sent over the socket counts as one

    async def board_notice(self, message: dict[str, Any]) -> None:
        await self.refresh(str(message.get("stamp") or uuid.uuid4().hex))

    async def refresh(self, stamp: str) -> None:
        roles = await self.allowed()
        if roles is None:
            await self.disconnect(CLOSE_FORBIDDEN)
            await self.close(code=CLOSE_FORBIDDEN)
            return
        html = await hub().shared(
            (*self.page_key(), stamp, roles),
            lambda _: True,
            lambda: db_call(self.render_in_language)(roles),
        )
        await self.send(text_data=html)
