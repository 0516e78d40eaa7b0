"""Every text the agent sends to a model or puts to the operator about grounding, per
language (zh, en). The scenario's own `system_prompt` comes first; these, and the
instructions of the session's pack (the extraction's, the ReAct step's), say what the
call is for. Kept out of the code paths so a wording change is one edit, reviewed here.
"""

from __future__ import annotations

import json
from typing import Any

from aero.packs import pack_for
from diagnosis.agent.reading import reading_of
from scenarios_admin.definition import value_order

LANGUAGES = ("zh", "en")

FIELDS = {"en": "Fields:", "zh": "字段："}

KNOWN_FIELDS = {"en": "Known fields:", "zh": "已知字段："}


# After the explanation of why a required fact is needed: where else it can be given.
CORRECTION_OFFER = {
    "en": " Or enter it with “Correct” under “What is known” when you know.",
    "zh": "也可以在得知后，在“已知信息”中点击该项的“更正”填写。",
}

# A required fact still unknown after its explanation: asked again briefly, not explained
# twice.
STILL_NEEDED = {
    "en": "Still needed before the risk can be assessed: {label}. Answer here, or use "
    "“Correct” under “What is known”, when you know.",
    "zh": "评估风险仍需要：{label}。得知后请在此回答，或在“已知信息”中点击“更正”填写。",
}


ANSWERING = {
    "en": "The operator is answering the question about {field!r}.",
    "zh": "值班员正在回答关于 {field!r} 的问题。",
}

# Put to the operator when a P1 value was read but not grounded (no synonym ties it to the
# text, or its only evidence is a span that already states another field).
CONFIRM = {
    "en": (
        'Please confirm: I read {label} = "{value}" from "{evidence}". Is that right? '
        "Answer yes or no, or tell me the {label_lower}."
    ),
    "zh": (
        "请确认：我从“{evidence}”推断{label}为“{value}”，是否正确？"
        "请回答“是”或“否”，或直接说明{label}。"
    ),
}
CONFIRM_NO_EVIDENCE = {
    "en": (
        'Please confirm: is the {label_lower} "{value}"? You have not said so yet. '
        "Answer yes or no, or tell me the {label_lower}."
    ),
    "zh": ("请确认：{label}是否为“{value}”？您尚未明确说明。请回答“是”或“否”，或直接说明{label}。"),
}

# Put to the operator when a later message states another value for a field already known
# (say from a second tab): shown and confirmed, never silently taken or dropped.
CONFLICT = {
    "en": (
        'You now said {label_lower} "{value}" ("{evidence}"), but it was "{old}". '
        'Change it to "{value}"? Answer yes to change it, no to keep "{old}".'
    ),
    "zh": (
        "您刚才说{label}为“{value}”（“{evidence}”），但之前为“{old}”。"
        "是否改为“{value}”？回答“是”则修改，回答“否”则保留“{old}”。"
    ),
}


def language(lang: str) -> str:
    return lang if lang in LANGUAGES else "en"


def field_schema(definition: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fields as the model sees them, in field order, values in canonical order."""
    schema: dict[str, dict[str, Any]] = {}
    for name in definition["field_order"]:
        spec = definition["fields"][name]
        schema[name] = {"type": spec["type"], "label": spec["label"]["en"]}
        if spec.get("values"):
            schema[name]["values"] = value_order(spec)
    return schema


def extraction_system(definition: dict[str, Any], lang: str, asked: str | None) -> str:
    lang = language(lang)
    parts = [
        definition.get("system_prompt", "").strip(),
        reading_of(definition).instructions[lang],
        FIELDS[lang] + " " + json.dumps(field_schema(definition), ensure_ascii=False),
    ]
    if asked:
        parts.append(ANSWERING[lang].format(field=asked))
    return "\n".join(part for part in parts if part)


def value_label(spec: dict[str, Any], value: Any, lang: str) -> str:
    key = str(value).lower() if isinstance(value, bool) else str(value)
    value_spec = (spec.get("values") or {}).get(key) or {}
    return str((value_spec.get("label") or {}).get(language(lang), value))


def confirmation(spec: dict[str, Any], value: Any, evidence: str, lang: str) -> str:
    """The sentence put before the field's question when its value needs confirming."""
    lang = language(lang)
    label = spec["label"][lang]
    shown = value_label(spec, value, lang)
    template = CONFIRM[lang] if evidence else CONFIRM_NO_EVIDENCE[lang]
    return template.format(label=label, label_lower=label.lower(), value=shown, evidence=evidence)


def conflict(spec: dict[str, Any], value: Any, old: Any, evidence: str, lang: str) -> str:
    lang = language(lang)
    label = spec["label"][lang]
    return CONFLICT[lang].format(
        label=label,
        label_lower=label.lower(),
        value=value_label(spec, value, lang),
        old=value_label(spec, old, lang),
        evidence=evidence,
    )


def react_instructions(definition: dict[str, Any], lang: str) -> str:
    """What a ReAct step tells the model to do with its tools: its pack's words."""
    return pack_for(definition["kind"]).react_prompt.get(language(lang), "")
