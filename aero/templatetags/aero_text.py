"""Filters every page uses (a template builtin, see TEMPLATES in settings)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.translation import pgettext

from aero.audit_words import action_words, actor_words, detail_rows

register = template.Library()


@register.filter
def when(value: datetime | None) -> str:
    """A moment with its date and zone in the airport's time (TIME_ZONE), as the
    reports write it: "2026-11-24 08:15:03 CST". The layout is a translation, so a
    language may order it its own way; the zone is always shown because operators and
    the report compare times across shifts and systems."""
    if not value:
        return ""
    return date_format(
        timezone.localtime(value), pgettext("date, time and zone format", "Y-m-d H:i:s T")
    )


@register.filter
def when_date(value: datetime | None) -> str:
    """Only the day, in the airport's time."""
    if not value:
        return ""
    return date_format(timezone.localtime(value), pgettext("date format", "Y-m-d"))


@register.filter
def role_label(role: str) -> str:
    """A role's name in the interface language (the group keeps its code name)."""
    from aero.roles import ROLE_LABELS

    return str(ROLE_LABELS.get(role, role))


@register.filter
def scenario_name(scenario: object) -> str:
    """A scenario's own name in the interface language (scenarios carry both)."""
    from django.utils.translation import get_language

    zh = (get_language() or "").startswith("zh")
    name_zh, name_en = getattr(scenario, "name_zh", ""), getattr(scenario, "name_en", "")
    return str((name_zh if zh else name_en) or name_en or name_zh)


@register.filter
def audit_action(code: str) -> str:
    """An audit entry's action in words (its code in the tooltip)."""
    return action_words(str(code))


@register.filter
def audit_actor(label: str) -> str:
    """Who made an audit entry: a username, or the system's part in words."""
    return actor_words(str(label))


@register.filter
def audit_detail(detail: Any) -> list[dict[str, Any]]:
    """An audit entry's details, each name and value in words where AERO words them."""
    return detail_rows(detail)
