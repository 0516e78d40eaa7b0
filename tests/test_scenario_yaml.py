"""Scenario files: one per scenario, canonical key order, round-trip exact; problems are
reported with their line and path in the file."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
import yaml

from scenarios_admin.definition import Issue
from scenarios_admin.draft import definition_from_draft, draft_from_definition, normalize
from scenarios_admin.yamlio import dump_definition, load_yaml, locate
from tests.builtin_data import BUILTIN_SLUGS, builtin_definition


@pytest.mark.parametrize("slug", BUILTIN_SLUGS)
def test_a_shipped_file_is_already_in_normal_form(slug: str) -> None:
    assert normalize(builtin_definition(slug)) == builtin_definition(slug)


@pytest.mark.parametrize("slug", BUILTIN_SLUGS)
def test_export_then_import_is_exact(slug: str) -> None:
    text = dump_definition(builtin_definition(slug))

    assert yaml.safe_load(text) == builtin_definition(slug)
    assert dump_definition(yaml.safe_load(text)) == text


@pytest.mark.parametrize("slug", BUILTIN_SLUGS)
def test_rows_then_definition_is_exact(slug: str) -> None:
    definition, problems = definition_from_draft(draft_from_definition(builtin_definition(slug)))

    assert problems == []
    assert definition == builtin_definition(slug)


def _shuffled(node: Any, rng: random.Random) -> Any:
    # What PostgreSQL's jsonb does to a stored document: mapping keys in another order.
    if isinstance(node, dict):
        items = list(node.items())
        rng.shuffle(items)
        return {key: _shuffled(value, rng) for key, value in items}
    if isinstance(node, list):
        return [_shuffled(item, rng) for item in node]
    return node


@pytest.mark.parametrize("slug", BUILTIN_SLUGS)
def test_the_file_does_not_depend_on_stored_key_order(slug: str) -> None:
    text = dump_definition(builtin_definition(slug))
    for seed in range(5):
        assert dump_definition(_shuffled(builtin_definition(slug), random.Random(seed))) == text


def test_the_file_reads_like_the_hand_written_one() -> None:
    text = dump_definition(builtin_definition("bird_strike"))

    assert text.startswith("slug: bird_strike\nname: {zh: 鸟击, en: Bird strike}\nkind: apron\n")
    assert "  - {id: BS-01, " not in text  # one key per line for rules
    assert "    when: {phase: [TAKEOFF_ROLL, CLIMB], engine_ingestion: true}\n" in text
    assert (
        "    when:\n      any:\n        - {level: HIGH}\n        - {remains_on_runway: true}\n"
        in text
    )
    assert "  zh: |\n    # 鸟击应急处置报告\n" in text  # templates as literal blocks


def test_conditions_are_ordered_by_field_order() -> None:
    definition = copy.deepcopy(builtin_definition("oil_spill"))
    definition["risk_rules"][0]["when"] = {
        "engine_status": "RUNNING",
        "continuous": True,
        "fluid_type": "FUEL",
    }
    text = dump_definition(definition)
    assert "when: {fluid_type: FUEL, engine_status: RUNNING, continuous: true}" in text


def test_a_yaml_syntax_error_names_its_line() -> None:
    text = "slug: x\nname: {zh: a, en: b\nkind: apron\n"
    data, problems = load_yaml(text)

    assert data is None
    assert len(problems) == 1
    assert problems[0].line == 3
    assert str(problems[0]) == (
        "line 3: (file): not valid YAML, column 5: expected ',' or '}', but got ':'"
    )


def test_a_problem_is_located_at_its_path_or_the_nearest_parent() -> None:
    text = dump_definition(builtin_definition("tire_burst"))
    lines = text.splitlines()
    located = locate(
        [
            Issue("risk_rules[2].when.debris", "x"),
            Issue("actions[5].args.flight_no", "y"),
            Issue("risk_rules[2].when.nope", "z"),  # not in the file: its parent's line
        ],
        text,
    )

    assert located[0].line is not None and "debris" in lines[located[0].line - 1]
    assert "TB-03" in lines[located[0].line - 2]
    assert located[1].line is not None and "flight_no" in lines[located[1].line - 1]
    assert located[2].line == located[0].line  # the when mapping's line
