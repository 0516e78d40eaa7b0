"""What a proposed action means, in plain words, with its consequence on the world as it
is now: the pack's board (its world plus the restrictions in force) says it; a world
without a board gets the plain words only. Deterministic, no LLM; computed when shown,
so it always reflects the current board.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from django.utils.translation import gettext

from aero.packs import action_tool, installed_packs
from diagnosis.models import Restriction
from diagnosis.wording import TOOL_LABELS, plain


@dataclass(frozen=True)
class Consequence:
    plain: str
    consequence: str
    warn: bool  # the pack's board warns of it
    in_force: Restriction | None  # the same restriction already on the board
    own: bool = False  # put there by the session the action belongs to


def _translated(tool: str) -> str:
    """Plain words per action tool, as its pack declares them (the core's own two here);
    %(...)s are the call's arguments. gettext on each literal, so makemessages finds them."""
    declared = action_tool(tool)
    if declared is not None and declared.plain is not None:
        return str(declared.plain)
    core = {
        "lift_restriction": gettext("Lift the closure of %(kind)s %(target)s"),
        "continue_budget": gettext("Let the agent ask the model again"),
    }
    if tool in core:
        return core[tool]
    # An action without plain words of its own (the IT pack's fixes): its tool's words,
    # not its code; the card beside it lists the arguments.
    return plain(TOOL_LABELS, tool)


def plain_words(tool: str, args: dict[str, Any]) -> str:
    template = _translated(tool)
    try:
        return template % {k: v for k, v in args.items()}
    except (KeyError, TypeError, ValueError):
        return template.split(" %")[0] if "%" in template else template


class Board(Protocol):
    def consequence(
        self, tool: str, args: dict[str, Any], session_id: Any = None
    ) -> Consequence: ...


class PlainBoard:
    """No pack keeps a board of this world: the plain words, no consequence."""

    def consequence(self, tool: str, args: dict[str, Any], session_id: Any = None) -> Consequence:
        return Consequence(plain_words(tool, args), "", False, None)


def board_of(world: Any, active: list[Restriction]) -> Board:
    """The board of the pack that keeps one, over `world` and the restrictions in force."""
    for pack in installed_packs():
        if pack.board is not None:
            return pack.board(world, active)
    return PlainBoard()
