"""Live session timeline over WebSocket. Notices say "something new up to seq N"; the
consumer reads what it has not sent from the event log and renders it for ITS viewer
(roles change what a fragment shows), so a dropped notice loses nothing."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from aero import metrics
from aero.roles import VIEW_SESSIONS, has_role
from diagnosis import presenters
from diagnosis.models import Event, Session
from diagnosis.push import register_server_loop, session_group

BATCH = presenters.TIMELINE_PAGE
CLOSE_FORBIDDEN = 4403


def can_view(user: Any, session_id: Any) -> bool:
    return (
        has_role(user, VIEW_SESSIONS) and Session.objects.visible().filter(pk=session_id).exists()
    )


def render_updates(
    user: Any, session_id: Any, after: int, composer_key: str | None = None
) -> tuple[str, int, str | None]:
    """HTML with hx-swap-oob fragments for the events after `after` (at most one batch)
    and the panels they change, plus the key of the composer the page now shows.
    Returns ("", after, key) when there is nothing new.

    The session row is read first and only events up to its last_seq are sent: panels
    and timeline then describe the same moment, even while a job keeps appending.
    The composer (the answer box) is sent exactly when its key changes, whatever the
    events were: replacing it on every status event would wipe what the operator is
    typing, and tying it to event types missed a question committed between two reads."""
    session = Session.objects.select_related("scenario", "scenario_version", "created_by").get(
        pk=session_id
    )
    events = list(
        Event.objects.filter(
            session_id=session_id, seq__gt=after, seq__lte=session.last_seq
        ).order_by("seq")[:BATCH]
    )
    if not events:
        return "", after, composer_key
    panels: set[str] = set()
    for event in events:
        panels |= presenters.PANELS_BY_EVENT.get(event.type, set())
    new_key = presenters.composer_key(session)
    if new_key != composer_key:
        panels.add("session-composer")
    context = presenters.session_context(session, user) if panels else {}
    parts = [render_to_string("diagnosis/_timeline_append.html", {"events": events})]
    for panel in sorted(panels):
        parts.append(
            render_to_string(f"diagnosis/session_detail.html#{panel}", {**context, "oob": True})
        )
    return "".join(parts), events[-1].seq, new_key


class SessionConsumer(AsyncWebsocketConsumer):
    session_id: str
    group: str
    sent_seq: int
    composer_key: str | None = None

    async def connect(self) -> None:
        register_server_loop(asyncio.get_running_loop())
        self.session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        user = self.scope.get("user")
        if not await database_sync_to_async(can_view)(user, self.session_id):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.group = session_group(self.session_id)
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            self.sent_seq = max(0, int(query.get("last_seq", ["0"])[0]))
        except ValueError:
            self.sent_seq = 0
        # What the page's answer box shows now, so it is replaced only when that changes.
        self.composer_key = query.get("composer", [None])[0]
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        metrics.ws_connected("page", self.sent_seq)
        await self.flush()  # catch up on everything after last_seq

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        # The page sends nothing we act on: decisions and answers are plain POSTs, so a
        # WebSocket message can never count as an approval.
        return

    async def session_notice(self, message: dict[str, Any]) -> None:
        if message.get("seq", 0) > self.sent_seq:
            await self.flush()

    async def flush(self) -> None:
        user = self.scope.get("user")
        while True:
            html, seq, key = await database_sync_to_async(render_updates)(
                user, self.session_id, self.sent_seq, self.composer_key
            )
            if not html:
                return
            metrics.events_sent("page", seq - self.sent_seq)
            self.sent_seq, self.composer_key = seq, key
            await self.send(text_data=html)
