"""oil_spill's risk table, spread radius and required actions (SCENARIOS.md), through the
deterministic policy."""

from __future__ import annotations

from typing import Any

import pytest

from packs.airport.agent import policy
from tests.builtin_data import demo_graph, oil_spill

# The table of SCENARIOS.md, row by row: the minimal facts of each rule.
RISK_TABLE: list[tuple[str, dict[str, Any], str, int]] = [
    ("OS-01", {"fluid_type": "FUEL", "continuous": True, "engine_status": "RUNNING"}, "HIGH", 95),
    ("OS-02", {"fluid_type": "FUEL", "continuous": True, "leak_size": "LARGE"}, "HIGH", 92),
    ("OS-03", {"fluid_type": "FUEL", "engine_status": "RUNNING"}, "HIGH", 88),
    ("OS-04", {"fluid_type": "FUEL", "leak_size": "LARGE"}, "HIGH", 85),
    ("OS-05", {"fluid_type": "FUEL", "continuous": True}, "HIGH", 80),
    (
        "OS-06",
        {"fluid_type": "HYDRAULIC", "continuous": True, "engine_status": "RUNNING"},
        "MEDIUM",
        70,
    ),
    ("OS-07", {"fluid_type": "HYDRAULIC", "leak_size": "LARGE"}, "MEDIUM", 65),
    ("OS-08", {"fluid_type": "FUEL"}, "MEDIUM", 60),
    ("OS-09", {"fluid_type": "OIL", "engine_status": "RUNNING"}, "MEDIUM", 55),
    ("OS-10", {"fluid_type": "HYDRAULIC", "continuous": True}, "MEDIUM", 50),
    ("OS-11", {"fluid_type": "OIL", "continuous": True, "leak_size": "LARGE"}, "MEDIUM", 45),
    ("OS-12", {}, "LOW", 25),
]


def assess(fields: dict[str, Any]) -> dict[str, Any]:
    return policy.assess_risk(oil_spill(), fields, demo_graph())


def test_the_definition_lists_the_rules_of_the_table_in_order() -> None:
    assert [rule["id"] for rule in oil_spill()["risk_rules"]] == [row[0] for row in RISK_TABLE]


@pytest.mark.parametrize(
    ("rule", "fields", "level", "score"), RISK_TABLE, ids=[row[0] for row in RISK_TABLE]
)
def test_each_rule_with_its_minimal_facts(
    rule: str, fields: dict[str, Any], level: str, score: int
) -> None:
    risk = assess(fields)
    assert (risk["rule"], risk["level"], risk["score"]) == (rule, level, score)


@pytest.mark.parametrize(
    ("rule", "fields", "level", "score"), RISK_TABLE[:-1], ids=[row[0] for row in RISK_TABLE[:-1]]
)
def test_each_fact_of_a_rule_is_needed(
    rule: str, fields: dict[str, Any], level: str, score: int
) -> None:
    for name in fields:
        without = {k: v for k, v in fields.items() if k != name}
        assert assess(without)["rule"] != rule, f"{rule} matched without {name}"


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        # Every rule from OS-01 to OS-05 holds: the first one wins.
        (
            {
                "fluid_type": "FUEL",
                "continuous": True,
                "engine_status": "RUNNING",
                "leak_size": "LARGE",
            },
            "OS-01",
        ),
        (
            {
                "fluid_type": "FUEL",
                "continuous": True,
                "engine_status": "STOPPED",
                "leak_size": "LARGE",
            },
            "OS-02",
        ),
        (
            {
                "fluid_type": "FUEL",
                "continuous": False,
                "engine_status": "RUNNING",
                "leak_size": "LARGE",
            },
            "OS-03",
        ),
        (
            {
                "fluid_type": "HYDRAULIC",
                "continuous": True,
                "engine_status": "RUNNING",
                "leak_size": "LARGE",
            },
            "OS-06",
        ),
        (
            {
                "fluid_type": "FUEL",
                "continuous": False,
                "engine_status": "STOPPED",
                "leak_size": "SMALL",
            },
            "OS-08",
        ),
        (
            {
                "fluid_type": "OIL",
                "continuous": True,
                "engine_status": "RUNNING",
                "leak_size": "LARGE",
            },
            "OS-09",
        ),
        (
            {
                "fluid_type": "OIL",
                "continuous": False,
                "engine_status": "STOPPED",
                "leak_size": "LARGE",
            },
            "OS-12",
        ),
        # The second worked example of SCENARIOS.md.
        (
            {
                "fluid_type": "HYDRAULIC",
                "continuous": False,
                "engine_status": "STOPPED",
                "leak_size": "MEDIUM",
            },
            "OS-12",
        ),
    ],
)
def test_first_match_wins(fields: dict[str, Any], rule: str) -> None:
    assert assess(fields)["rule"] == rule


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"fluid_type": None, "continuous": True, "engine_status": "RUNNING"}, "OS-12"),
        ({"fluid_type": "FUEL", "continuous": None, "engine_status": None}, "OS-08"),
        ({"fluid_type": "FUEL", "continuous": True, "engine_status": None}, "OS-05"),
        ({"fluid_type": "FUEL", "leak_size": "UNKNOWN"}, "OS-08"),
    ],
)
def test_an_unknown_field_never_matches(fields: dict[str, Any], rule: str) -> None:
    assert assess(fields)["rule"] == rule


def test_unknown_leak_size_default_matches_no_size_condition() -> None:
    fields = policy.with_defaults(oil_spill(), {"fluid_type": "HYDRAULIC"})
    assert fields["leak_size"] == "UNKNOWN"
    assert assess(fields)["rule"] == "OS-12"


# --- spread radius ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fluid", "level", "hops"),
    [
        ("FUEL", "HIGH", 3),
        ("FUEL", "MEDIUM", 2),
        ("FUEL", "LOW", 1),
        ("HYDRAULIC", "MEDIUM", 2),
        ("HYDRAULIC", "LOW", 1),
        ("OIL", "MEDIUM", 1),
        ("OIL", "LOW", 1),
    ],
)
def test_spread_radius(fluid: str, level: str, hops: int) -> None:
    assert policy.spread_radius(oil_spill(), {"fluid_type": fluid}, level) == hops


# --- required actions -----------------------------------------------------------------


def actions_for(fields: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    definition, graph = oil_spill(), demo_graph()
    fields = policy.with_defaults(definition, fields)
    risk = policy.assess_risk(definition, fields, graph)
    impact = policy.analyze_impact(definition, fields, graph, risk["level"])
    return impact, policy.required_actions(definition, fields, graph, risk, impact)


def summary(actions: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, str]]]:
    return [
        (a["tool"], a["risk_class"], {k: v for k, v in a["args"].items() if k != "message"})
        for a in actions
    ]


def test_high_risk_on_a_stand() -> None:
    impact, actions = actions_for(
        {
            "flight_no": "CA1234",
            "position": "105",
            "fluid_type": "FUEL",
            "engine_status": "RUNNING",
            "continuous": True,
        }
    )
    assert summary(actions) == [
        ("notify_atc", "R0", {}),
        ("dispatch_cleanup_crew", "R1", {"position": "105"}),
        ("request_fire_standby", "R1", {"position": "105"}),
        ("suspend_stand_operations", "R2", {"stand": "105"}),
        ("close_taxiway", "R2", {"taxiway": "A"}),
        ("close_taxiway", "R2", {"taxiway": "B"}),
    ]
    assert all(a["is_action"] for a in actions)
    message = actions[0]["args"]["message"]
    for fact in ("FUEL", "105", "CA1234", "HIGH", "OS-01", ", ".join(impact["isolated_nodes"])):
        assert fact in message
    # A re-run proposes the very same calls.
    assert len({a["call_id"] for a in actions}) == len(actions)
    assert [
        a["call_id"]
        for a in actions_for(
            {
                "flight_no": "CA1234",
                "position": "105",
                "fluid_type": "FUEL",
                "engine_status": "RUNNING",
                "continuous": True,
            }
        )[1]
    ] == [a["call_id"] for a in actions]


def test_high_risk_on_a_taxiway_suspends_no_stand() -> None:
    _, actions = actions_for(
        {
            "flight_no": "9C8521",
            "position": "B2",
            "fluid_type": "FUEL",
            "engine_status": "RUNNING",
            "continuous": True,
        }
    )
    tools = [a["tool"] for a in actions]
    assert "request_fire_standby" in tools
    assert "suspend_stand_operations" not in tools


def test_low_risk_needs_no_fire_standby() -> None:
    _, actions = actions_for(
        {
            "flight_no": "MU5678",
            "position": "101",
            "fluid_type": "HYDRAULIC",
            "engine_status": "STOPPED",
            "continuous": False,
            "leak_size": "MEDIUM",
        }
    )
    assert summary(actions) == [
        ("notify_atc", "R0", {}),
        ("dispatch_cleanup_crew", "R1", {"position": "101"}),
        ("close_taxiway", "R2", {"taxiway": "A"}),
    ]


def test_an_impact_reaching_a_runway_closes_it() -> None:
    # Fuel, engine running at stand 101: three hops reach runway 06/24 through C1.
    impact, actions = actions_for(
        {
            "flight_no": "MU5678",
            "position": "101",
            "fluid_type": "FUEL",
            "engine_status": "RUNNING",
            "continuous": True,
        }
    )
    assert impact["runways"] == ["06/24"]
    assert ("close_runway", "R3", {"runway": "06/24"}) in summary(actions)
    assert summary(actions)[-1] == ("close_runway", "R3", {"runway": "06/24"})
