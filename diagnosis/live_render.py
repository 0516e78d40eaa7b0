"""Rendering a live pull: the HTML fragments (hx-swap-oob) a session page needs for the
events after the seq it shows, and the panels they change, as WebSocket messages of at
most FRAME_BYTES each.

What a fragment shows depends on the session, the seq range, the viewer's roles (the
forms they get, what is masked), the page's answer box and language, never on who the
viewer is: a `Pull` names exactly that, so one render serves every viewer asking the same
pull (the hub in diagnosis.live_hub shares it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import translation
from django.utils.html import format_html
from django.utils.translation import gettext

from aero import metrics
from aero.packs import pack_for
from aero.templatetags.aero_text import when
from diagnosis import live_shared, page_panels, presenters
from diagnosis import timeline_rows as timeline_rows_cache
from diagnosis.eventlog.masking import SessionMask, hidden_by_session, mask_of, masks_roles
from diagnosis.models import Event, Session

BATCH = presenters.TIMELINE_PAGE
# Largest WebSocket message the consumers send: half of daphne's 1 MB limit (over it,
# daphne closes the socket with 1011), leaving room for any framing overhead.
FRAME_BYTES = 512 * 1024


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

    def dump(self) -> dict[str, Any]:
        """As stored for the other processes (live_shared)."""
        return {"frames": list(self.frames), "seq": self.seq, "composer_key": self.composer_key,
                "as_of": self.as_of}  # fmt: skip

    @classmethod
    def load(cls, data: dict[str, Any]) -> Update:
        return cls(tuple(data["frames"]), data["seq"], data["composer_key"], data["as_of"])


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
class Claimed(Update):
    """A render another process claimed (live_shared) and is making, not an update to
    send: fetched by its `key` once stored (the hub's fan-out waits for it off the batch,
    Hub.claimed_renders). Only within `leaving_claimed`."""

    key: str


# Set by the hub's fan-out (`leaving_claimed`): render_batch then returns a Claimed for a
# pull another process is rendering instead of waiting for it in the batch: a batch of a
# dozen sessions waited ~13 ms for one other process's render, every session's viewers
# with it, and the process's next batch behind it.
_leave_claimed: ContextVar[bool] = ContextVar("leave_claimed", default=False)


@contextmanager
def leaving_claimed() -> Iterator[None]:
    token = _leave_claimed.set(True)
    try:
        yield
    finally:
        _leave_claimed.reset(token)


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
    renders in its page's language. A Claimed only within `leaving_claimed`: a pull
    another process is rendering, its events not read here."""
    leave_claimed = _leave_claimed.get()
    ids = {pull.session_id for pull in pulls}
    sessions = {
        str(session.pk): session
        for session in Session.objects.visible()
        .select_related("scenario", "scenario_version", "created_by")
        .defer("scenario_version__definition")  # parsed once per process (presenters)
        .filter(pk__in=ids)
    }
    # What another process rendered already for the same pull and last_seq is fetched,
    # not rendered again (live_shared); the events are read for the rest only.
    keys = {
        pull: live_shared.key_of(
            pull.session_id,
            pull.after,
            sessions[pull.session_id].last_seq,
            pull.roles,
            pull.composer_key,
            pull.language,
        )
        for pull in pulls
        if pull.session_id in sessions and sessions[pull.session_id].last_seq > pull.after
    }
    shared, claimed = live_shared.claim(list(dict.fromkeys(keys.values())))
    others = set(claimed)  # keys another process is rendering
    # Seqs are gap-free, so (after, after + BATCH] holds at most one batch: every pull's
    # range goes into the one query, bounded by its session's last_seq as read above
    # (the ranges another process is rendering too: if it is late, they render here).
    ranges: dict[tuple[str, int], int] = {}
    skipped = shared.keys() | (others if leave_claimed else set())
    for pull in pulls:
        session = sessions.get(pull.session_id)
        if session is not None and session.last_seq > pull.after and keys[pull] not in skipped:
            ranges[(pull.session_id, pull.after)] = min(session.last_seq, pull.after + BATCH)
    contexts = PanelContexts()
    # The masks of every session rendered here for masked viewers: one query for all.
    masked = [pull for pull in pulls if masks_roles(pull.roles)]
    contexts.read_masks({p.session_id for p in masked if (p.session_id, p.after) in ranges})
    found: dict[str, list[Event]] = {}
    if ranges:
        wanted = Q()
        for (session_id, after), upto in ranges.items():
            wanted |= Q(session_id=session_id, seq__gt=after, seq__lte=upto)
        for event in Event.objects.filter(wanted).order_by("session_id", "seq"):
            found.setdefault(str(event.session_id), []).append(event)
    updates: dict[int, Update | None] = {}
    rendered: dict[str, dict[str, Any]] = {}
    fetched: set[str] = set()  # the keys another process rendered

    def shown(pull: Pull, session: Session) -> tuple[list[Event], list[Event]]:
        """The pull's events, and as its viewers see them (masked or not)."""
        upto = ranges.get((pull.session_id, pull.after), pull.after)
        events = [e for e in found.get(pull.session_id, []) if pull.after < e.seq <= upto]
        if not events and upto > pull.after:
            # Not reached while seqs stay gap-free; if one were missing, read by count.
            events = list(
                Event.objects.filter(
                    session_id=pull.session_id, seq__gt=pull.after, seq__lte=session.last_seq
                ).order_by("seq")[:BATCH]
            )
        mask = contexts.mask(pull, session) if events else None
        return events, mask.events(events) if mask is not None else events

    def render(n: int, pull: Pull, session: Session, seen: tuple[list[Event], list[Event]]) -> None:
        with translation.override(pull.language or settings.LANGUAGE_CODE):
            update = _render_updates(pull, session, *seen, contexts)
        updates[n] = update
        key = keys.get(pull)
        if key is not None:
            rendered[key] = update.dump()

    # First what is stored or this process's to render (stored at once for the others),
    # then what other processes claimed: fetched if they stored it in time, else rendered.
    later: list[tuple[int, Pull, Session]] = []
    here: list[tuple[int, Pull, Session]] = []
    for n, pull in enumerate(pulls):
        session = sessions.get(pull.session_id)
        key = keys.get(pull)
        if session is None:
            updates[n] = None
        elif key is not None and key in shared:
            updates[n] = Update.load(shared[key])
            fetched.add(key)
        elif key is not None and key in others:
            if leave_claimed:
                updates[n] = Claimed((), pull.after, pull.composer_key, session.last_seq, key)
            else:
                later.append((n, pull, session))
        else:
            here.append((n, pull, session))
    # The timeline rows of every render here: read in one cache call, stored in one.
    with timeline_rows_cache.batch() as rows_batch:
        seen = {n: shown(pull, session) for n, pull, session in here}
        row_keys: list[str] = []
        for n, pull, session in here:
            if seen[n][1]:
                with translation.override(pull.language or settings.LANGUAGE_CODE):
                    definition = presenters.version_definition(session)
                    row_keys += timeline_rows_cache.keys_of(seen[n][1], definition)
        rows_batch.read(row_keys)
        for n, pull, session in here:
            render(n, pull, session, seen[n])
        live_shared.put(rendered)
        if later:
            keys_later = list(dict.fromkeys(keys[pull] for _, pull, _ in later))
            arrived = live_shared.wait_for(keys_later)
            mine = len(rendered)
            for n, pull, session in later:
                if keys[pull] in arrived:
                    updates[n] = Update.load(arrived[keys[pull]])
                    fetched.add(keys[pull])
                elif keys[pull] not in rendered:
                    render(n, pull, session, shown(pull, session))
                else:  # a second pull with the same key, rendered here just before
                    updates[n] = Update.load(rendered[keys[pull]])
            live_shared.put(dict(list(rendered.items())[mine:]))
    metrics.live_renders(len(rendered), len(fetched))
    return [updates[n] for n in range(len(pulls))]


class PanelContexts:
    """The panels' context for the pulls of one batch: the world read once, each
    session's rows read once, worded once per language (labels and consequences are
    worded when the context is built); only the role flags differ per pull."""

    def __init__(self) -> None:
        # The world the panels word things with (presenters.read_world), read once.
        self.world: presenters.PageWorld | None = None
        self.world_read = False
        self.reads: dict[str, presenters.SessionReads] = {}
        # Worded per language and per masking (a read-only viewer's panels hide values).
        self.worded: dict[tuple[str, str | None, bool], dict[str, Any]] = {}
        self.masks: dict[str, SessionMask] = {}

    def read_masks(self, session_ids: set[str]) -> None:
        """The masks of these sessions, in one query (a burst over many sessions read
        one per session)."""
        wanted = sorted(session_ids - set(self.masks))
        if wanted:
            found = hidden_by_session(wanted)
            for session_id in wanted:
                self.masks[session_id] = found.get(session_id, SessionMask(frozenset()))

    def mask(self, pull: Pull, session: Session) -> SessionMask | None:
        """The masking for the pull's viewers (None: they see everything), its hidden
        values read once per session."""
        if not masks_roles(pull.roles):
            return None
        if pull.session_id not in self.masks:
            self.masks[pull.session_id] = mask_of(session.pk)
        return self.masks[pull.session_id]

    def session_reads(self, pull: Pull, session: Session) -> presenters.SessionReads:
        """What the session's panels read (presenters.read_session), once per batch."""
        reads = self.reads.get(pull.session_id)
        if reads is None:
            if not self.world_read:
                self.world, self.world_read = presenters.read_world(), True
            reads = self.reads[pull.session_id] = presenters.read_session(
                session, self.world, world_read=True
            )
        return reads

    def context(self, pull: Pull, session: Session) -> dict[str, Any]:
        key = (pull.session_id, pull.language, masks_roles(pull.roles))
        worded = self.worded.get(key)
        if worded is None:
            worded = self.worded[key] = presenters.session_context(
                session,
                None,
                roles=pull.roles,
                reads=self.session_reads(pull, session),
                mask=self.mask(pull, session),
            )
        return {**worded, **presenters.flags_for_roles(pull.roles)}


def _render_updates(
    pull: Pull,
    session: Session,
    events: list[Event],
    shown: list[Event],
    contexts: PanelContexts,
) -> Update:
    """HTML with hx-swap-oob fragments for `events` (at most one batch, the events after
    `pull.after` up to the session's last_seq as read with `session`; `shown`: as the
    pull's viewers see them, masked or not) and the panels they change, for viewers
    holding `pull.roles`, as WebSocket messages of at most FRAME_BYTES each. `contexts`
    holds the panels' context, shared by the pulls of one batch.

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
    rows, sent = timeline_rows(shown, presenters.version_definition(session))
    panels: set[str] = set()
    for event in sent:
        panels |= presenters.panels_of(event)
    new_key = presenters.composer_key(session)
    if new_key != pull.composer_key:
        panels.add("session-composer")
    parts = [rows]
    if panels:
        # Shared with the page and every other process (page_panels): the panels of this
        # state, roles and language are rendered once.
        reads = contexts.session_reads(pull, session)
        definition = presenters.version_definition(session)
        own_facts = pack_for(definition["kind"]).page_panel is not None
        shared = page_panels.shared(
            sorted(panels),
            session,
            reads,
            pull.roles,
            mask,
            lambda: contexts.context(pull, session),
            keep=lambda panel: not (own_facts and panel == "session-facts"),
        )
        for panel in sorted(panels):
            html = str(page_panels.finish(shared[panel], reads, csrf_token=None, oob=True))
            parts.append(
                html if size_of(html) <= FRAME_BYTES else too_large_panel(panel, session.pk)
            )
    return Update(pack(parts), sent[-1].seq, new_key, session.last_seq)
