"""Scenario definitions: the declarative condition language and structural validation.

Conditions never use eval. A `when` mapping holds when every entry holds:
  field: value            equality (enum/bool/text)
  field: [v1, v2]         membership
  field: {not: v | [..]}  known and not equal / not in
  <field>.kind: stand     kind of the airport node a position field resolves to
  level: HIGH | [..]      the assessed risk level
  impact.<list>: non_empty | empty
  any: [{...}, {...}]     at least one nested mapping holds
A field that is unknown never matches a condition on it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from django.template import Engine, TemplateSyntaxError

from scenarios_admin.conditions import value_is_representable

FIELD_TYPES = ("flight_no", "position", "enum", "bool", "text", "number")
PRIORITIES = ("P1", "P2")
LEVELS = ("HIGH", "MEDIUM", "LOW")
RISK_CLASSES = ("R0", "R1", "R2", "R3")
IMPACT_LISTS = ("isolated_nodes", "taxiways", "runways", "stands", "flights")
LANGUAGES = ("zh", "en")
NODE_KINDS = ("stand", "taxiway", "runway")

# Response action tools the runtime implements, with their argument names. The scenario
# validator and the diagnosis tool registry share this catalogue.
ACTION_TOOLS: dict[str, tuple[str, ...]] = {
    "notify_atc": ("message",),
    "dispatch_cleanup_crew": ("position",),
    "request_fire_standby": ("position",),
    "suspend_stand_operations": ("stand",),
    "close_taxiway": ("taxiway",),
    "close_runway": ("runway",),
    "runway_inspection": ("runway",),
    "fod_sweep": ("position",),
    "tow_aircraft": ("flight_no", "position"),
}

# Actions whose effect is a restriction on the airport board: tool -> (restriction kind,
# the argument naming its target). The board, the to-dos and the consequence texts read it.
RESTRICTING_TOOLS: dict[str, tuple[str, str]] = {
    "suspend_stand_operations": ("stand", "stand"),
    "close_taxiway": ("taxiway", "taxiway"),
    "close_runway": ("runway", "runway"),
}


def restriction_of(tool: str, args: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, target) of the restriction this action puts in force, if it puts one."""
    spec = RESTRICTING_TOOLS.get(tool)
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
RISK_FLOORS: dict[str, str] = {
    "notify_atc": "R0",
    "dispatch_cleanup_crew": "R1",
    "request_fire_standby": "R1",
    "runway_inspection": "R1",
    "fod_sweep": "R1",
    "tow_aircraft": "R1",
    "suspend_stand_operations": "R2",
    "close_taxiway": "R2",
    "close_runway": "R3",
    LIFT_TOOL: "R2",
    BUDGET_TOOL: "R1",
}


def risk_floor(tool: str) -> str:
    """An unknown tool gets the highest class: the policy fails closed."""
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


# --- validation ---------------------------------------------------------------------

TOP_KEYS = (
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
REQUIRED_TOP_KEYS = tuple(k for k in TOP_KEYS if k not in ("system_prompt", "examples", "budget"))
# A session's model budget (all optional; none set = unlimited): reasoning steps that ask
# the model, tokens in + out, and cost in the providers' currency.
BUDGET_KEYS = ("steps", "tokens", "cost")
FIELD_KEYS = ("label", "type", "priority", "ask", "kinds", "values", "default", "measure")
VALUE_KEYS = ("label", "synonyms", "fallback")
MEASURE_KEYS = ("units", "bands")
BAND_KEYS = ("above", "at_least", "value")
RULE_KEYS = ("id", "when", "level", "score")
IMPACT_KEYS = ("start", "radius_key", "radius", "default_radius")
ACTION_KEYS = ("tool", "risk_class", "for_each", "when", "args")
EXAMPLE_KEYS = ("text", "fields", "rule", "level", "actions")
SCENARIO_KINDS = ("apron", "diagnosis")
# The compliance state machine has six positional states (diagnosis.agent.fsm): collecting,
# all P1 fields known, risk assessed, impact analysed, actions decided, reported.
COMPLIANCE_STEPS = 6
# Names the condition language and the action placeholders use for other things.
RESERVED_FIELD_NAMES = ("level", "impact", "any", "item", "risk", "fields")
_FIELD_NAME = re.compile(r"[a-z][a-z0-9_]*")
_VALUE_NAME = re.compile(r"[A-Za-z0-9_]+")
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


def validate_definition(data: Any) -> list[str]:
    """Every problem, each as "path: message"; empty = valid."""
    return [str(issue) for issue in definition_issues(data)]


def definition_issues(data: Any) -> list[Issue]:
    checker = _Checker()
    checker.run(data)
    return checker.issues


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def value_order(spec: dict[str, Any]) -> list[str]:
    """A field's values in one stable order wherever they are listed (prompts, hints,
    YAML): PostgreSQL's jsonb does not keep the authored key order, so none is kept."""
    values = list(spec.get("values") or {})
    if spec.get("type") == "bool":
        return [v for v in ("true", "false") if v in values]
    return sorted(values)


def _values_of(spec: Any) -> dict[str, Any]:
    values = spec.get("values") if isinstance(spec, dict) else None
    return values if isinstance(values, dict) else {}


def _known(value: Any, names: Collection[str]) -> bool:
    return isinstance(value, str) and value in names


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Checker:
    def __init__(self) -> None:
        self.issues: list[Issue] = []
        self.fields: dict[str, Any] = {}

    def add(self, path: str, message: str) -> None:
        self.issues.append(Issue(path, message))

    def mapping(self, value: Any, path: str, keys: tuple[str, ...]) -> bool:
        """Whether `value` is a mapping; reports keys that are not in `keys`."""
        if not isinstance(value, dict):
            self.add(path, "must be a mapping")
            return False
        for key in value:
            if key not in keys:
                prefix = f"{path}." if path else ""
                self.add(f"{prefix}{key}", f"unknown key (allowed: {', '.join(keys)})")
        return True

    def texts(self, value: Any, path: str, *, required: bool) -> None:
        """A {zh, en} pair of texts."""
        if value is None and not required:
            return
        if not self.mapping(value, path, LANGUAGES):
            return
        for lang in LANGUAGES:
            text = value.get(lang)
            if text is None and not required:
                continue
            if not isinstance(text, str):
                self.add(f"{path}.{lang}", "required" if text is None else "must be text")
            elif required and not text.strip():
                self.add(f"{path}.{lang}", "required")

    def word_list(self, value: Any, path: str, *, what: str) -> None:
        if not isinstance(value, list):
            self.add(path, f"must be a list of {what}")
            return
        for i, item in enumerate(value):
            if not _is_text(item):
                self.add(f"{path}[{i}]", f"must be a non-empty text, not {item!r}")
            elif LIST_SEPARATORS.search(item) or item != item.strip():
                self.add(
                    f"{path}[{i}]",
                    f"{item!r} contains a comma, a line break or surrounding spaces: "
                    f"give each of the {what} separately",
                )

    # --- the document -----------------------------------------------------------------

    def run(self, data: Any) -> None:
        if not isinstance(data, dict):
            self.add("definition", "must be a mapping")
            return
        self.mapping(data, "", TOP_KEYS)
        missing = [key for key in REQUIRED_TOP_KEYS if key not in data]
        for key in missing:
            self.add(key, "required")
        if missing:
            return
        if not isinstance(data["slug"], str) or not _FIELD_NAME.fullmatch(data["slug"]):
            self.add("slug", "lower-case letters, digits and underscores only")
        self.texts(data["name"], "name", required=True)
        if data["kind"] not in SCENARIO_KINDS:
            self.add("kind", f"{data['kind']!r} is not one of {', '.join(SCENARIO_KINDS)}")
        if not isinstance(data.get("system_prompt", ""), str):
            self.add("system_prompt", "must be text")
        if not isinstance(data["fields"], dict) or not data["fields"]:
            self.add("fields", "must map field names to definitions")
            return
        self.fields = data["fields"]
        self.field_order(data["field_order"])
        for name, spec in self.fields.items():
            self.field(str(name), spec)
        rules = self.risk_rules(data["risk_rules"])
        self.impact(data["impact"])
        tools = self.actions(data["actions"])
        self.compliance(data["compliance"])
        self.report_template(data["report_template"])
        self.examples(data.get("examples", []), rules, tools)
        self.budget(data.get("budget"))

    def budget(self, budget: Any) -> None:
        if budget is None:
            return
        if not self.mapping(budget, "budget", BUDGET_KEYS):
            return
        for key in BUDGET_KEYS:
            value = budget.get(key)
            if value is None:
                continue
            if not _is_number(value) or value <= 0 or (key != "cost" and not _is_int(value)):
                kind = "a positive number" if key == "cost" else "a positive whole number"
                self.add(f"budget.{key}", f"must be {kind}")

    def field_order(self, order: Any) -> None:
        if not isinstance(order, list):
            self.add("field_order", "must be a list of field names")
            return
        seen: set[str] = set()
        for i, name in enumerate(order):
            if not _known(name, self.fields):
                self.add(f"field_order[{i}]", f"unknown field {name!r}")
            elif name in seen:
                self.add(f"field_order[{i}]", f"field {name!r} is listed twice")
            else:
                seen.add(name)
        for name in self.fields:
            if name not in seen:
                self.add("field_order", f"field {name!r} is missing")

    def field(self, name: str, spec: Any) -> None:
        path = f"fields.{name}"
        if not _FIELD_NAME.fullmatch(name) or name in RESERVED_FIELD_NAMES:
            self.add(
                path,
                "a field name is lower-case letters, digits and underscores, and not one of "
                + ", ".join(RESERVED_FIELD_NAMES),
            )
        if not self.mapping(spec, path, FIELD_KEYS):
            return
        field_type = spec.get("type")
        if field_type not in FIELD_TYPES:
            self.add(f"{path}.type", f"{field_type!r} is not one of {', '.join(FIELD_TYPES)}")
        if spec.get("priority") not in PRIORITIES:
            self.add(f"{path}.priority", f"{spec.get('priority')!r} is not P1 or P2")
        self.texts(spec.get("label"), f"{path}.label", required=True)
        ask = spec.get("ask")
        if spec.get("priority") == "P1":
            for lang in LANGUAGES:
                if not isinstance(ask, dict) or not _is_text(ask.get(lang)):
                    self.add(f"{path}.ask.{lang}", "a P1 field needs an ask prompt")
        self.texts(ask, f"{path}.ask", required=False)
        self.values(path, field_type, spec)
        if "kinds" in spec:
            kinds = spec["kinds"]
            if field_type != "position":
                self.add(f"{path}.kinds", "only position fields have kinds")
            elif not isinstance(kinds, list) or not kinds:
                self.add(f"{path}.kinds", f"must list node kinds ({', '.join(NODE_KINDS)})")
            else:
                for i, kind in enumerate(kinds):
                    if kind not in NODE_KINDS:
                        self.add(f"{path}.kinds[{i}]", f"{kind!r} is not a node kind")
                if len(set(map(str, kinds))) != len(kinds):
                    self.add(f"{path}.kinds", "a kind is listed twice")
        if "default" in spec:
            if field_type != "enum":
                self.add(f"{path}.default", "only enum fields have a default")
            elif not _known(spec["default"], _values_of(spec)):
                self.add(f"{path}.default", f"{spec['default']!r} is not one of its values")
        if "measure" in spec:
            self.measure(path, field_type, spec)

    def values(self, path: str, field_type: Any, spec: dict[str, Any]) -> None:
        values = spec.get("values")
        if field_type not in ("enum", "bool"):
            if values is not None:
                self.add(f"{path}.values", "only enum and bool fields have values")
            return
        if not isinstance(values, dict) or not values:
            self.add(f"{path}.values", f"required for {field_type} fields")
            return
        if field_type == "bool" and set(values) != {"true", "false"}:
            self.add(f"{path}.values", "a bool field has exactly the values 'true' and 'false'")
        owner: dict[str, str] = {}
        for value, value_spec in values.items():
            value_path = f"{path}.values.{value}"
            if not isinstance(value, str) or not _VALUE_NAME.fullmatch(value):
                self.add(value_path, "a value is letters, digits and underscores only")
            if not self.mapping(value_spec, value_path, VALUE_KEYS):
                continue
            self.texts(value_spec.get("label"), f"{value_path}.label", required=False)
            for key in ("synonyms", "fallback"):
                if key not in value_spec:
                    if key == "synonyms":
                        self.add(f"{value_path}.synonyms", "required (may be an empty list)")
                    continue
                words = value_spec[key]
                self.word_list(words, f"{value_path}.{key}", what="synonyms")
                if not isinstance(words, list):
                    continue
                for i, word in enumerate(words):
                    folded = str(word).casefold()
                    if folded in owner and owner[folded] != value:
                        self.add(
                            f"{value_path}.{key}[{i}]",
                            f"{word!r} is also a synonym of {owner[folded]}: the extractor "
                            "could not tell them apart",
                        )
                    owner.setdefault(folded, str(value))

    def measure(self, path: str, field_type: Any, spec: dict[str, Any]) -> None:
        measure = spec["measure"]
        mpath = f"{path}.measure"
        if field_type != "enum":
            self.add(mpath, "only enum fields have a measure")
            return
        if not self.mapping(measure, mpath, MEASURE_KEYS):
            return
        units = measure.get("units")
        self.word_list(units, f"{mpath}.units", what="units")
        if isinstance(units, list) and not units:
            self.add(f"{mpath}.units", "name at least one unit")
        bands = measure.get("bands")
        if not isinstance(bands, list) or not bands:
            self.add(f"{mpath}.bands", "must be a non-empty list")
            return
        for i, band in enumerate(bands):
            bpath = f"{mpath}.bands[{i}]"
            if not self.mapping(band, bpath, BAND_KEYS):
                continue
            if not _known(band.get("value"), _values_of(spec)):
                self.add(f"{bpath}.value", f"{band.get('value')!r} is not one of its values")
            thresholds = [k for k in ("above", "at_least") if k in band]
            if len(thresholds) > 1:
                self.add(bpath, "give either above or at_least, not both")
            for key in thresholds:
                if not _is_number(band[key]):
                    self.add(f"{bpath}.{key}", "must be a number")

    # --- conditions -------------------------------------------------------------------

    def when(self, when: Any, path: str, *, allow_level: bool, allow_impact: bool) -> None:
        if not isinstance(when, dict):
            self.add(path, "must be a mapping")
            return
        for key, value in when.items():
            if key == "any":
                if not isinstance(value, list) or len(value) == 0:
                    self.add(f"{path}.any", "must be a non-empty list")
                    continue
                for i, branch in enumerate(value):
                    if isinstance(branch, dict) and not branch:
                        self.add(f"{path}.any[{i}]", "an OR branch needs at least one condition")
                        continue
                    self.when(
                        branch,
                        f"{path}.any[{i}]",
                        allow_level=allow_level,
                        allow_impact=allow_impact,
                    )
                continue
            self.condition(
                str(key),
                value,
                f"{path}.{key}",
                allow_level=allow_level,
                allow_impact=allow_impact,
            )

    def condition(
        self, key: str, value: Any, path: str, *, allow_level: bool, allow_impact: bool
    ) -> None:
        negated = isinstance(value, dict)
        if negated:
            if set(value) != {"not"}:
                self.add(path, "a mapping here must be {not: value}")
                return
            value = value["not"]
        candidates = value if isinstance(value, list) else [value]
        if not candidates:
            self.add(path, "name at least one value")
            return
        for candidate in candidates:
            if isinstance(candidate, bool):
                continue
            if not isinstance(candidate, str):
                self.add(path, f"{candidate!r}: a condition compares with text or true/false")
                return
            if not value_is_representable(candidate):
                self.add(
                    path,
                    f"{candidate!r} cannot be a condition value (no commas, '|', parentheses, "
                    "'or'/'and' words or surrounding spaces)",
                )
                return
        if key == "level":
            if not allow_level:
                self.add(path, "risk rules cannot depend on the level they assign")
                return
            for v in candidates:
                if v not in LEVELS:
                    self.add(path, f"{v!r} is not a risk level ({', '.join(LEVELS)})")
            return
        if key.startswith("impact."):
            if not allow_impact:
                self.add(path, "impact is not known when risk is assessed")
            elif key[len("impact.") :] not in IMPACT_LISTS:
                self.add(path, f"unknown impact list (one of {', '.join(IMPACT_LISTS)})")
            elif negated or len(candidates) != 1 or candidates[0] not in ("non_empty", "empty"):
                self.add(path, "must be non_empty or empty")
            return
        field_name, _, attribute = key.partition(".")
        if field_name not in self.fields:
            self.add(path, f"unknown field {field_name!r}")
            return
        spec = self.fields[field_name] if isinstance(self.fields[field_name], dict) else {}
        if attribute:
            if attribute != "kind" or spec.get("type") != "position":
                self.add(path, "only position fields have .kind")
                return
            for k in candidates:
                if k not in NODE_KINDS:
                    self.add(path, f"{k!r} is not a node kind ({', '.join(NODE_KINDS)})")
            return
        if spec.get("type") == "bool":
            for c in candidates:
                if not isinstance(c, bool):
                    self.add(path, f"{c!r} is not true or false")
        elif spec.get("type") == "enum":
            allowed = _values_of(spec)
            for c in candidates:
                if c not in allowed:
                    self.add(path, f"{c!r} is not one of {', '.join(map(str, allowed))}")

    # --- rules, impact, actions -------------------------------------------------------

    def risk_rules(self, rules: Any) -> dict[str, str]:
        """Checks the rules; returns rule id -> level."""
        if not isinstance(rules, list) or not rules:
            self.add("risk_rules", "must be a non-empty list")
            return {}
        levels: dict[str, str] = {}
        earlier: list[tuple[str, dict[str, Any]]] = []
        unconditional: str | None = None
        for i, rule in enumerate(rules):
            path = f"risk_rules[{i}]"
            if not self.mapping(rule, path, RULE_KEYS):
                continue
            rule_id = rule.get("id")
            if not _is_text(rule_id):
                self.add(f"{path}.id", "required")
                rule_id = f"#{i + 1}"
            elif rule_id in levels:
                self.add(f"{path}.id", f"duplicate rule id {rule_id!r}")
            level = rule.get("level")
            if level not in LEVELS:
                self.add(f"{path}.level", f"{level!r} is not one of {', '.join(LEVELS)}")
            levels.setdefault(str(rule_id), str(level))
            score = rule.get("score")
            if not _is_int(score) or not 0 <= score <= 100:
                self.add(f"{path}.score", "must be an integer from 0 to 100")
            when = rule.get("when", {})
            self.when(when, f"{path}.when", allow_level=False, allow_impact=False)
            if unconditional is not None:
                self.add(path, f"unreachable: rule {unconditional!r} before it always matches")
            elif isinstance(when, dict):
                for other_id, other in earlier:
                    if other and _shadows(other, when):
                        self.add(
                            path,
                            f"unreachable: rule {other_id!r} before it matches whenever "
                            "this one does",
                        )
                        break
                earlier.append((str(rule_id), when))
                if when == {}:
                    unconditional = str(rule_id)
        if unconditional is None:
            self.add(
                "risk_rules",
                "the last rule must be unconditional (when: {}) so every incident gets a level",
            )
        return levels

    def impact(self, impact: Any) -> None:
        if not self.mapping(impact, "impact", IMPACT_KEYS):
            return
        start = impact.get("start")
        start_spec = self.fields.get(start) if isinstance(start, str) else None
        if not isinstance(start_spec, dict) or start_spec.get("type") != "position":
            self.add("impact.start", f"{start!r} is not a position field")
        key_field = impact.get("radius_key")
        radius = impact.get("radius", {})
        if key_field is not None:
            key_spec = self.fields.get(key_field) if isinstance(key_field, str) else None
            if not isinstance(key_spec, dict) or key_spec.get("type") != "enum":
                self.add("impact.radius_key", f"{key_field!r} is not an enum field")
                key_spec = {}
            allowed = _values_of(key_spec)
            if not isinstance(radius, dict):
                self.add("impact.radius", "must map values of the key field to hop counts")
                return
            for value, by_level in radius.items():
                if allowed and value not in allowed:
                    self.add(f"impact.radius.{value}", f"not a value of {key_field}")
                self.radius(by_level, f"impact.radius.{value}")
        else:
            self.radius(radius, "impact.radius")
        default_radius = impact.get("default_radius", 1)
        if not _is_int(default_radius) or default_radius < 0:
            self.add("impact.default_radius", "must be a non-negative integer")

    def radius(self, by_level: Any, path: str) -> None:
        if not isinstance(by_level, dict):
            self.add(path, "must map risk levels to hop counts")
            return
        for level, hops in by_level.items():
            if level not in LEVELS:
                self.add(f"{path}.{level}", f"not a risk level ({', '.join(LEVELS)})")
            if not _is_int(hops) or hops < 0:
                self.add(f"{path}.{level}", "must be a non-negative integer")

    def actions(self, actions: Any) -> set[str]:
        """Checks the actions; returns the tools they use."""
        if not isinstance(actions, list) or not actions:
            self.add("actions", "must be a non-empty list")
            return set()
        tools: set[str] = set()
        for i, action in enumerate(actions):
            path = f"actions[{i}]"
            if not self.mapping(action, path, ACTION_KEYS):
                continue
            tool = action.get("tool")
            if not _known(tool, ACTION_TOOLS):
                self.add(
                    f"{path}.tool",
                    f"{tool!r} is not a known action tool ({', '.join(sorted(ACTION_TOOLS))})",
                )
            else:
                tools.add(tool)
            if action.get("risk_class") not in RISK_CLASSES:
                self.add(f"{path}.risk_class", f"{action.get('risk_class')!r} is not one of R0-R3")
            elif _known(tool, ACTION_TOOLS) and below_floor(tool, action["risk_class"]):
                self.add(f"{path}.risk_class", floor_message(tool, action["risk_class"]))
            self.when(action.get("when", {}), f"{path}.when", allow_level=True, allow_impact=True)
            for_each = action.get("for_each")
            if for_each is not None and for_each not in [f"impact.{n}" for n in IMPACT_LISTS]:
                self.add(
                    f"{path}.for_each",
                    f"{for_each!r} is not one of impact.{', impact.'.join(IMPACT_LISTS)}",
                )
            args = action.get("args", {})
            if not isinstance(args, dict):
                self.add(f"{path}.args", "must map argument names to texts")
                continue
            if _known(tool, ACTION_TOOLS):
                for arg in ACTION_TOOLS[tool]:
                    if arg not in args:
                        self.add(f"{path}.args.{arg}", f"required by {tool}")
                for arg in args:
                    if arg not in ACTION_TOOLS[tool]:
                        self.add(f"{path}.args.{arg}", f"{tool} takes no such argument")
            for arg, text in args.items():
                if not isinstance(text, str):
                    self.add(f"{path}.args.{arg}", "must be text")
                    continue
                if "\n" in text:
                    self.add(f"{path}.args.{arg}", "must be one line")
                for placeholder in _PLACEHOLDER.findall(text):
                    if not _placeholder_known(placeholder, self.fields, for_each is not None):
                        self.add(f"{path}.args.{arg}", f"unknown placeholder {{{placeholder}}}")
        return tools

    def compliance(self, compliance: Any) -> None:
        if not self.mapping(compliance, "compliance", ("states",)):
            return
        states = compliance.get("states")
        if (
            not isinstance(states, list)
            or len(states) != COMPLIANCE_STEPS
            or not all(_is_text(s) and s == s.strip() for s in states)
            or len(set(states)) != len(states)
        ):
            self.add(
                "compliance.states",
                f"must name exactly {COMPLIANCE_STEPS} distinct states, in order: start, "
                "all P1 fields known, risk assessed, impact analysed, actions decided, reported",
            )

    def report_template(self, templates: Any) -> None:
        if not self.mapping(templates, "report_template", LANGUAGES):
            return
        for lang in LANGUAGES:
            source = templates.get(lang)
            if not _is_text(source):
                self.add(f"report_template.{lang}", "required")
                continue
            try:
                Engine(autoescape=False).from_string(source)
            except TemplateSyntaxError as exc:
                self.add(f"report_template.{lang}", f"does not compile: {exc}")

    # --- examples (the scenario's self-check) ------------------------------------------

    def examples(self, examples: Any, rules: dict[str, str], tools: set[str]) -> None:
        if not isinstance(examples, list):
            self.add("examples", "must be a list")
            return
        for i, example in enumerate(examples):
            path = f"examples[{i}]"
            if not self.mapping(example, path, EXAMPLE_KEYS):
                continue
            if not _is_text(example.get("text")):
                self.add(f"{path}.text", "required")
            expected = example.get("fields")
            if not isinstance(expected, dict):
                self.add(f"{path}.fields", "must map field names to the values expected")
            else:
                self.example_fields(expected, f"{path}.fields")
            rule = example.get("rule")
            if not _known(rule, rules):
                self.add(f"{path}.rule", f"{rule!r} is not a risk rule of this scenario")
            level = example.get("level")
            if level not in LEVELS:
                self.add(f"{path}.level", f"{level!r} is not one of {', '.join(LEVELS)}")
            elif _known(rule, rules) and rules[rule] != level:
                self.add(f"{path}.level", f"rule {rule} assigns {rules[rule]}, not {level}")
            expected_tools = example.get("actions")
            if not isinstance(expected_tools, list):
                self.add(f"{path}.actions", "must list the action tools expected, in order")
                continue
            for j, tool in enumerate(expected_tools):
                if not _known(tool, tools):
                    self.add(f"{path}.actions[{j}]", f"{tool!r} is not an action of this scenario")

    def example_fields(self, expected: dict[str, Any], path: str) -> None:
        for name, value in expected.items():
            spec = self.fields.get(name)
            if not isinstance(spec, dict):
                self.add(f"{path}.{name}", f"unknown field {name!r}")
                continue
            field_type = spec.get("type")
            if field_type == "bool":
                ok = isinstance(value, bool)
            elif field_type == "number":
                ok = _is_number(value)
            else:
                ok = _is_text(value) and value == value.strip() and not re.search("[,=]", value)
            if not ok:
                self.add(f"{path}.{name}", f"{value!r} is not a {field_type} value")
            elif field_type == "enum" and value not in _values_of(spec):
                allowed = ", ".join(map(str, _values_of(spec)))
                self.add(f"{path}.{name}", f"{value!r} is not one of {allowed}")
        for name in self.fields:
            spec = self.fields[name]
            if isinstance(spec, dict) and spec.get("priority") == "P1" and name not in expected:
                self.add(path, f"the P1 field {name} is missing: an example is a whole incident")


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


def _placeholder_known(placeholder: str, fields: dict[str, Any], has_item: bool) -> bool:
    head, _, rest = placeholder.partition(".")
    if head == "item":
        return has_item and not rest
    if head == "fields":
        return rest in fields
    if head == "risk":
        return rest in ("level", "score", "rule")
    if head == "impact":
        return rest in IMPACT_LISTS or rest in ("radius", "start")
    return False
