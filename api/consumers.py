"""The JSON event stream for API clients: /ws/api/sessions/<id>?last_seq=N.

A malformed id or last_seq gets one `{"type": "error", "code", "detail"}` message and
close code 4400; a last_seq past the end of the log starts at its end.

Authenticated by an API token (`Authorization: Bearer …` header, or `?token=` for clients
that cannot set headers). Sends the tech plan's envelope, one event per message, in seq
order: first everything after last_seq from the event log (catch-up, as far back as the
log goes), then whatever later notices announce. Delivery is at-least-once per session:
a client that reconnects with the last seq it processed gets no gap, and dedupes by
event_id anything it may have seen twice."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.urls import reverse

from aero import metrics
from aero.db_async import db_call
from aero.roles import VIEW_SESSIONS
from api.auth import token_from_raw
from api.presenters import envelope, viewer_mask
from diagnosis.eventlog.masking import SessionMask
from diagnosis.live_access import CHECK_ROUNDS
from diagnosis.live_hub import hub
from diagnosis.models import Event, Session
from diagnosis.push import register_server_loop, session_group

logger = logging.getLogger("api.consumers")

BATCH = 200
BATCH_BYTES = 1024 * 1024  # messages one pull hands to the loop, whatever their count
FETCH_CHUNK = 20  # rows read at a time (a server-side cursor on PostgreSQL)
FRAME_BYTES = 512 * 1024  # largest message sent: half of daphne's 1 MB limit (1011)
CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
STREAM = "api"


class Viewer:
    """What the presenters need to know about who is watching (and where the session's
    log ends, when it was checked)."""

    def __init__(self, user: Any, roles: frozenset[str], last_seq: int = 0) -> None:
        self.user = user
        self.api_roles = roles
        self.last_seq = last_seq


def authenticate(raw: str, session_id: str) -> tuple[Viewer | None, int]:
    token = token_from_raw(raw)
    if token is None:
        return None, CLOSE_UNAUTHENTICATED
    roles = token.effective_roles()
    if not roles & set(VIEW_SESSIONS):
        return None, CLOSE_FORBIDDEN
    last_seq = Session.objects.visible().filter(pk=session_id).values_list("last_seq", flat=True)
    found = list(last_seq)
    if not found:
        return None, CLOSE_FORBIDDEN
    return Viewer(token.user, roles, found[0]), 0


def pull(
    raw: str, session_id: str, after: int, viewer: Viewer
) -> tuple[Viewer | None, int, list[tuple[int, str, Any]]]:
    """The events after `after` as `events_after` gives them for `viewer` (the stream's
    last check), then the token checked again: a token revoked or expired, a user
    deactivated or a role taken away since the stream opened stops it at the next pull.
    The check comes after the read, so nothing committed after the change is sent: checked
    first, an event committed between the check and the read went out (CI caught one
    after a deactivation). When the roles changed, the events are read again under the
    roles now (their masks follow them), and checked again."""
    for _ in range(CHECK_ROUNDS):
        batch = events_after(session_id, after, viewer)
        checked, code = authenticate(raw, session_id)
        if checked is None:
            return None, code, []
        if checked.api_roles == viewer.api_roles:
            return checked, 0, batch
        viewer = checked
    return None, CLOSE_FORBIDDEN, []  # the roles changed under every read


def message_for(event: Event, mask: SessionMask | None) -> tuple[str, int]:
    """The event's message, JSON as sent, and its size in bytes. An envelope over
    FRAME_BYTES (only an event stored before the per-event cap could be) is replaced by
    an `event.too_large` notice naming the REST call that returns it: the stream never
    sends what daphne would refuse, and never skips an event without a word."""
    body = envelope(event, mask)
    text = json.dumps(body)
    if len(text) > FRAME_BYTES:  # ASCII: json.dumps escapes everything else
        text = json.dumps(
            {
                "event_id": body["event_id"],
                "session_id": body["session_id"],
                "type": "event.too_large",
                "ts": body["ts"],
                "seq": body["seq"],
                "payload": {
                    "event_type": body["type"],
                    "bytes": len(text),
                    "fetch": reverse("api:timeline", kwargs={"session_id": event.session_id})
                    + f"?from_seq={event.seq}&limit=1",
                },
            }
        )
    return text, len(text)


def events_after(session_id: str, after: int, viewer: Viewer) -> list[tuple[int, str, Any]]:
    """(seq, message, ts) for the events after `after`: at most BATCH of them and
    BATCH_BYTES of messages (always at least one). Rows are read a few at a time, so a
    batch of large events is neither held nor sent in one piece."""
    batch: list[tuple[int, str, Any]] = []
    used = 0
    events = Event.objects.filter(session_id=session_id, seq__gt=after).order_by("seq")[:BATCH]
    # Read before the events: values a call written meanwhile hides are masked by key
    # in its own events, and known to the next batch's mask.
    mask = viewer_mask(session_id, viewer)
    for event in events.iterator(chunk_size=FETCH_CHUNK):
        text, size = message_for(event, mask)
        if batch and used + size > BATCH_BYTES:
            break
        batch.append((event.seq, text, event.ts))
        used += size
    return batch


class ApiSessionStream(AsyncJsonWebsocketConsumer):
    session_id: str
    group: str
    sent_seq: int = 0
    viewer: Viewer | None = None
    raw: str = ""  # the token as sent: checked again at every pull

    async def connect(self) -> None:
        register_server_loop(asyncio.get_running_loop())
        self.flushing = asyncio.Lock()
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        last_seq = query.get("last_seq", ["0"])[0]
        code, refusal = "", ""
        try:
            uuid.UUID(self.session_id)
        except ValueError:
            code, refusal = "invalid_session_id", f"{self.session_id[:40]!r} is not a session id."
        if not refusal and not (last_seq.isascii() and last_seq.isdigit()):
            code = "invalid_last_seq"
            refusal = f"last_seq must be a whole number of 0 or more, not {last_seq[:20]!r}."
        if refusal:
            # Accept, say why in one message (daphne sends no close reason), close with
            # 4400: a refused handshake would only say "403", a guessed start replay wrong.
            metrics.ws_refused(STREAM)
            await self.accept()
            await self.send_json({"type": "error", "code": code, "detail": refusal})
            await self.close(code=CLOSE_BAD_REQUEST, reason=refusal)
            return
        headers = dict(self.scope.get("headers", []))
        raw = headers.get(b"authorization", b"").decode("latin-1")
        raw = raw[7:].strip() if raw.lower().startswith("bearer ") else query.get("token", [""])[0]
        viewer, close_code = await db_call(authenticate)(raw, self.session_id)
        if viewer is None:
            metrics.ws_refused(STREAM)
            # Accept, then close with a code that says why (4401: no valid token, 4403: no
            # access): a refused handshake would only tell an API client "403".
            await self.accept()
            await self.close(code=close_code)
            return
        self.viewer, self.raw = viewer, raw
        # A last_seq past the log's end (a client that kept another session's number, a
        # log restored from a backup) starts at the end: live events still come.
        self.sent_seq = min(int(last_seq), viewer.last_seq)
        # Notices arrive through the hub's subscription to the session (one per process);
        # a lost one is made up by its periodic resync.
        await hub().join(self.session_id, self)
        self.group = session_group(self.session_id)
        await self.accept()
        metrics.ws_connected(STREAM, self.sent_seq)
        await self.flush(live=False)  # catch up from last_seq out of the event log

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await hub().leave(self.session_id, self)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        return  # read-only stream: decisions and answers are REST calls

    async def catch_up(self) -> None:
        try:
            await self.flush(live=True)
        except Exception:  # the socket closed meanwhile
            logger.debug("stream resync of %s failed", self.session_id, exc_info=True)

    async def flush(self, live: bool) -> None:
        # One pull at a time: a notice and the hub's resync may both ask for one.
        async with self.flushing:
            await self._flush(live)

    async def _flush(self, live: bool) -> None:
        while True:
            if self.viewer is None:
                return  # connect() refused the stream
            viewer, code, batch = await db_call(pull)(
                self.raw, self.session_id, self.sent_seq, self.viewer
            )
            if viewer is None:
                metrics.ws_refused(STREAM)
                await self.close(code=code)
                return
            self.viewer = viewer
            if not batch:
                return
            for seq, text, _ts in batch:
                await self.send(text_data=text)
                self.sent_seq = seq
            metrics.events_sent(STREAM, len(batch), [ts for _, _, ts in batch] if live else None)
