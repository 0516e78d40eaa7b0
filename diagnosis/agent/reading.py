"""What the core knows of reading the reporter's words, whatever the domain: the
language of a text, where a word occurs in it, and the shapes a reading takes (a
field's value with its evidence; a model's claim with its quote). How a domain reads
its fields is its pack's (`aero.packs.Reading`), chosen by the scenario's kind."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from aero.packs import Reading, pack_for

CJK = re.compile(r"[\u3400-\u9fff]")


@dataclass(frozen=True)
class Extraction:
    value: Any
    evidence: str
    # Where the evidence is in the text (None for answers, defaults, confirmations).
    span: tuple[int, int] | None = None
    # False: a reading without evidence of its own, to be confirmed by the operator.
    confirmed: bool = True
    # A model's value that these words contradict: dropped, and the log says so
    # (grounding: the reporter's words win over a model's guess).
    dropped: Any = None


@dataclass(frozen=True)
class Claim:
    """What a model says about one field: the value and the words it says state it."""

    value: Any
    quote: str


def detect_language(text: str) -> str:
    return "zh" if CJK.search(text) else "en"


def occurrences(haystack: str, needle: str) -> list[int]:
    """Where `needle` starts in `haystack` (both lower case): Latin words stand as whole
    words, Chinese ones match anywhere."""
    if not needle:
        return []
    if CJK.search(needle):
        pattern = re.escape(needle)
    else:
        pattern = r"(?<![a-z0-9])" + re.escape(needle) + r"(?![a-z0-9])"
    return [m.start() for m in re.finditer(pattern, haystack)]


def reading_of(definition: dict[str, Any]) -> Reading:
    """How the pack of this definition's kind reads the reporter's words."""
    reading = pack_for(definition["kind"]).reading
    if reading is None:
        raise LookupError(f"the {definition['kind']} pack reads no reporter's words")
    return reading
