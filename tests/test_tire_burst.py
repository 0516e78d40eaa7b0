"""tire_burst (SCENARIOS.md), shipped as data only: fields, rules, radius and actions run
through the generic runtime, and the whole incident through the CLI."""

# Chinese incident reports use full-width punctuation on purpose.

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import Approval
from diagnosis.models import Event, Session
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

SLUG = "tire_burst"
TAKEOFF_DEBRIS = "MU5678 tire burst during takeoff roll on runway 06/24, tire debris on the runway"
TAXI_DEBRIS = "3U8888 在滑行道B2滑行时爆胎，地面有碎片，未起火"
STAND_FIRE = "CA1234 在105机位爆胎，轮胎起火冒烟，无碎片"

RISK_TABLE: list[tuple[str, dict[str, Any], str, int]] = [
    ("TB-01", {"fire_or_smoke": True}, "HIGH", 95),
    ("TB-02", {"phase": "TAKEOFF_ROLL", "debris": True}, "HIGH", 85),
    ("TB-03", {"debris": True, "position": "06/24"}, "HIGH", 80),
    ("TB-04", {"debris": True}, "MEDIUM", 60),
    ("TB-05", {"phase": "TAKEOFF_ROLL"}, "MEDIUM", 50),
    ("TB-05", {"phase": "LANDING_ROLL"}, "MEDIUM", 50),
    ("TB-06", {}, "LOW", 25),
]


def test_the_definition_lists_the_rules_in_order() -> None:
    assert [r["id"] for r in builtin_definition(SLUG)["risk_rules"]] == [
        "TB-01",
        "TB-02",
        "TB-03",
        "TB-04",
        "TB-05",
        "TB-06",
    ]


@pytest.mark.parametrize(("rule", "fields", "level", "score"), RISK_TABLE)
def test_each_rule_with_its_minimal_facts(
    rule: str, fields: dict[str, Any], level: str, score: int
) -> None:
    risk = assess(SLUG, fields)
    assert (risk["rule"], risk["level"], risk["score"]) == (rule, level, score)


@pytest.mark.parametrize(("rule", "fields"), [(r[0], r[1]) for r in RISK_TABLE if r[1]])
def test_each_fact_of_a_rule_is_needed(rule: str, fields: dict[str, Any]) -> None:
    for name in fields:
        without = {k: v for k, v in fields.items() if k != name}
        assert assess(SLUG, without)["rule"] != rule, f"{rule} matched without {name}"


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        (
            {"fire_or_smoke": True, "phase": "TAKEOFF_ROLL", "debris": True, "position": "06/24"},
            "TB-01",
        ),
        ({"fire_or_smoke": False, "phase": "TAKEOFF_ROLL", "debris": True}, "TB-02"),
        ({"phase": "LANDING_ROLL", "debris": True, "position": "18/36"}, "TB-03"),
        ({"phase": "LANDING_ROLL", "debris": True, "position": "R1836-1"}, "TB-03"),
        ({"phase": "TAXI", "debris": True, "position": "B2"}, "TB-04"),
        ({"phase": "LANDING_ROLL", "debris": True, "position": "105"}, "TB-04"),
        ({"phase": "LANDING_ROLL", "debris": False, "position": "06/24"}, "TB-05"),
        ({"phase": "TAXI", "debris": False, "fire_or_smoke": False}, "TB-06"),
        ({"phase": "STAND", "debris": None, "fire_or_smoke": None}, "TB-06"),
    ],
)
def test_first_match_wins(fields: dict[str, Any], rule: str) -> None:
    assert assess(SLUG, fields)["rule"] == rule


@pytest.mark.parametrize(
    ("fields", "radius"),
    [
        ({"fire_or_smoke": True, "position": "105"}, 2),
        ({"debris": True, "position": "105"}, 1),
        ({"position": "105"}, 1),
    ],
)
def test_spread_radius_by_level(fields: dict[str, Any], radius: int) -> None:
    assert plan(SLUG, fields)[1]["radius"] == radius


# --- required actions ---------------------------------------------------------------------


def test_debris_on_the_runway_at_takeoff() -> None:
    risk, impact, actions = plan(
        SLUG,
        {"flight_no": "MU5678", "phase": "TAKEOFF_ROLL", "position": "06/24", "debris": True},
    )
    assert risk["rule"] == "TB-02"
    assert impact["start"] == "R0624-2"  # a runway designator starts at its reference node
    assert actions == [
        ("notify_atc", "R0", {}),
        ("request_fire_standby", "R1", {"position": "06/24"}),
        ("fod_sweep", "R1", {"position": "06/24"}),
        ("close_taxiway", "R2", {"taxiway": "C"}),
        ("close_runway", "R3", {"runway": "06/24"}),
        ("close_runway", "R3", {"runway": "18/36"}),
        ("tow_aircraft", "R1", {"flight_no": "MU5678", "position": "06/24"}),
    ]


def test_debris_while_taxiing_closes_the_taxiway() -> None:
    risk, impact, actions = plan(
        SLUG, {"flight_no": "3U8888", "phase": "TAXI", "position": "B2", "debris": True}
    )
    assert (risk["rule"], impact["isolated_nodes"]) == ("TB-04", ["202", "B1", "B2", "B3"])
    assert actions == [
        ("notify_atc", "R0", {}),
        ("fod_sweep", "R1", {"position": "B2"}),
        ("close_taxiway", "R2", {"taxiway": "B"}),
        ("tow_aircraft", "R1", {"flight_no": "3U8888", "position": "B2"}),
    ]


def test_fire_at_the_stand_calls_the_fire_service_and_no_tow() -> None:
    risk, _, actions = plan(
        SLUG,
        {
            "flight_no": "CA1234",
            "phase": "STAND",
            "position": "105",
            "debris": False,
            "fire_or_smoke": True,
        },
    )
    assert risk["rule"] == "TB-01"
    assert actions == [
        ("notify_atc", "R0", {}),
        ("request_fire_standby", "R1", {"position": "105"}),
    ]


def test_without_debris_nothing_is_swept_or_closed() -> None:
    _, impact, actions = plan(
        SLUG, {"flight_no": "ZH9527", "phase": "LANDING_ROLL", "position": "06/24", "debris": False}
    )
    assert impact["runways"] == ["06/24"]
    assert actions == [
        ("notify_atc", "R0", {}),
        ("tow_aircraft", "R1", {"flight_no": "ZH9527", "position": "06/24"}),
    ]


# --- extraction -----------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "synonym", "expected"), synonym_cases(SLUG))
def test_every_synonym_is_recognised(field: str, synonym: str, expected: Any) -> None:
    assert extract(SLUG, synonym)[field] == expected
    assert extract(SLUG, f"Report: {synonym.upper()}, please respond.")[field] == expected


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("105机位", "105"),
        ("stand 201", "201"),
        ("滑行道B2", "B2"),
        ("taxiway A3", "A3"),
        ("跑道06/24", "06/24"),
        ("runway 18/36", "18/36"),
    ],
)
def test_the_position_is_a_stand_a_taxiway_node_or_a_runway(text: str, position: str) -> None:
    assert extract(SLUG, f"CA1234 爆胎 {text}")["position"] == position


def test_the_shipped_example_cases_pass() -> None:
    cases = check_examples(builtin_definition(SLUG), demo_graph())
    assert {case.rule for case in cases} == {f"TB-0{i}" for i in range(1, 7)}
    assert [case.problems for case in cases] == [[]] * len(cases)


# --- end to end through the CLI (offline provider) --------------------------------------


@pytest.mark.services
def test_debris_at_takeoff_end_to_end(builtin: None, capsys: pytest.CaptureFixture[str]) -> None:
    # Fire or smoke is not said: asked once; "unknown" leaves it empty and moves on.
    result = run_incident(
        capsys, SLUG, TAKEOFF_DEBRIS, "--answer", "unknown", "--decide", "approve"
    )

    assert result["status"] == "completed"
    assert result["questions"] == ["Is there fire or smoke? (Answer “unknown” if you cannot tell.)"]
    assert result["fields"] == {
        "flight_no": "MU5678",
        "phase": "TAKEOFF_ROLL",
        "position": "06/24",
        "debris": True,
    }
    assert result["risk"] == {"rule": "TB-02", "level": "HIGH", "score": 85}
    assert result["impact"]["isolated_nodes"] == [
        "C1",
        "C2",
        "R0624-1",
        "R0624-2",
        "R0624-3",
        "R1836-2",
    ]
    assert action_table(result) == [
        ("notify_atc", {}, "R0", "auto", "completed"),
        ("request_fire_standby", {"position": "06/24"}, "R1", "approved", "completed"),
        ("fod_sweep", {"position": "06/24"}, "R1", "approved", "completed"),
        ("close_taxiway", {"taxiway": "C"}, "R2", "approved", "completed"),
        ("close_runway", {"runway": "06/24"}, "R3", "approved", "completed"),
        ("close_runway", {"runway": "18/36"}, "R3", "approved", "completed"),
        (
            "tow_aircraft",
            {"flight_no": "MU5678", "position": "06/24"},
            "R1",
            "approved",
            "completed",
        ),
    ]
    assert active_restrictions() == {("taxiway", "C"), ("runway", "06/24"), ("runway", "18/36")}
    report = result["report_markdown"]
    assert report.startswith("# Tire burst response report")
    assert "TB-02" in report
    assert "| Tire debris | Debris on the ground |" in report


@pytest.mark.services
def test_smoke_on_the_runway_is_recognised_and_fire_wins(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(capsys, SLUG, "MU5678 在跑道06/24起飞滑跑时爆胎，跑道上有轮胎碎片，有烟")

    assert result["fields"]["fire_or_smoke"] is True
    assert result["risk"] == {"rule": "TB-01", "level": "HIGH", "score": 95}
    assert result["questions"] == []  # nothing left to ask


@pytest.mark.services
def test_a_missing_p2_field_is_asked_once_and_its_answer_counts(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(
        capsys, SLUG, "HU7601 着陆滑跑时在跑道18/36爆胎，跑道上有轮胎碎片", "--answer", "有烟"
    )

    assert result["questions"] == ["是否起火或冒烟？（不清楚请回答“不知道”）"]
    assert result["fields"]["fire_or_smoke"] is True
    assert result["risk"] == {"rule": "TB-01", "level": "HIGH", "score": 95}


@pytest.mark.services
def test_debris_while_taxiing_end_to_end(builtin: None, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_incident(capsys, SLUG, TAXI_DEBRIS, "--decide", "approve")

    assert result["risk"] == {"rule": "TB-04", "level": "MEDIUM", "score": 60}
    assert result["impact"]["flights"] == ["9C8521"]
    assert [(a[0], a[1]) for a in action_table(result)] == [
        ("notify_atc", {}),
        ("fod_sweep", {"position": "B2"}),
        ("close_taxiway", {"taxiway": "B"}),
        ("tow_aircraft", {"flight_no": "3U8888", "position": "B2"}),
    ]
    assert active_restrictions() == {("taxiway", "B")}
    assert result["report_markdown"].startswith("# 爆胎应急处置报告")
    assert "| 阶段 | 滑行 |" in result["report_markdown"]


@pytest.mark.services
def test_fire_at_the_stand_waits_for_the_approver(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(capsys, SLUG, STAND_FIRE)

    assert result["status"] == "waiting_user"
    assert result["risk"] == {"rule": "TB-01", "level": "HIGH", "score": 95}
    assert [(a[0], a[3], a[4]) for a in action_table(result)] == [
        ("notify_atc", "auto", "completed"),
        ("request_fire_standby", "pending", "awaiting_approval"),
    ]
    assert result["report_markdown"] == ""


# --- an optional question never holds the response up ------------------------------------

TAKEOFF_P1_ONLY = "CA1234 takeoff roll tire burst on runway 06/24, debris on runway"


@pytest.mark.services
def test_p1_facts_alone_assess_propose_and_complete(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # Fire or smoke (P2) is not said: asked alongside the approvals, never instead.
    result = run_incident(capsys, SLUG, TAKEOFF_P1_ONLY, "--decide", "approve")

    assert result["status"] == "completed"
    assert result["risk"] == {"rule": "TB-02", "level": "HIGH", "score": 85}
    assert result["questions"] == ["Is there fire or smoke? (Answer “unknown” if you cannot tell.)"]
    assert result["unanswered"] == ["fire_or_smoke"]
    assert {a[3] for a in action_table(result)} == {"auto", "approved"}
    assert ("runway", "06/24") in active_restrictions()
    report = result["report_markdown"]
    assert "**Optional question not answered:** Fire or smoke." in report.splitlines()[-1]


@pytest.mark.services
def test_the_optional_question_is_asked_alongside_the_approvals(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(capsys, SLUG, TAKEOFF_P1_ONLY)

    assert result["status"] == "waiting_user"
    assert result["risk"] == {"rule": "TB-02", "level": "HIGH", "score": 85}
    assert ("close_runway", "pending", "awaiting_approval") in [
        (a[0], a[3], a[4]) for a in action_table(result)
    ]
    session = Session.objects.get(pk=result["session"])
    assert session.snapshot["question"]["field"] == "fire_or_smoke"
    assert session.snapshot["question"]["optional"] is True
    # The proposals came before the question: it held nothing up.
    types = list(
        Event.objects.filter(session=session).order_by("seq").values_list("type", flat=True)
    )
    assert types.index("approval.required") < types.index("agent.question")
    assert result["unanswered"] == [] and result["report_markdown"] == ""


@pytest.mark.services
def test_an_answer_that_raises_the_risk_supersedes_the_open_approvals(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    taxiing = "3U8888 在滑行道B2滑行时爆胎，地面有碎片"  # fire or smoke not said: TB-04
    result = run_incident(capsys, SLUG, taxiing, "--answer", "起火了")

    assert result["fields"]["fire_or_smoke"] is True
    assert result["risk"] == {"rule": "TB-01", "level": "HIGH", "score": 95}
    session = Session.objects.get(pk=result["session"])
    risk = session.snapshot["risk"]
    assert risk["reassessed_from"]["rule"] == "TB-04"
    assert risk["answered"] == {"fire_or_smoke": True}
    withdrawn = {
        e.payload["tool_name"]: (e.payload["withdrawn"], e.payload["reason"])
        for e in Event.objects.filter(session=session, type="approval.canceled")
    }
    assert withdrawn["fod_sweep"] == (
        "superseded",
        "superseded: an answer re-assessed the risk; asked again for the new facts",
    )
    open_now = {
        (a.action_name, a.tool_call.call_id.endswith("#r1"))
        for a in Approval.objects.filter(session=session).open()
    }
    # New: the fire service (HIGH); the sweep asked again under the new facts.
    assert ("request_fire_standby", True) in open_now
    assert ("fod_sweep", True) in open_now
    assert not any(not revised for _, revised in open_now)
    assert result["unanswered"] == []


@pytest.mark.services
def test_an_answer_that_changes_nothing_leaves_the_approvals_open(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(
        capsys, SLUG, "3U8888 在滑行道B2滑行时爆胎，地面有碎片", "--answer", "未起火"
    )

    assert result["fields"]["fire_or_smoke"] is False
    assert result["risk"] == {"rule": "TB-04", "level": "MEDIUM", "score": 60}
    session = Session.objects.get(pk=result["session"])
    assert not Event.objects.filter(session=session, type="approval.canceled").exists()
    assert "reassessed_from" not in session.snapshot["risk"]
