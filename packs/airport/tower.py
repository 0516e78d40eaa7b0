"""The tower message (notify_atc's `message`) in the reader's words.

The message the tower receives is the scenario's template filled with the facts, in the
language the scenario writes it (its `args.message`; English for the shipped ones): that
text is what the outbox sends and the log keeps. A reader sees the same facts composed
from a translated frame: the message is read back against the template that wrote it,
and each fact (a field's value, the risk level, the isolated nodes) is worded in the
reader's language. A message no template wrote (a model's own words) shows as written,
quoted.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from django.utils.translation import get_language, gettext, pgettext

from diagnosis.report_markdown import display_value
from diagnosis.wording import RISK_LABELS, plain

_PLACEHOLDER = re.compile(r"\{([a-z_]+(?:\.[a-z_]+)*)\}")


@functools.lru_cache(maxsize=64)
def _pattern(template: str) -> re.Pattern[str]:
    """The template as a pattern that reads each placeholder's text back."""
    parts: list[str] = []
    names: list[str] = []
    last = 0
    for found in _PLACEHOLDER.finditer(template):
        parts.append(re.escape(template[last : found.start()]))
        group = f"p{len(names)}"
        names.append(found[1])
        parts.append(f"(?P<{group}>.*?)")
        last = found.end()
    parts.append(re.escape(template[last:]))
    return re.compile("^" + "".join(parts) + "$", re.S)


def read_back(template: str, message: str) -> dict[str, str] | None:
    """The placeholders' texts (`fields.position` -> "105") when `template` wrote
    `message`; None when it did not."""
    found = _pattern(template).match(message)
    if found is None:
        return None
    keys = [m[1] for m in _PLACEHOLDER.finditer(template)]
    return {key: found[f"p{n}"] for n, key in enumerate(keys)}


def _language() -> str:
    return "zh" if (get_language() or "").startswith("zh") else "en"


def _fact(definition: dict[str, Any], name: str, text: str, language: str) -> str:
    spec = definition.get("fields", {}).get(name)
    if not spec:
        return text
    value: Any = text
    if spec.get("type") == "bool":
        value = text == "True"
    shown = display_value(spec, value, language) if text else "—"
    return pgettext("tower message fact", "%(label)s %(value)s") % {
        "label": spec["label"][language],
        "value": shown,
    }


def compose(found: dict[str, str], definition: dict[str, Any]) -> str:
    """The facts read back from a message, in the reader's words."""
    language = _language()
    sep = pgettext("list separator", ", ")
    facts, tail = [], []
    for key, text in found.items():
        kind, _, name = key.partition(".")
        if kind == "fields":
            facts.append(_fact(definition, name, text, language))
        elif key == "risk.level":
            rule = found.get("risk.rule", "")
            level = plain(RISK_LABELS, text)
            tail.append(
                gettext("risk %(level)s (rule %(rule)s)") % {"level": level, "rule": rule}
                if rule
                else gettext("risk %(level)s") % {"level": level}
            )
        elif key == "impact.isolated_nodes":
            nodes = sep.join(n for n in text.split(", ") if n) or "—"
            tail.append(gettext("isolate %(nodes)s") % {"nodes": nodes})
        elif key != "risk.rule":
            facts.append(text)
    name = (definition.get("name") or {}).get(language) or definition.get("slug", "")
    parts = [gettext("%(scenario)s: %(facts)s") % {"scenario": name, "facts": sep.join(facts)}]
    return pgettext("tower message", "; ").join(parts + tail)


def message_words(message: Any, definition: dict[str, Any] | None) -> str:
    """notify_atc's message in the reader's words: composed from its facts when one of
    the scenario's templates wrote it; otherwise quoted as written."""
    text = str(message)
    for spec in (definition or {}).get("actions", []):
        template = (spec.get("args") or {}).get("message") if spec.get("tool") else None
        if spec.get("tool") == "notify_atc" and isinstance(template, str):
            found = read_back(template, text)
            if found is not None:
                return compose(found, definition or {})
    return f"“{text}”"


def value_words(name: str, value: Any, definition: Any) -> str:
    """An airport action's argument in words: the tower message composed; a stand, a
    runway or a flight as written (names on the airport's map)."""
    if name == "message":
        return message_words(value, definition if isinstance(definition, dict) else None)
    return str(value)
