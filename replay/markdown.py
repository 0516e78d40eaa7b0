"""Markdown for the export: the shared escaping of user and model text lives in
diagnosis.reporting (md_cell: what was typed is what shows, one line, no link, no table
break); this module adds what the export needs on top of it."""

from __future__ import annotations

from typing import Any

from diagnosis.reporting import md_cell as escape_inline


def md_text(value: Any) -> str:
    """Inline text on one line, every Markdown construct escaped."""
    return escape_inline("" if value is None else value)


def md_cell(value: Any) -> str:
    """A table cell: like md_text, and never empty (an empty cell reads as a missing one)."""
    return md_text(value) or "—"


def md_block(value: Any) -> str:
    """Verbatim text as an indented code block: every line is indented, so no content can
    end the block early (a fence could be closed by the text inside it)."""
    text = "" if value is None else str(value)
    return "\n".join("    " + line for line in text.rstrip().splitlines())
