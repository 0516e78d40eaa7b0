"""The airport status board, live: it re-reads itself on the board's notice."""

from __future__ import annotations

from typing import Any

from django.template.loader import render_to_string
from django.urls import path

from diagnosis.consumers import PageNoticeConsumer
from packs.airport.pages import board_page


def render_board(roles: frozenset[str]) -> str:
    context = board_page(roles)
    return render_to_string("airport/board.html#airport-board", {**context, "oob": True})


class BoardConsumer(PageNoticeConsumer):
    page = "board"

    def render(self, roles: frozenset[str]) -> str:
        return render_board(roles)


def board_sockets() -> list[Any]:
    return [path("ws/airport/", BoardConsumer.as_asgi())]
