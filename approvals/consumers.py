"""The live approval queue: a notice means "the queue changed"; each consumer re-renders
the queue with its own viewer's filters and roles."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from aero.roles import DECIDE_APPROVALS, has_role
from approvals.presenters import queue_context
from approvals.push import QUEUE_GROUP
from diagnosis.consumers import CLOSE_FORBIDDEN
from diagnosis.push import register_server_loop


def render_queue(user: Any, risk: str, scenario: str) -> str:
    context = queue_context(user, risk, scenario)
    return render_to_string("approvals/queue.html#approval-queue", {**context, "oob": True})


class ApprovalQueueConsumer(AsyncWebsocketConsumer):
    risk: str
    scenario: str

    async def connect(self) -> None:
        register_server_loop(asyncio.get_running_loop())
        user = self.scope.get("user")
        if not await database_sync_to_async(has_role)(user, DECIDE_APPROVALS):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.risk = query.get("risk", [""])[0]
        self.scenario = query.get("scenario", [""])[0]
        await self.channel_layer.group_add(QUEUE_GROUP, self.channel_name)
        await self.accept()
        await self.refresh()  # whatever changed between page render and connect

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(QUEUE_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        return  # decisions are POSTs; nothing sent over the socket counts as one

    async def queue_notice(self, message: dict[str, Any]) -> None:
        await self.refresh()

    async def refresh(self) -> None:
        html = await database_sync_to_async(render_queue)(
            self.scope.get("user"), self.risk, self.scenario
        )
        await self.send(text_data=html)
