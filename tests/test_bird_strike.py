"""bird_strike (SCENARIOS.md), shipped as data only: fields, rules, radius and actions run
through the generic runtime, and the whole incident through the CLI."""

# Chinese incident reports use full-width punctuation on purpose.

from __future__ import annotations

from typing import Any

import pytest

from packs.airport.agent.selfcheck import check_examples
from tests.builtin_data import builtin_definition, demo_graph
from tests.scenario_helpers import (
    action_table,
    active_restrictions,
    assess,
    extract,
    plan,
    run_incident,
    synonym_cases,
)

SLUG = "bird_strike"
ENGINE_ON_TAKEOFF = "CA1234 起飞滑跑时在跑道06/24发生鸟击，鸟吸入发动机"
LARGE_BIRD_LANDING = (
    "HU7601 bird strike during landing roll on runway 06/24, no engine ingestion, large bird"
)
REMAINS_AFTER_CLIMB = "3U8888 爬升阶段在跑道18/36鸟击，撞到机身，跑道上有残骸"

# The rules of SCENARIOS.md, each with the minimal facts that make it match.
RISK_TABLE: list[tuple[str, dict[str, Any], str, int]] = [
    ("BS-01", {"engine_ingestion": True, "phase": "TAKEOFF_ROLL"}, "HIGH", 90),
    ("BS-01", {"engine_ingestion": True, "phase": "CLIMB"}, "HIGH", 90),
    ("BS-02", {"engine_ingestion": True}, "HIGH", 80),
    ("BS-03", {"bird_size": "LARGE"}, "MEDIUM", 60),
    ("BS-04", {"remains_on_runway": True}, "MEDIUM", 50),
    ("BS-05", {}, "LOW", 20),
]


def test_the_definition_lists_the_rules_in_order() -> None:
    assert [r["id"] for r in builtin_definition(SLUG)["risk_rules"]] == [
        "BS-01",
        "BS-02",
        "BS-03",
        "BS-04",
        "BS-05",
    ]


@pytest.mark.parametrize(("rule", "fields", "level", "score"), RISK_TABLE)
def test_each_rule_with_its_minimal_facts(
    rule: str, fields: dict[str, Any], level: str, score: int
) -> None:
    risk = assess(SLUG, fields)
    assert (risk["rule"], risk["level"], risk["score"]) == (rule, level, score)


@pytest.mark.parametrize(
    ("rule", "fields"), [(row[0], row[1]) for row in RISK_TABLE if len(row[1]) > 0]
)
def test_each_fact_of_a_rule_is_needed(rule: str, fields: dict[str, Any]) -> None:
    for name in fields:
        without = {k: v for k, v in fields.items() if k != name}
        assert assess(SLUG, without)["rule"] != rule, f"{rule} matched without {name}"


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        # All of BS-02..BS-05 hold: the first one wins.
        (
            {
                "engine_ingestion": True,
                "phase": "LANDING_ROLL",
                "bird_size": "LARGE",
                "remains_on_runway": True,
            },
            "BS-02",
        ),
        ({"engine_ingestion": False, "bird_size": "LARGE", "remains_on_runway": True}, "BS-03"),
        ({"engine_ingestion": False, "bird_size": "SMALL", "remains_on_runway": True}, "BS-04"),
        ({"engine_ingestion": True, "phase": "APPROACH"}, "BS-02"),
        ({"engine_ingestion": False, "phase": "TAKEOFF_ROLL"}, "BS-05"),
        # An unknown field never matches a condition on it.
        ({"phase": "TAKEOFF_ROLL", "engine_ingestion": None}, "BS-05"),
    ],
)
def test_first_match_wins(fields: dict[str, Any], rule: str) -> None:
    assert assess(SLUG, fields)["rule"] == rule


@pytest.mark.parametrize(
    ("fields", "radius"),
    [
        ({"engine_ingestion": True, "runway": "06/24"}, 2),
        ({"bird_size": "LARGE", "runway": "06/24"}, 1),
        ({"runway": "06/24"}, 1),
    ],
)
def test_spread_radius_by_level(fields: dict[str, Any], radius: int) -> None:
    assert plan(SLUG, fields)[1]["radius"] == radius


def test_impact_starts_at_the_struck_runways_reference_node() -> None:
    _, impact, _ = plan(SLUG, {"engine_ingestion": True, "phase": "CLIMB", "runway": "06/24"})
    assert impact["start"] == "R0624-2"
    assert impact["isolated_nodes"] == ["C1", "C2", "R0624-1", "R0624-2", "R0624-3", "R1836-2"]
    assert impact["runways"] == ["06/24", "18/36"]
    assert impact["taxiways"] == ["C"]

    _, impact, _ = plan(SLUG, {"bird_size": "LARGE", "runway": "18/36"})
    assert impact["start"] == "R1836-2"
    assert impact["isolated_nodes"] == ["R0624-3", "R1836-1", "R1836-2"]


# --- required actions ---------------------------------------------------------------------


def test_high_closes_the_struck_runway_only_and_calls_the_fire_service() -> None:
    _, impact, actions = plan(
        SLUG, {"flight_no": "CA1234", "engine_ingestion": True, "phase": "CLIMB", "runway": "06/24"}
    )
    assert impact["runways"] == ["06/24", "18/36"]  # 18/36 is in the zone, not struck
    assert actions == [
        ("notify_atc", "R0", {}),
        ("runway_inspection", "R1", {"runway": "06/24"}),
        ("request_fire_standby", "R1", {"position": "06/24"}),
        ("close_runway", "R3", {"runway": "06/24"}),
    ]


def test_remains_on_the_runway_close_it_without_a_high_risk() -> None:
    risk, _, actions = plan(SLUG, {"remains_on_runway": True, "runway": "18/36"})
    assert risk["level"] == "MEDIUM"
    assert actions == [
        ("notify_atc", "R0", {}),
        ("runway_inspection", "R1", {"runway": "18/36"}),
        ("close_runway", "R3", {"runway": "18/36"}),
    ]


@pytest.mark.parametrize(
    "fields",
    [
        {"bird_size": "LARGE", "runway": "06/24"},  # MEDIUM, no remains known
        {"remains_on_runway": False, "runway": "06/24"},  # LOW, runway clear
        {"runway": "06/24"},  # LOW
    ],
)
def test_no_closure_below_high_without_remains(fields: dict[str, Any]) -> None:
    _, _, actions = plan(SLUG, fields)
    assert actions == [
        ("notify_atc", "R0", {}),
        ("runway_inspection", "R1", {"runway": "06/24"}),
    ]


def test_atc_is_told_the_flight_phase_runway_and_rule() -> None:
    from packs.airport.agent import policy

    definition, graph = builtin_definition(SLUG), demo_graph()
    fields = {"flight_no": "CA1234", "engine_ingestion": True, "phase": "CLIMB", "runway": "06/24"}
    risk = policy.assess_risk(definition, fields, graph)
    impact = policy.analyze_impact(definition, fields, graph, risk["level"])
    message = policy.required_actions(definition, fields, graph, risk, impact)[0]["args"]["message"]
    assert message == (
        "Bird strike, flight CA1234 (CLIMB) on runway 06/24: risk HIGH (BS-01), "
        "isolate C1, C2, R0624-1, R0624-2, R0624-3, R1836-2"
    )


# --- extraction -----------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "synonym", "expected"), synonym_cases(SLUG))
def test_every_synonym_is_recognised(field: str, synonym: str, expected: Any) -> None:
    assert extract(SLUG, synonym)[field] == expected
    assert extract(SLUG, f"Report: {synonym.upper()}, please respond.")[field] == expected


@pytest.mark.parametrize(
    ("text", "runway"),
    [("跑道06/24", "06/24"), ("runway 18/36", "18/36"), ("RWY 06/24", "06/24"), ("06/24", "06/24")],
)
def test_the_runway_is_named_by_its_designator(text: str, runway: str) -> None:
    assert extract(SLUG, f"CA1234 鸟击 {text}")["runway"] == runway


def test_a_stand_is_not_a_runway() -> None:
    assert "runway" not in extract(SLUG, "CA1234 在105机位鸟击")


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("未吸入发动机，只打到机身", {"engine_ingestion": False}),
        ("no engine ingestion", {"engine_ingestion": False}),
        ("ingested by engine 2", {"engine_ingestion": True}),
        ("跑道上无残骸", {"remains_on_runway": False}),
        ("after takeoff", {"phase": "CLIMB"}),
        ("landing roll", {"phase": "LANDING_ROLL"}),
    ],
)
def test_the_longer_synonym_wins(text: str, fields: dict[str, Any]) -> None:
    found = extract(SLUG, text)
    assert {k: found.get(k) for k in fields} == fields


def test_the_shipped_example_cases_pass() -> None:
    cases = check_examples(builtin_definition(SLUG), demo_graph())
    assert {case.rule for case in cases} == {"BS-01", "BS-02", "BS-03", "BS-04", "BS-05"}
    assert [case.problems for case in cases] == [[]] * len(cases)


# --- end to end through the CLI (offline provider) --------------------------------------


@pytest.mark.services
def test_engine_ingestion_on_takeoff_end_to_end(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(capsys, SLUG, ENGINE_ON_TAKEOFF, "--decide", "approve")

    assert result["status"] == "completed"
    assert result["questions"] == []
    assert result["fields"] == {
        "flight_no": "CA1234",
        "phase": "TAKEOFF_ROLL",
        "engine_ingestion": True,
        "runway": "06/24",
    }
    assert result["risk"] == {"rule": "BS-01", "level": "HIGH", "score": 90}
    assert result["impact"] == {
        "radius": 2,
        "isolated_nodes": ["C1", "C2", "R0624-1", "R0624-2", "R0624-3", "R1836-2"],
        "taxiways": ["C"],
        "runways": ["06/24", "18/36"],
        "stands": [],
        "flights": [],
    }
    assert action_table(result) == [
        ("notify_atc", {}, "R0", "auto", "completed"),
        ("runway_inspection", {"runway": "06/24"}, "R1", "approved", "completed"),
        ("request_fire_standby", {"position": "06/24"}, "R1", "approved", "completed"),
        ("close_runway", {"runway": "06/24"}, "R3", "approved", "completed"),
    ]
    assert active_restrictions() == {("runway", "06/24")}
    report = result["report_markdown"]
    assert report.startswith("# 鸟击应急处置报告")
    assert "BS-01" in report
    assert "| 飞行阶段 | 起飞滑跑 |" in report
    assert "| 是否吸入发动机 | 吸入发动机 |" in report
    assert "跑道参考点：R0624-2（跑道 06/24）" in report


@pytest.mark.services
def test_large_bird_on_landing_is_inspected_not_closed(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(capsys, SLUG, LARGE_BIRD_LANDING, "--decide", "approve")

    assert result["status"] == "completed"
    assert result["risk"] == {"rule": "BS-03", "level": "MEDIUM", "score": 60}
    assert result["impact"]["isolated_nodes"] == ["R0624-1", "R0624-2", "R0624-3"]
    assert action_table(result) == [
        ("notify_atc", {}, "R0", "auto", "completed"),
        ("runway_inspection", {"runway": "06/24"}, "R1", "approved", "completed"),
    ]
    assert active_restrictions() == set()
    assert result["report_markdown"].startswith("# Bird strike response report")
    assert "| Bird size | Large |" in result["report_markdown"]


@pytest.mark.services
def test_missing_fields_are_asked_and_answers_used(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(
        capsys,
        SLUG,
        "MU5678 鸟击",
        "--answer",
        "爬升",
        "--answer",
        "是",
        "--answer",
        "18/36",
        "--decide",
        "reject",
        "--reason",
        "crew reports no damage",
    )
    fields = builtin_definition(SLUG)["fields"]

    assert result["questions"] == [
        fields["phase"]["ask"]["zh"],
        fields["engine_ingestion"]["ask"]["zh"],
        fields["runway"]["ask"]["zh"],
    ]
    assert result["status"] == "completed"
    assert result["risk"] == {"rule": "BS-01", "level": "HIGH", "score": 90}
    assert [(a[0], a[3]) for a in action_table(result)] == [
        ("notify_atc", "auto"),
        ("runway_inspection", "rejected"),
        ("request_fire_standby", "rejected"),
        ("close_runway", "rejected"),
    ]
    assert active_restrictions() == set()
    assert "crew reports no damage" in result["report_markdown"]


@pytest.mark.services
def test_remains_after_climb_close_the_runway(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(capsys, SLUG, REMAINS_AFTER_CLIMB, "--decide", "approve")

    assert result["risk"] == {"rule": "BS-04", "level": "MEDIUM", "score": 50}
    assert [(a[0], a[1], a[3]) for a in action_table(result)] == [
        ("notify_atc", {}, "auto"),
        ("runway_inspection", {"runway": "18/36"}, "approved"),
        ("close_runway", {"runway": "18/36"}, "approved"),
    ]
    assert active_restrictions() == {("runway", "18/36")}
