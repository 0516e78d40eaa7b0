"""Escaping filters for the Markdown export template (which has autoescape off)."""

from __future__ import annotations

from typing import Any

from django import template

from replay.markdown import md_block, md_cell, md_text

register = template.Library()
register.filter("md_text", md_text)
register.filter("md_cell", md_cell)
register.filter("md_block", md_block)


@register.filter
def md_args(value: Any) -> str:
    """Tool arguments or results as `k=v; …` text (a result's summary when it has one; the
    masked marker as it is)."""
    if isinstance(value, dict) and value.get("summary"):
        return md_cell(value["summary"])
    if isinstance(value, dict):
        return md_cell("; ".join(f"{k}={v}" for k, v in value.items()))
    return md_cell(value)
