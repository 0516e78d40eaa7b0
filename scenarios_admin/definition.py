"""Scenario definitions: the declarative condition language (validation: scenarios_admin.schema).

Conditions never use eval. A `when` mapping holds when every entry holds:
  field: value            equality (enum/bool/text)
  field: [v1, v2]         membership
  field: {not: v | [..]}  known and not equal / not in
  <field>.kind: k         kind of the world's node a field resolves to (its pack's kinds)
  level: HIGH | [..]      the assessed risk level
  impact.<list>: non_empty | empty
  any: [{...}, {...}]     at least one nested mapping holds
A field that is unknown never matches a condition on it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aero.packs import action_tool
from tools.names import SKILL_TOOL_PREFIX

PRIORITIES = ("P1", "P2")
LEVELS = ("HIGH", "MEDIUM", "LOW")
RISK_CLASSES = ("R0", "R1", "R2", "R3")
LANGUAGES = ("zh", "en")


def restriction_of(tool: str, args: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, target) of the restriction this action puts in force, if it puts one (its
    pack declares which: aero.packs.ActionTool.restricts)."""
    declared = action_tool(tool)
    spec = declared.restricts if declared is not None else None
    if spec is None or args.get(spec[1]) in (None, ""):
        return None
    return spec[0], str(args[spec[1]])


# The lowest risk class each action may run with, whatever a scenario says: scenario
# data may raise a class (more approval), never lower it. Validation and publish refuse a
# lower class and the runtime raises it again (for versions published before a floor).
# `lift_restriction` is no scenario tool: it lifts a closure an action put in force.
LIFT_TOOL = "lift_restriction"
# Nor is `continue_budget`: the agent's request for more steps or money when its budget
# ran out (R1: one approver says "go on", nothing outside AERO happens).
BUDGET_TOOL = "continue_budget"
# Nor is an uploaded skill (SKILL_TOOL_PREFIX + its name): one whose manifest raises its
# risk class to R1+ runs only once approved, and nothing outside AERO happens.
# A pack's actions declare their own floors (aero.packs.ActionTool.risk_floor).
RISK_FLOORS: dict[str, str] = {
    LIFT_TOOL: "R2",
    BUDGET_TOOL: "R1",
}


def shown_as_decision(tool: str) -> bool:
    """Whether a call of `tool` is an action the timeline shows as a decision (its pack
    words it plainly, or the lift): lookups and analyses are internal steps."""
    declared = action_tool(tool)
    return tool == LIFT_TOOL or (declared is not None and declared.plain is not None)


def decision_only(tool: str, is_action: bool) -> bool:
    """A call whose approval is all there is (the agent reads the decision): continuing
    past the budget, running an uploaded skill. Approving it sends nothing out."""
    return tool == BUDGET_TOOL or (not is_action and tool.startswith(SKILL_TOOL_PREFIX))


def risk_floor(tool: str) -> str:
    """An action an installed pack declares has its floor there; an unknown tool gets the
    highest class: the policy fails closed."""
    declared = action_tool(tool)
    if declared is not None:
        return declared.risk_floor
    return RISK_FLOORS.get(tool, RISK_CLASSES[-1])


def below_floor(tool: str, risk_class: str) -> bool:
    if risk_class not in RISK_CLASSES:
        return True
    return RISK_CLASSES.index(risk_class) < RISK_CLASSES.index(risk_floor(tool))


def effective_risk_class(tool: str, declared: str) -> str:
    """The declared class, raised to the tool's floor."""
    return risk_floor(tool) if below_floor(tool, declared) else declared


def floor_message(tool: str, declared: str) -> str:
    return (
        f"{tool} needs at least {risk_floor(tool)} (its floor in code), not {declared}: "
        "a scenario may raise an action's risk class, never lower it"
    )


Lookup = Callable[[str], tuple[bool, Any]]
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*)\}")


def evaluate(when: Mapping[str, Any], lookup: Lookup) -> bool:
    for key, expected in when.items():
        if key == "any":
            if not any(evaluate(branch, lookup) for branch in expected):
                return False
            continue
        known, actual = lookup(key)
        if not known:
            return False
        if not _matches(actual, expected):
            return False
    return True


def _matches(actual: Any, expected: Any) -> bool:
    if expected == "non_empty":
        return bool(actual)
    if expected == "empty":
        return not actual
    if isinstance(expected, dict) and "not" in expected:
        return not _matches(actual, expected["not"])
    if isinstance(expected, list):
        return any(_matches(actual, item) for item in expected)
    if isinstance(expected, bool) or isinstance(actual, bool):
        return actual is expected
    return str(actual).upper() == str(expected).upper()


def render_args(template: Mapping[str, str], resolve: Callable[[str], Any]) -> dict[str, str]:
    """Fill `{fields.position}`-style placeholders in action arguments."""
    return {
        name: _PLACEHOLDER.sub(lambda m: _as_text(resolve(m.group(1))), str(text))
        for name, text in template.items()
    }


def _as_text(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return "" if value is None else str(value)


# --- the document's parts (scenarios_admin.schema validates them) ----------------------

# Key orders of a definition's mappings, as its YAML file lists them (scenarios_admin.yamlio):
# the core's top-level keys (a kind's definition model may list its own among them:
# DefinitionBase.key_order) and a field value's.
TOP_KEYS = (
    "slug",
    "name",
    "kind",
    "system_prompt",
    "field_order",
    "fields",
    "report_template",
    "budget",
)
VALUE_KEYS = ("label", "synonyms", "fallback")
# Names the condition language and the action placeholders use for other things.
RESERVED_FIELD_NAMES = ("level", "impact", "any", "item", "risk", "fields")
# Lists an admin types into one box are split on these (see scenarios_admin.draft).
LIST_SEPARATORS = re.compile(r"[,，\n]")


@dataclass(frozen=True)
class Issue:
    """One problem of a definition: where (a path into the document, as in the YAML file:
    `risk_rules[3].when.fluid`) and what is wrong."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def value_order(spec: dict[str, Any]) -> list[str]:
    """A field's values in one stable order wherever they are listed (prompts, hints,
    YAML): PostgreSQL's jsonb does not keep the authored key order, so none is kept."""
    values = list(spec.get("values") or {})
    if spec.get("type") == "bool":
        return [v for v in ("true", "false") if v in values]
    return sorted(values)
