"""The apron scenario definition: the envelope every kind shares (scenarios_admin.schema)
plus what an apron emergency needs: position and flight fields, risk rules in the
condition language (scenarios_admin.definition), the spread of the impact over the
airport graph, the response actions and the six compliance states."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, ValidationInfo

from packs.airport.actions import ACTION_ARGS
from scenarios_admin.conditions import value_is_representable
from scenarios_admin.definition import LEVELS, RISK_CLASSES, below_floor, floor_message
from scenarios_admin.schema import DefinitionBase, FieldSpec
from scenarios_admin.validation import (
    OneOf,
    Part,
    Problems,
    Text,
    also,
    document,
    document_fields,
    fail,
    is_number,
    is_text,
    shape,
    spec_of,
    values_of,
)

# The apron's own field types (besides enum, bool, text and number), with the row
# editor's labels: a flight number, and a position resolved to a node of the graph.
OWN_FIELD_TYPES = {"flight_no": "flight number", "position": "position (airport node)"}
FIELD_TYPES = (*OWN_FIELD_TYPES, *FieldSpec.field_types)
# What the impact analysis lists (the BFS over the airport graph, packs.airport.graph).
IMPACT_LISTS = ("isolated_nodes", "taxiways", "runways", "stands", "flights")
NODE_KINDS = ("stand", "taxiway", "runway")
# The compliance state machine has six positional states (diagnosis.agent.fsm): collecting,
# all P1 fields known, risk assessed, impact analysed, actions decided, reported.
COMPLIANCE_STEPS = 6

_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*)\}")
_LEVEL = OneOf(LEVELS, f"{{value}} is not one of {', '.join(LEVELS)}")
_FOR_EACH = tuple(f"impact.{name}" for name in IMPACT_LISTS)


class ApronFieldSpec(FieldSpec):
    field_types: ClassVar[tuple[str, ...]] = FIELD_TYPES

    # Position fields: the airport node kinds a value may resolve to (none: all).
    kinds: Annotated[
        list[Annotated[str, OneOf(NODE_KINDS, "{value} is not a node kind")]] | None,
        shape(list, f"must list node kinds ({', '.join(NODE_KINDS)})", non_empty=True),
    ] = None

    @classmethod
    def check(cls, data: dict[str, Any], problems: Problems, info: ValidationInfo) -> None:
        super().check(data, problems, info)
        kinds = data.get("kinds")
        if "kinds" in data and data.get("type") != "position":
            problems.add(("kinds",), "only position fields have kinds")
        elif isinstance(kinds, list) and len(set(map(str, kinds))) != len(kinds):
            problems.add(("kinds",), "a kind is listed twice")


# --- conditions ------------------------------------------------------------------------------


def conditions(*, allow_level: bool, allow_impact: bool) -> BeforeValidator:
    """A `when` mapping of the condition language, checked against the document's fields."""

    def validate(value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, dict):
            fail("must be a mapping")
        problems = Problems()
        _Conditions(problems, document_fields(info), allow_level, allow_impact).mapping(value, ())
        problems.raise_if_any()
        return value

    return BeforeValidator(validate)


class _Conditions:
    def __init__(
        self,
        problems: Problems,
        fields: dict[str, Any] | None,
        allow_level: bool,
        allow_impact: bool,
    ) -> None:
        self.problems = problems
        self.fields = fields
        self.allow_level = allow_level
        self.allow_impact = allow_impact

    def mapping(self, when: dict[str, Any], loc: tuple[str | int, ...]) -> None:
        for key, value in when.items():
            if key != "any":
                self.condition(str(key), value, (*loc, key))
                continue
            if not isinstance(value, list) or not value:
                self.problems.add((*loc, "any"), "must be a non-empty list")
                continue
            for i, branch in enumerate(value):
                if not isinstance(branch, dict):
                    self.problems.add((*loc, "any", i), "must be a mapping")
                elif not branch:
                    self.problems.add((*loc, "any", i), "an OR branch needs at least one condition")
                else:
                    self.mapping(branch, (*loc, "any", i))

    def condition(self, key: str, value: Any, loc: tuple[str | int, ...]) -> None:
        add = self.problems.add
        negated = isinstance(value, dict)
        if negated:
            if set(value) != {"not"}:
                add(loc, "a mapping here must be {not: value}")
                return
            value = value["not"]
        candidates = value if isinstance(value, list) else [value]
        if not candidates:
            add(loc, "name at least one value")
            return
        for candidate in candidates:
            if isinstance(candidate, bool):
                continue
            if not isinstance(candidate, str):
                add(loc, f"{candidate!r}: a condition compares with text or true/false")
                return
            if not value_is_representable(candidate):
                add(
                    loc,
                    f"{candidate!r} cannot be a condition value (no commas, '|', parentheses, "
                    "'or'/'and' words or surrounding spaces)",
                )
                return
        if key == "level":
            if not self.allow_level:
                add(loc, "risk rules cannot depend on the level they assign")
                return
            for v in candidates:
                if v not in LEVELS:
                    add(loc, f"{v!r} is not a risk level ({', '.join(LEVELS)})")
            return
        if key.startswith("impact."):
            if not self.allow_impact:
                add(loc, "impact is not known when risk is assessed")
            elif key[len("impact.") :] not in IMPACT_LISTS:
                add(loc, f"unknown impact list (one of {', '.join(IMPACT_LISTS)})")
            elif negated or len(candidates) != 1 or candidates[0] not in ("non_empty", "empty"):
                add(loc, "must be non_empty or empty")
            return
        if self.fields is None:
            return
        field_name, _, attribute = key.partition(".")
        if field_name not in self.fields:
            add(loc, f"unknown field {field_name!r}")
            return
        spec = spec_of(self.fields, field_name)
        if attribute:
            if attribute != "kind" or spec.get("type") != "position":
                add(loc, "only position fields have .kind")
                return
            for k in candidates:
                if k not in NODE_KINDS:
                    add(loc, f"{k!r} is not a node kind ({', '.join(NODE_KINDS)})")
            return
        if spec.get("type") == "bool":
            for c in candidates:
                if not isinstance(c, bool):
                    add(loc, f"{c!r} is not true or false")
        elif spec.get("type") == "enum":
            allowed = values_of(spec)
            for c in candidates:
                if c not in allowed:
                    add(loc, f"{c!r} is not one of {', '.join(map(str, allowed))}")


# --- risk rules -------------------------------------------------------------------------------


def _score(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        fail("must be an integer from 0 to 100")
    return value


class RiskRule(Part):
    id: Text
    when: Annotated[dict[str, Any], conditions(allow_level=False, allow_impact=False)] = {}
    level: Annotated[str, _LEVEL]
    score: Annotated[int, BeforeValidator(_score)]


def _rules(rules: Any, problems: Problems, info: ValidationInfo) -> None:
    """Duplicate ids, and rules no incident can reach (first match wins)."""
    seen: set[str] = set()
    earlier: list[tuple[str, dict[str, Any]]] = []
    unconditional: str | None = None
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        rule_id = rule.get("id")
        if is_text(rule_id) and rule_id in seen:
            problems.add((i, "id"), f"duplicate rule id {rule_id!r}")
        rule_name = str(rule_id) if is_text(rule_id) else f"#{i + 1}"
        seen.add(rule_name)
        condition = rule.get("when", {})
        if unconditional is not None:
            problems.add((i,), f"unreachable: rule {unconditional!r} before it always matches")
        elif isinstance(condition, dict):
            for other_id, other in earlier:
                if other and _shadows(other, condition):
                    problems.add(
                        (i,),
                        f"unreachable: rule {other_id!r} before it matches whenever this one does",
                    )
                    break
            earlier.append((rule_name, condition))
            if condition == {}:
                unconditional = rule_name
    if unconditional is None:
        problems.add(
            (), "the last rule must be unconditional (when: {}) so every incident gets a level"
        )


def _shadows(earlier: dict[str, Any], later: dict[str, Any]) -> bool:
    """Whether `earlier` holds whenever `later` does (so `later` is never reached). Only
    plain values and lists are compared; anything else is assumed not to shadow."""
    for key, expected in earlier.items():
        if key == "any" or key not in later:
            return False
        allowed, needed = _plain(expected), _plain(later[key])
        if allowed is None or needed is None or not needed <= allowed:
            return False
    return True


def _plain(expected: Any) -> frozenset[tuple[str, Any]] | None:
    if isinstance(expected, dict):
        return None
    items = expected if isinstance(expected, list) else [expected]
    plain: set[tuple[str, Any]] = set()
    for item in items:
        if isinstance(item, bool):
            plain.add(("bool", item))
        elif isinstance(item, str):
            plain.add(("text", item.upper()))
        else:
            return None
    return frozenset(plain)


def rule_levels(definition: dict[str, Any]) -> dict[str, str]:
    """Rule id -> the level it assigns, from the raw document (first of a duplicate id)."""
    levels: dict[str, str] = {}
    rules = definition.get("risk_rules")
    for i, rule in enumerate(rules if isinstance(rules, list) else []):
        if isinstance(rule, dict):
            rule_id = rule.get("id")
            name = str(rule_id) if is_text(rule_id) else f"#{i + 1}"
            levels.setdefault(name, str(rule.get("level")))
    return levels


# --- impact ---------------------------------------------------------------------------------


def _non_negative(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail("must be a non-negative integer")
    return value


class Impact(Part):
    """Where the spread over the airport graph starts and how far it goes (hops), by risk
    level, optionally per value of an enum field."""

    start: str
    radius_key: str | None = None
    radius: dict[str, Any] = {}
    default_radius: Annotated[int, BeforeValidator(_non_negative)] = 1

    @classmethod
    def check(cls, data: dict[str, Any], problems: Problems, info: ValidationInfo) -> None:
        fields = document_fields(info)
        if fields is None:
            return
        start = data.get("start")
        if spec_of(fields, start).get("type") != "position":
            problems.add(("start",), f"{start!r} is not a position field")
        key_field = data.get("radius_key")
        radius = data.get("radius", {})
        if key_field is None:
            _radius(radius, ("radius",), problems)
            return
        key_spec = spec_of(fields, key_field)
        if key_spec.get("type") != "enum":
            problems.add(("radius_key",), f"{key_field!r} is not an enum field")
            key_spec = {}
        if not isinstance(radius, dict):
            problems.add(("radius",), "must map values of the key field to hop counts")
            return
        allowed = values_of(key_spec)
        for value, by_level in radius.items():
            if allowed and value not in allowed:
                problems.add(("radius", value), f"not a value of {key_field}")
            _radius(by_level, ("radius", value), problems)


def _radius(by_level: Any, loc: tuple[str | int, ...], problems: Problems) -> None:
    if not isinstance(by_level, dict):
        problems.add(loc, "must map risk levels to hop counts")
        return
    for level, hops in by_level.items():
        if level not in LEVELS:
            problems.add((*loc, level), f"not a risk level ({', '.join(LEVELS)})")
        if isinstance(hops, bool) or not isinstance(hops, int) or hops < 0:
            problems.add((*loc, level), "must be a non-negative integer")


# --- actions --------------------------------------------------------------------------------


class Action(Part):
    tool: Annotated[
        str,
        OneOf(
            tuple(sorted(ACTION_ARGS)),
            f"{{value}} is not a known action tool ({', '.join(sorted(ACTION_ARGS))})",
        ),
    ]
    risk_class: Annotated[str, OneOf(RISK_CLASSES, "{value} is not one of R0-R3")]
    for_each: (
        Annotated[str, OneOf(_FOR_EACH, f"{{value}} is not one of {', '.join(_FOR_EACH)}")] | None
    ) = None
    when: Annotated[dict[str, Any], conditions(allow_level=True, allow_impact=True)] = {}
    args: Annotated[dict[str, str], shape(dict, "must map argument names to texts")] = {}

    @classmethod
    def check(cls, data: dict[str, Any], problems: Problems, info: ValidationInfo) -> None:
        tool = data.get("tool")
        tool = tool if isinstance(tool, str) and tool in ACTION_ARGS else None
        risk_class = data.get("risk_class")
        valid_class = isinstance(risk_class, str) and risk_class in RISK_CLASSES
        if tool and valid_class and below_floor(tool, str(risk_class)):
            problems.add(("risk_class",), floor_message(tool, str(risk_class)))
        args = data.get("args", {})
        if not isinstance(args, dict):
            return
        if tool:
            for arg in ACTION_ARGS[tool]:
                if arg not in args:
                    problems.add(("args", arg), f"required by {tool}")
            for arg in args:
                if arg not in ACTION_ARGS[tool]:
                    problems.add(("args", arg), f"{tool} takes no such argument")
        fields = document_fields(info)
        for arg, text in args.items():
            if not isinstance(text, str):
                continue
            if "\n" in text:
                problems.add(("args", arg), "must be one line")
            for placeholder in _PLACEHOLDER.findall(text):
                if not _placeholder_known(placeholder, fields, data.get("for_each") is not None):
                    problems.add(("args", arg), f"unknown placeholder {{{placeholder}}}")


def _placeholder_known(placeholder: str, fields: dict[str, Any] | None, has_item: bool) -> bool:
    head, _, rest = placeholder.partition(".")
    if head == "item":
        return has_item and not rest
    if head == "fields":
        return fields is None or rest in fields  # unreadable fields are reported themselves
    if head == "risk":
        return rest in ("level", "score", "rule")
    if head == "impact":
        return rest in IMPACT_LISTS or rest in ("radius", "start")
    return False


def action_tools(definition: dict[str, Any]) -> set[str]:
    """The known action tools the raw document's actions use."""
    actions = definition.get("actions")
    return {
        action["tool"]
        for action in (actions if isinstance(actions, list) else [])
        if isinstance(action, dict)
        and isinstance(action.get("tool"), str)
        and action["tool"] in ACTION_ARGS
    }


# --- compliance and examples ------------------------------------------------------------------


def _states(value: Any) -> Any:
    if (
        not isinstance(value, list)
        or len(value) != COMPLIANCE_STEPS
        or not all(is_text(s) and s == s.strip() for s in value)
        or len(set(value)) != len(value)
    ):
        fail(
            f"must name exactly {COMPLIANCE_STEPS} distinct states, in order: start, "
            "all P1 fields known, risk assessed, impact analysed, actions decided, reported"
        )
    return value


class Compliance(Part):
    """The names of the compliance state machine's six positional states
    (packs.airport.agent.fsm)."""

    states: Annotated[list[str], BeforeValidator(_states)]


class Example(Part):
    """A whole incident in the reporter's words and what the scenario must make of it:
    the scenario's self-check before publishing."""

    text: Text
    fields: Annotated[dict[str, Any], shape(dict, "must map field names to the values expected")]
    rule: str
    level: Annotated[str, _LEVEL]
    actions: Annotated[list[str], shape(list, "must list the action tools expected, in order")]

    @classmethod
    def check(cls, data: dict[str, Any], problems: Problems, info: ValidationInfo) -> None:
        definition = document(info)
        expected = data.get("fields")
        fields = document_fields(info)
        if isinstance(expected, dict) and fields is not None:
            _expected_fields(expected, fields, problems)
        rules = rule_levels(definition)
        rule, level = data.get("rule"), data.get("level")
        if isinstance(rule, str) and rule not in rules:
            problems.add(("rule",), f"{rule!r} is not a risk rule of this scenario")
        elif isinstance(rule, str) and level in LEVELS and rules[rule] != level:
            problems.add(("level",), f"rule {rule} assigns {rules[rule]}, not {level}")
        tools = action_tools(definition)
        expected_tools = data.get("actions")
        for j, tool in enumerate(expected_tools if isinstance(expected_tools, list) else []):
            if isinstance(tool, str) and tool not in tools:
                problems.add(("actions", j), f"{tool!r} is not an action of this scenario")


def _expected_fields(expected: dict[str, Any], fields: dict[str, Any], problems: Problems) -> None:
    for name, value in expected.items():
        if not isinstance(fields.get(name), dict):
            problems.add(("fields", name), f"unknown field {name!r}")
            continue
        spec = fields[name]
        field_type = spec.get("type")
        if field_type == "bool":
            ok = isinstance(value, bool)
        elif field_type == "number":
            ok = is_number(value)
        else:
            ok = is_text(value) and value == value.strip() and not re.search("[,=]", value)
        if not ok:
            problems.add(("fields", name), f"{value!r} is not a {field_type} value")
        elif field_type == "enum" and value not in values_of(spec):
            allowed = ", ".join(map(str, values_of(spec)))
            problems.add(("fields", name), f"{value!r} is not one of {allowed}")
    for name, spec in fields.items():
        if isinstance(spec, dict) and spec.get("priority") == "P1" and name not in expected:
            problems.add(
                ("fields",), f"the P1 field {name} is missing: an example is a whole incident"
            )


class ApronDefinition(DefinitionBase[ApronFieldSpec]):
    """A scenario of kind apron (the airport pack)."""

    kind: Literal["apron"]
    own_field_types = OWN_FIELD_TYPES
    impact_lists = IMPACT_LISTS
    node_kinds = NODE_KINDS
    key_order = (
        "slug",
        "name",
        "kind",
        "system_prompt",
        "field_order",
        "fields",
        "risk_rules",
        "impact",
        "actions",
        "compliance",
        "report_template",
        "examples",
        "budget",
    )
    risk_rules: Annotated[
        list[RiskRule], also(_rules), shape(list, "must be a non-empty list", non_empty=True)
    ]
    impact: Impact
    actions: Annotated[list[Action], shape(list, "must be a non-empty list", non_empty=True)]
    compliance: Compliance
    examples: Annotated[list[Example], shape(list, "must be a list")] = []
