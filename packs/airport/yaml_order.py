"""The canonical order of an apron definition's own parts in its YAML file (the core's
scenarios_admin.yamlio orders its own keys and asks the pack for these, through
DomainPack.canonical_parts): rule, impact, action and example keys in fixed orders,
condition keys by field order, radius values by the key field's value order and levels
HIGH, MEDIUM, LOW, action arguments in the tool's order."""

from __future__ import annotations

from typing import Any

from aero.packs import action_args
from scenarios_admin.definition import LEVELS, value_order
from scenarios_admin.schema import row_words
from scenarios_admin.yamlio import ordered

RULE_KEYS = ("id", "when", "level", "score")
IMPACT_KEYS = ("start", "radius_key", "radius", "default_radius")
ACTION_KEYS = ("tool", "risk_class", "for_each", "when", "args")
EXAMPLE_KEYS = ("text", "fields", "rule", "level", "actions")


def canonical_parts(definition: dict[str, Any]) -> dict[str, Any]:
    """The apron's parts of a valid definition, each mapping in canonical key order."""
    order = list(definition["field_order"])
    parts: dict[str, Any] = {}
    if "risk_rules" in definition:
        parts["risk_rules"] = [_rule(rule, order) for rule in definition["risk_rules"]]
    if "impact" in definition:
        parts["impact"] = _impact(definition["impact"], definition["fields"])
    if "actions" in definition:
        parts["actions"] = [_action(action, order) for action in definition["actions"]]
    if "examples" in definition:
        parts["examples"] = [_example(example, order) for example in definition["examples"]]
    return parts


def _when(when: dict[str, Any], order: list[str]) -> dict[str, Any]:
    def rank(key: str) -> tuple[int, int, str]:
        name, _, attribute = key.partition(".")
        if name in order:
            return (0, order.index(name) * 2 + (1 if attribute else 0), key)
        if key == "level":
            return (1, 0, key)
        if name == "impact":
            lists = row_words("impact_lists")
            position = lists.index(attribute) if attribute in lists else 99
            return (2, position, key)
        if key == "any":
            return (4, 0, key)
        return (3, 0, key)

    out: dict[str, Any] = {}
    for key in sorted(when, key=rank):
        value = when[key]
        out[key] = [_when(branch, order) for branch in value] if key == "any" else value
    return out


def _rule(rule: dict[str, Any], order: list[str]) -> dict[str, Any]:
    out = ordered(rule, RULE_KEYS)
    if "when" in out:
        out["when"] = _when(out["when"], order)
    return out


def _impact(impact: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    out = ordered(impact, IMPACT_KEYS)
    radius = out.get("radius", {})
    if out.get("radius_key"):
        key_spec = fields.get(out["radius_key"], {})
        values = [v for v in value_order(key_spec) if v in radius]
        values += sorted(v for v in radius if v not in values)
        out["radius"] = {v: ordered(radius[v], LEVELS) for v in values}
    else:
        out["radius"] = ordered(radius, LEVELS)
    return out


def _action(action: dict[str, Any], order: list[str]) -> dict[str, Any]:
    out = ordered(action, ACTION_KEYS)
    if "when" in out:
        out["when"] = _when(out["when"], order)
    if "args" in out:
        out["args"] = ordered(out["args"], action_args(str(action.get("tool", ""))))
    return out


def _example(example: dict[str, Any], order: list[str]) -> dict[str, Any]:
    out = ordered(example, EXAMPLE_KEYS)
    if "fields" in out:
        out["fields"] = ordered(out["fields"], tuple(order))
    return out
