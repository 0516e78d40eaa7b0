"""Every way a scenario definition can be wrong gets a precise message: which rule, which
field, what is wrong (SCENARIOS.md; issue 3). The same validation runs on admin saves,
YAML imports, the built-in loader and publishing."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from scenarios_admin.schema import validate_definition
from tests.builtin_data import BUILTIN_SLUGS, builtin_definition, oil_spill


def broken(change: Callable[[dict[str, Any]], object]) -> list[str]:
    definition = copy.deepcopy(oil_spill())
    change(definition)
    return validate_definition(definition)


def rule(d: dict[str, Any], rule_id: str) -> dict[str, Any]:
    return next(r for r in d["risk_rules"] if r["id"] == rule_id)


@pytest.mark.parametrize("slug", BUILTIN_SLUGS)
def test_every_shipped_scenario_is_valid(slug: str) -> None:
    assert validate_definition(builtin_definition(slug)) == []


def test_unknown_field_in_a_condition() -> None:
    def change(d: dict[str, Any]) -> None:
        rule(d, "OS-04")["when"] = {"fluid": "FUEL", "leak_size": "LARGE"}

    assert broken(change) == ["risk_rules[3].when.fluid: unknown field 'fluid'"]


def test_a_value_outside_the_enum() -> None:
    def change(d: dict[str, Any]) -> None:
        rule(d, "OS-09")["when"]["fluid_type"] = "DIESEL"

    assert broken(change) == [
        "risk_rules[8].when.fluid_type: 'DIESEL' is not one of FUEL, HYDRAULIC, OIL"
    ]


def test_a_bool_condition_needs_true_or_false() -> None:
    def change(d: dict[str, Any]) -> None:
        rule(d, "OS-05")["when"]["continuous"] = "yes"

    assert broken(change) == ["risk_rules[4].when.continuous: 'yes' is not true or false"]


def test_a_risk_class_other_than_r0_to_r3() -> None:
    assert broken(lambda d: d["actions"][1].update(risk_class="R4")) == [
        "actions[1].risk_class: 'R4' is not one of R0-R3"
    ]


def test_a_template_that_does_not_compile() -> None:
    errors = broken(lambda d: d["report_template"].update(en="{% if risk %}unclosed"))
    assert len(errors) == 1
    assert errors[0].startswith("report_template.en: does not compile: ")
    assert "endif" in errors[0]


def test_an_action_tool_that_does_not_exist() -> None:
    errors = broken(lambda d: d["actions"][2].update(tool="launch_foam_cannon"))
    assert errors[0].startswith(
        "actions[2].tool: 'launch_foam_cannon' is not a known action tool (close_runway, "
    )


def test_rules_after_an_unconditional_one_are_unreachable() -> None:
    def change(d: dict[str, Any]) -> None:
        d["risk_rules"].insert(2, {"id": "OS-00", "when": {}, "level": "LOW", "score": 1})

    errors = broken(change)
    assert errors[0] == "risk_rules[3]: unreachable: rule 'OS-00' before it always matches"
    assert len(errors) == 10  # every rule after OS-00


def test_a_rule_shadowed_by_a_broader_earlier_rule_is_unreachable() -> None:
    def change(d: dict[str, Any]) -> None:
        # OS-08 (fuel) moved first: OS-01..OS-05 all need fuel and more, so never match.
        os08 = rule(d, "OS-08")
        d["risk_rules"].remove(os08)
        d["risk_rules"].insert(0, os08)

    errors = broken(change)
    assert errors[0] == (
        "risk_rules[1]: unreachable: rule 'OS-08' before it matches whenever this one does"
    )
    assert [e.split(":")[0] for e in errors] == [f"risk_rules[{i}]" for i in (1, 2, 3, 4, 5)]


def test_the_last_rule_must_be_unconditional() -> None:
    def change(d: dict[str, Any]) -> None:
        d["risk_rules"].pop()
        d["examples"].pop()  # the example of OS-12

    assert broken(change) == [
        "risk_rules: the last rule must be unconditional (when: {}) so every incident gets a level"
    ]


def test_a_misspelt_key_is_reported_not_ignored() -> None:
    def change(d: dict[str, Any]) -> None:
        d["fields"]["fluid_type"]["lable"] = d["fields"]["fluid_type"].pop("label")

    # A missing key is listed where its mapping starts, before the keys that are there.
    assert broken(change) == [
        "fields.fluid_type.label: required",
        "fields.fluid_type.lable: unknown key (allowed: label, type, priority, ask, values, "
        "default, measure, kinds)",
    ]


def test_a_p1_field_needs_an_ask_prompt_in_both_languages() -> None:
    assert broken(lambda d: d["fields"]["engine_status"]["ask"].pop("zh")) == [
        "fields.engine_status.ask.zh: a P1 field needs an ask prompt"
    ]


def test_the_same_synonym_for_two_values_is_ambiguous() -> None:
    def change(d: dict[str, Any]) -> None:
        d["fields"]["engine_status"]["values"]["STOPPED"]["synonyms"].append("Running")

    assert broken(change) == [
        "fields.engine_status.values.STOPPED.synonyms[8]: 'Running' is also a synonym of "
        "RUNNING: the extractor could not tell them apart"
    ]


def test_a_synonym_with_a_comma_is_two_synonyms() -> None:
    def change(d: dict[str, Any]) -> None:
        d["fields"]["fluid_type"]["values"]["OIL"]["synonyms"] = ["滑油, 机油"]

    errors = broken(change)
    assert errors == [
        "fields.fluid_type.values.OIL.synonyms[0]: '滑油, 机油' contains a comma, a line "
        "break or surrounding spaces: give each of the synonyms separately"
    ]


def test_the_compliance_state_machine_has_six_states() -> None:
    errors = broken(lambda d: d["compliance"]["states"].pop())
    assert errors == [
        "compliance.states: must name exactly 6 distinct states, in order: start, all P1 "
        "fields known, risk assessed, impact analysed, actions decided, reported"
    ]


def test_rules_cannot_use_the_level_they_assign_or_impact() -> None:
    def change(d: dict[str, Any]) -> None:
        rule(d, "OS-01")["when"]["level"] = "HIGH"
        rule(d, "OS-02")["when"]["impact.runways"] = "non_empty"

    assert broken(change) == [
        "risk_rules[0].when.level: risk rules cannot depend on the level they assign",
        "risk_rules[1].when.impact.runways: impact is not known when risk is assessed",
    ]


def test_action_conditions_and_placeholders() -> None:
    def change(d: dict[str, Any]) -> None:
        d["actions"][2]["when"] = {"level": "SEVERE"}
        d["actions"][3]["when"] = {"position.kind": "gate"}
        d["actions"][1]["args"] = {"position": "{fields.positon}"}
        d["actions"][4]["for_each"] = "impact.gates"

    assert broken(change) == [
        "actions[1].args.position: unknown placeholder {fields.positon}",
        "actions[2].when.level: 'SEVERE' is not a risk level (HIGH, MEDIUM, LOW)",
        "actions[3].when.position.kind: 'gate' is not a node kind (stand, taxiway, runway)",
        "actions[4].for_each: 'impact.gates' is not one of impact.isolated_nodes, "
        "impact.taxiways, impact.runways, impact.stands, impact.flights",
    ]


def test_a_condition_compares_with_text_not_numbers() -> None:
    def change(d: dict[str, Any]) -> None:
        rule(d, "OS-01")["when"]["position"] = 105

    assert broken(change) == [
        "risk_rules[0].when.position: 105: a condition compares with text or true/false"
    ]


def test_examples_must_be_able_to_pass() -> None:
    def change(d: dict[str, Any]) -> None:
        example = d["examples"][0]
        example["rule"] = "OS-99"
        example["actions"] = ["notify_atc", "runway_inspection"]
        d["examples"][1]["level"] = "HIGH"
        del d["examples"][1]["fields"]["position"]

    assert broken(change) == [
        "examples[0].rule: 'OS-99' is not a risk rule of this scenario",
        "examples[0].actions[1]: 'runway_inspection' is not an action of this scenario",
        "examples[1].fields: the P1 field position is missing: an example is a whole incident",
        "examples[1].level: rule OS-12 assigns LOW, not HIGH",
    ]


def test_radius_table_keys_are_values_and_levels() -> None:
    def change(d: dict[str, Any]) -> None:
        d["impact"]["radius"]["DIESEL"] = {"HIGH": 2}
        d["impact"]["radius"]["OIL"]["SEVERE"] = -1

    assert broken(change) == [
        "impact.radius.OIL.SEVERE: not a risk level (HIGH, MEDIUM, LOW)",
        "impact.radius.OIL.SEVERE: must be a non-negative integer",
        "impact.radius.DIESEL: not a value of fluid_type",
    ]


@pytest.mark.parametrize(
    "garbage",
    [
        None,
        [],
        "slug: x",
        {"slug": 1},
        {
            "slug": "x",
            "name": "x",
            "kind": "apron",
            "field_order": "a",
            "fields": {"a": "b"},
            "risk_rules": ["x", None],
            "impact": [],
            "actions": [1],
            "compliance": None,
            "report_template": {"zh": 1},
            "examples": [{"fields": []}],
        },
        {
            "slug": "x",
            "name": {"zh": "x", "en": "x"},
            "kind": "apron",
            "field_order": [["a"]],
            "fields": {"a": {"type": "enum", "priority": "P1", "values": {"X": None}}},
            "risk_rules": [{"id": "R", "when": {"any": [{}, 3]}, "level": "LOW", "score": 1}],
            "impact": {"start": ["a"], "radius_key": ["a"], "radius": {"X": "y"}},
            "actions": [{"tool": "notify_atc", "when": {"a": {"nope": 1}}, "args": "x"}],
            "compliance": {"states": "abc"},
            "report_template": {"zh": "{% bad %}", "en": ""},
        },
    ],
)
def test_garbage_gets_messages_not_a_crash(garbage: Any) -> None:
    errors = validate_definition(garbage)
    assert errors
    assert all(": " in error for error in errors)


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path] if path else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _paths(value, (*path, i))
    return found


def test_any_part_replaced_by_the_wrong_type_gets_a_message_not_a_crash() -> None:
    shipped = builtin_definition("bird_strike")
    for path in _paths(shipped):
        for wrong in (None, [], {}, "x", 7, ["x"], {"x": 1}):
            definition = copy.deepcopy(shipped)
            parent = definition
            for key in path[:-1]:
                parent = parent[key]
            if parent[path[-1]] == wrong:
                continue
            parent[path[-1]] = wrong
            errors = validate_definition(definition)
            # Some replacements are still valid (a label text "x"); none may crash.
            assert all(": " in error for error in errors), (path, wrong)
