"""Markdown escaping for text that users or the model wrote.

LOCAL COPY: sec-render adds a shared escaping helper to diagnosis/reporting.py; switch to
it once merged (the rules are the same: every Markdown metacharacter is backslash-escaped
and raw HTML cannot open, so a reason like `[x](javascript:alert(1))` stays text and a
`|` never splits a table cell)."""

from __future__ import annotations

import re
from typing import Any

# CommonMark: any ASCII punctuation may be backslash-escaped; these are the ones that
# start or end an inline construct, a block, or a table cell.
_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|>])")
# `<` and `&` as entities: Python-Markdown does not take them backslash-escaped.
_ENTITIES = {"&": "&amp;", "<": "&lt;"}


def md_text(value: Any) -> str:
    """Inline text: one line, every metacharacter escaped."""
    text = "" if value is None else str(value)
    text = " ".join(text.split())  # no newline may start a block inside a line or cell
    text = "".join(_ENTITIES.get(ch, ch) for ch in text)
    return _SPECIAL.sub(r"\\\1", text)


def md_cell(value: Any) -> str:
    """A table cell: like md_text, and never empty (an empty cell reads as a missing one)."""
    return md_text(value) or "—"


def md_block(value: Any) -> str:
    """Verbatim text as an indented code block: every line is indented, so no content can
    end the block early (a fence could be closed by the text inside it)."""
    text = "" if value is None else str(value)
    return "\n".join("    " + line for line in text.rstrip().splitlines())
