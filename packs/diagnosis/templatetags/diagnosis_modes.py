"""The run modes' words in templates: a mode's, a mode source's, a specialist's name
and a switch's reason, in the active language (packs.diagnosis.modes)."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.translation import pgettext

from diagnosis.wording import TOOL_LABELS, agent_words, plain
from packs.diagnosis import modes, words

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


@register.filter
def hypothesis_label(code: str) -> str:
    return words.label(words.HYPOTHESIS_LABELS, code)


@register.filter
def condition_labels(codes: Any) -> str:
    """A finding's conditions in words, joined by the language's list separator."""
    return pgettext("list separator", ", ").join(
        words.label(words.CONDITION_LABELS, c) for c in codes or []
    )


@register.filter
def source_labels(codes: Any) -> str:
    return pgettext("list separator", ", ").join(
        words.label(words.SOURCE_LABELS, c) for c in codes or []
    )


@register.filter
def strategy_label(code: str) -> str:
    return words.label(words.STRATEGY_LABELS, code)


@register.filter
def evidence_summary(item: dict[str, Any]) -> str:
    """An evidence call's result in the reader's words (the logged summary in a tooltip)."""
    return words.evidence_summary(str(item.get("tool", "")), item.get("result"))


@register.filter
def problem_type_label(code: str) -> str:
    """A problem type in the reader's words, from the playbook's own zh/en labels."""
    return words.problem_type_label(str(code))


@register.filter
def tool_labels(codes: Any) -> str:
    """Tools in words, joined by the language's list separator."""
    return pgettext("list separator", ", ").join(plain(TOOL_LABELS, c) for c in codes or [])


@register.filter
def step_labels(codes: Any) -> str:
    """The graph's steps (or tools) still to come, in words."""
    return pgettext("list separator", ", ").join(
        plain(TOOL_LABELS, c) if str(c) in TOOL_LABELS else agent_words(c) for c in codes or []
    )


@register.filter
def metric_label(code: str) -> str:
    return words.label(words.METRIC_LABELS, code)


@register.filter
def service_kind_label(code: str) -> str:
    return words.label(words.KIND_LABELS, code)
