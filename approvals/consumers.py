"""The live approval queue: a notice means "the queue changed". Each pull re-checks the
viewer's roles; the page (filters, keyset cursor) is rendered once per role set and
notice for all the viewers showing it (see diagnosis.live_hub.Hub)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.template.loader import render_to_string
from django.utils import translation

from aero.roles import DECIDE_APPROVALS, RUN_SESSIONS, VIEW_TODOS
from approvals.presenters import queue_context, todo_context
from approvals.push import QUEUE_GROUP
from diagnosis.consumers import PageNoticeConsumer


def render_queue(
    roles: frozenset[str],
    risk: str,
    scenario: str,
    cursor: str = "",
    language: str | None = None,
    incident: str = "",
) -> str:
    # In the page's language: the fragment replaces part of that page.
    with translation.override(language or settings.LANGUAGE_CODE):
        context = queue_context(None, risk, scenario, cursor, incident=incident, roles=roles)
        return render_to_string("approvals/queue.html#approval-queue", {**context, "oob": True})


class ApprovalQueueConsumer(PageNoticeConsumer):
    """The queue page with its filters, keyset cursor and incident (?incident=); a
    notice means "the queue changed" (approvals.push)."""

    group = QUEUE_GROUP
    may_view = DECIDE_APPROVALS
    page = "queue"
    risk: str = ""
    scenario: str = ""
    cursor: str = ""
    incident: str = ""

    def read_query(self, query: dict[str, list[str]]) -> None:
        super().read_query(query)
        self.risk = query.get("risk", [""])[0]
        self.scenario = query.get("scenario", [""])[0]
        self.cursor = query.get("after", [""])[0]
        self.incident = query.get("incident", [""])[0]

    def page_key(self) -> tuple[Any, ...]:
        return (*super().page_key(), self.risk, self.scenario, self.cursor, self.incident)

    def render(self, roles: frozenset[str]) -> str:
        return render_queue(
            roles, self.risk, self.scenario, self.cursor, self.language, self.incident
        )

    async def queue_notice(self, message: dict[str, Any]) -> None:
        # Every viewer woken by the same notice shares one render per page and role set.
        await self.board_notice(message)


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
