"""The run modes' words in templates: a mode's, a mode source's, a specialist's name
and a switch's reason, in the active language (packs.diagnosis.modes)."""

from __future__ import annotations

from typing import Any

from django import template

from packs.diagnosis import modes

register = template.Library()


@register.filter
def mode_label(mode: str) -> str:
    return modes.mode_label(mode)


@register.filter
def mode_source_label(source: str) -> str:
    return str(modes.SOURCE_LABELS.get(source, source))


@register.filter
def specialist_label(name: str) -> str:
    return str(modes.SPECIALIST_LABELS.get(name, name))


@register.filter
def switch_reason(payload: dict[str, Any]) -> str:
    return modes.switch_reason(payload)
