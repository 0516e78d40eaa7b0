"""What a proposed action means, in plain words, with its consequence on the world as it
is now: the pack's board (its world plus the restrictions in force, from its page world:
diagnosis.presenters.PageWorld) says it. Deterministic, no LLM; computed when shown,
so it always reflects the current board.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from django.utils.translation import gettext_lazy

from aero.packs import action_tool
from diagnosis.wording import TOOL_LABELS, plain


@dataclass(frozen=True)
class Consequence:
    plain: str
    consequence: str
    warn: bool  # the pack's board warns of it
    in_force: Any  # the same restriction already on the board
    own: bool = False  # put there by the session the action belongs to


def _translated(tool: str) -> str:
    """Plain words per action tool, as its pack declares them (the core's own here, and
    the lift's as the pack registers them); %(...)s are the call's arguments."""
    declared = action_tool(tool)
    if declared is not None and declared.plain is not None:
        return str(declared.plain)
    if tool in PLAIN_WORDS:
        return str(PLAIN_WORDS[tool])
    # An action without plain words of its own (the IT pack's fixes): its tool's words,
    # not its code; the card beside it lists the arguments.
    return plain(TOOL_LABELS, tool)


# Plain words of the actions no pack declares as its own (the budget's, and the lift's
# that a pack whose restrictions it lifts registers): tool -> lazy text.
PLAIN_WORDS: dict[str, Any] = {
    "continue_budget": gettext_lazy("Let the agent ask the model again"),
}


def register_plain_words(words: dict[str, Any]) -> None:
    """A domain pack's plain words of a core action (from its AppConfig.ready())."""
    for tool, text in words.items():
        PLAIN_WORDS.setdefault(tool, text)


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
