"""Live pages over WebSocket. Notices say "something new up to seq N"; the consumer reads
what it has not sent from the event log, so a dropped notice loses nothing.

The session page's socket (SessionConsumer) joins the process's hub
(diagnosis.live_hub), which fans notices out and shares renders (diagnosis.live_render)
and access checks (diagnosis.live_access); the board and to-dos pages re-read themselves
on a notice (PageNoticeConsumer)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.utils import translation

from aero import metrics
from aero.db_async import db_call
from aero.i18n import supported
from aero.roles import VIEW_SESSIONS
from diagnosis.live_access import (
    CHECK_ROUNDS,
    CLOSE_FORBIDDEN,
    CLOSE_GONE,
    CLOSE_SIGNED_OUT,
    session_key_of,
    user_id_of,
)
from diagnosis.live_hub import PageViewer, hub
from diagnosis.live_render import Update
from diagnosis.live_write import Broadcast, Direct, direct
from diagnosis.push import (
    BOARD_GROUP,
    register_server_loop,
    session_digest,
    session_group,
    user_group,
)

logger = logging.getLogger("diagnosis.consumers")


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

    async def dispatch(self, message: dict[str, Any]) -> None:
        # channels closes old connections before every message, on its one
        # thread-sensitive thread: a hop per handshake, all in a row, that a thousand
        # sockets opening at once queued behind. These consumers open none there: their
        # database calls (aero.db_async.db_call) give theirs back after each call.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        # As channels' own, without its hop to close old connections (see dispatch).
        for group in self.groups:
            await self.channel_layer.group_discard(group, self.channel_name)
        await self.disconnect(message["code"])
        raise StopConsumer()

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


class SessionConsumer(PageViewer, SignedInSocket):
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
    # Daphne's socket behind this consumer's send, written to directly (live_write).
    writer: Direct | None = None

    async def connect(self) -> None:
        register_server_loop(asyncio.get_running_loop())
        # One pull at a time: a notice and the hub's resync may both ask for one.
        self.flushing = asyncio.Lock()
        self.writer = direct(self.base_send)
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
            before = self.sent_seq
            broadcast = Broadcast()
            caught_up = await self.apply(roles, update, broadcast)
            if self.sent_seq > before:
                metrics.events_sent("page", self.sent_seq - before)
            metrics.live_frames(broadcast.direct, broadcast.buffered, broadcast.asgi)
            if caught_up:
                return
            rounds = 0

    async def apply(
        self, roles: frozenset[str] | None, update: Update | None, broadcast: Broadcast
    ) -> bool:
        """One turn of a pull, with the flushing lock held (by `flush` or the hub's
        fan-out): close the socket if the viewer may no longer watch (`roles` None) or
        the session is gone (`update` None), else send the update (framed once per
        `broadcast`, written directly where daphne serves the socket). True when nothing
        is left to send. The caller counts what was sent (the hub once per fan-out, not
        once per viewer)."""
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
        if not broadcast.write(self.writer, update):
            for frame in update.frames:
                await self.send(text_data=frame)
            broadcast.asgi += len(update.frames)
        self.sent_seq, self.composer_key = update.seq, update.composer_key
        # Sent all the render saw and all any notice announced: done. Another turn
        # would cost every viewer a role check and a read that finds nothing; a
        # notice arriving later starts its own fan-out.
        return update.seq >= max(update.as_of, hub().latest.get(self.session_id, 0))

    async def stop(self, code: int) -> None:
        await self.disconnect(code)
        await self.close(code=code)


class PageNoticeConsumer(SignedInSocket):
    """A page that re-reads itself on a notice (no content in the notice, as for the
    session timeline): a pack's board of restrictions, the to-dos page. Each pull re-checks the
    viewer's roles and shares one render per notice and role set."""

    group: str = BOARD_GROUP
    may_view: tuple[str, ...] = VIEW_SESSIONS
    page: str = ""
    user_id: Any = None
    joined: bool = False
    language: str | None = None

    def render(self, roles: frozenset[str]) -> str:
        raise NotImplementedError  # each page renders its own fragment

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
