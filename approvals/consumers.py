"""The live approval queue: a notice means "the queue changed". Each pull re-checks the
viewer's roles; the page (filters, keyset cursor) is rendered once per role set and
notice for all the viewers showing it (see diagnosis.consumers.Hub)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.template.loader import render_to_string
from django.utils import translation

from aero.i18n import supported
from aero.roles import DECIDE_APPROVALS, RUN_SESSIONS, VIEW_TODOS
from approvals.presenters import queue_context, todo_context
from approvals.push import QUEUE_GROUP
from diagnosis.consumers import CLOSE_FORBIDDEN, PageNoticeConsumer, hub, user_id_of
from diagnosis.push import register_server_loop


def render_queue(
    roles: frozenset[str], risk: str, scenario: str, cursor: str = "", language: str | None = None
) -> str:
    # In the page's language: the fragment replaces part of that page.
    with translation.override(language or settings.LANGUAGE_CODE):
        context = queue_context(None, risk, scenario, cursor, roles=roles)
        return render_to_string("approvals/queue.html#approval-queue", {**context, "oob": True})


class ApprovalQueueConsumer(AsyncWebsocketConsumer):
    risk: str = ""
    scenario: str = ""
    cursor: str = ""
    user_id: Any = None
    joined: bool = False
    language: str | None = None

    async def connect(self) -> None:
        register_server_loop(asyncio.get_running_loop())
        self.user_id = user_id_of(self.scope)
        if await self.allowed() is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.risk = query.get("risk", [""])[0]
        self.scenario = query.get("scenario", [""])[0]
        self.cursor = query.get("after", [""])[0]
        self.language = supported(query.get("lang", [None])[0])
        await self.channel_layer.group_add(QUEUE_GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        # Whatever changed between page render and connect: a render of its own.
        await self.refresh(uuid.uuid4().hex)

    async def allowed(self) -> frozenset[str] | None:
        roles = await hub().roles_of(self.user_id)
        return roles if roles & set(DECIDE_APPROVALS) else None

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(QUEUE_GROUP, self.channel_name)
            self.joined = False

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        return  # decisions are POSTs; nothing sent over the socket counts as one

    async def queue_notice(self, message: dict[str, Any]) -> None:
        # Every viewer woken by the same notice shares one render per page and role set.
        await self.refresh(str(message.get("stamp") or uuid.uuid4().hex))

    async def refresh(self, stamp: str) -> None:
        roles = await self.allowed()
        if roles is None:
            await self.disconnect(CLOSE_FORBIDDEN)
            await self.close(code=CLOSE_FORBIDDEN)
            return
        html = await hub().shared(
            ("queue", stamp, roles, self.risk, self.scenario, self.cursor, self.language),
            lambda _: True,
            lambda: database_sync_to_async(render_queue)(
                roles, self.risk, self.scenario, self.cursor, self.language
            ),
        )
        await self.send(text_data=html)


def render_todos(roles: frozenset[str]) -> str:
    context = todo_context()
    return render_to_string(
        "approvals/todos.html#todo-list",
        {**context, "oob": True, "can_run": bool(roles & set(RUN_SESSIONS))},
    )


class TodoListConsumer(PageNoticeConsumer):
    """The to-dos page's first page, live: a to-do created by a timeout, resolved, or
    whose effect came into force on the board (the same notice as the board)."""

    may_view = VIEW_TODOS
    page = "todos"

    def render(self, roles: frozenset[str]) -> str:
        return render_todos(roles)
