"""The readable condition text admins type in risk rules and actions, and its JSON form."""

from __future__ import annotations

from typing import Any

import pytest

from scenarios_admin.conditions import ConditionSyntaxError, condition_text, parse_condition
from tests.builtin_data import BUILTIN_SLUGS, builtin_definition


@pytest.mark.parametrize(
    ("text", "when"),
    [
        ("", {}),
        ("fluid_type=FUEL, continuous=true", {"fluid_type": "FUEL", "continuous": True}),
        ("fluid_type = FUEL AND continuous = TRUE", {"fluid_type": "FUEL", "continuous": True}),
        ("phase=TAKEOFF_ROLL|CLIMB", {"phase": ["TAKEOFF_ROLL", "CLIMB"]}),
        ("phase!=STAND", {"phase": {"not": "STAND"}}),
        ("phase!=STAND|TAXI", {"phase": {"not": ["STAND", "TAXI"]}}),
        ("position.kind=runway", {"position.kind": "runway"}),
        ("impact.runways=non_empty", {"impact.runways": "non_empty"}),
        (
            "level=HIGH OR remains_on_runway=true",
            {"any": [{"level": "HIGH"}, {"remains_on_runway": True}]},
        ),
        (
            "level=HIGH or remains_on_runway=true",
            {"any": [{"level": "HIGH"}, {"remains_on_runway": True}]},
        ),
        (
            "debris=true, (level=HIGH OR fire=true)",
            {"debris": True, "any": [{"level": "HIGH"}, {"fire": True}]},
        ),
        (
            "a=1, b=2 OR c=3",
            {"any": [{"a": "1", "b": "2"}, {"c": "3"}]},
        ),
    ],
)
def test_condition_text_reads_as_the_definition_mapping(text: str, when: dict[str, Any]) -> None:
    assert parse_condition(text) == when
    assert parse_condition(condition_text(when)) == when


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("fluid_type FUEL", "'fluid_type FUEL' is not a comparison"),
        ("fluid_type=", "a value is missing"),
        ("phase=A|", "a value is missing"),
        ("a=1,", "a comparison such as field=VALUE is missing at the end"),
        ("a=1 OR OR b=2", "a comparison such as field=VALUE is missing before 'OR'"),
        ("(a=1 OR b=2", "a '(' is never closed"),
        ("a=1)", "unexpected ')'"),
        ("a=1, a=2", "a appears twice; write a=A|B"),
        ("(a=1 OR b=2), (c=1 OR d=2)", "only one (… OR …) group per part"),
        ("a=1 b=2", "separate comparisons with ',' or OR"),
    ],
)
def test_unreadable_condition_text_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ConditionSyntaxError) as error:
        parse_condition(text)
    assert message in str(error.value)


@pytest.mark.parametrize("slug", BUILTIN_SLUGS)
def test_every_shipped_condition_survives_text_and_back(slug: str) -> None:
    definition = builtin_definition(slug)
    conditions = [r["when"] for r in definition["risk_rules"]]
    conditions += [a.get("when", {}) for a in definition["actions"]]
    for when in conditions:
        assert parse_condition(condition_text(when)) == when


def test_condition_text_is_what_an_admin_reads() -> None:
    assert condition_text({"fluid_type": "FUEL", "continuous": True}) == (
        "fluid_type=FUEL, continuous=true"
    )
    assert condition_text({"any": [{"level": "HIGH"}, {"remains_on_runway": True}]}) == (
        "level=HIGH OR remains_on_runway=true"
    )
    assert condition_text({"phase": {"not": "STAND"}}) == "phase!=STAND"
    assert condition_text({"phase": ["TAKEOFF_ROLL", "LANDING_ROLL"]}) == (
        "phase=TAKEOFF_ROLL|LANDING_ROLL"
    )
