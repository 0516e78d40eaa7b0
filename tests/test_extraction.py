"""The offline extractor reads oil_spill incident reports the way an operator writes them."""

# Chinese incident reports use full-width punctuation on purpose.

from __future__ import annotations

from typing import Any

import pytest

from diagnosis.agent.reading import CJK, detect_language
from packs.airport.agent.extraction import extract_fields
from tests.builtin_data import builtin_definition, demo_graph, oil_spill


def extract(text: str, asked: str | None = None) -> dict[str, Any]:
    return {
        name: found.value
        for name, found in extract_fields(oil_spill(), text, demo_graph(), asked).items()
    }


def synonym_cases() -> list[Any]:
    """Every synonym (and fallback) of every enum/bool field of the shipped definition, so
    a synonym added to the data later is covered without touching this file."""
    cases = []
    for name, spec in oil_spill()["fields"].items():
        if spec["type"] not in ("enum", "bool"):
            continue
        for raw, value_spec in spec["values"].items():
            expected = raw == "true" if spec["type"] == "bool" else raw
            for synonym in [*value_spec.get("synonyms", []), *value_spec.get("fallback", [])]:
                cases.append(
                    pytest.param(name, str(synonym), expected, id=f"{name}={raw}:{synonym}")
                )
    return cases


SYNONYMS = synonym_cases()


def test_every_enum_and_bool_field_has_synonyms_to_test() -> None:
    fields = {case.values[0] for case in SYNONYMS}
    assert fields == {"fluid_type", "engine_status", "continuous", "leak_size"}
    assert any(CJK.search(case.values[1]) for case in SYNONYMS)
    assert any(not CJK.search(case.values[1]) for case in SYNONYMS)


@pytest.mark.parametrize(("field", "synonym", "expected"), SYNONYMS)
def test_synonym_alone(field: str, synonym: str, expected: Any) -> None:
    assert extract(synonym)[field] == expected


@pytest.mark.parametrize(("field", "synonym", "expected"), SYNONYMS)
def test_synonym_in_a_sentence_of_its_language(field: str, synonym: str, expected: Any) -> None:
    if CJK.search(synonym):
        sentence = f"现场报告：{synonym}，请尽快处理。"
        assert detect_language(sentence) == "zh"
    else:
        # Case-insensitive: operators type in capitals too.
        sentence = f"Report from the apron: {synonym.upper()}, please respond."
        assert detect_language(sentence) == "en"
    assert extract(sentence)[field] == expected


# --- overlapping synonyms --------------------------------------------------------------


def test_stopped_leaking_is_about_the_leak_not_the_engine() -> None:
    found = extract("Hydraulic leak at stand 101, stopped leaking")
    assert found["continuous"] is False
    assert "engine_status" not in found


def test_engine_running_and_leak_stopped_together() -> None:
    found = extract("engine running, stopped leaking")
    assert found["engine_status"] == "RUNNING"
    assert found["continuous"] is False


def test_not_shut_down_is_running() -> None:
    assert extract("105机位燃油泄漏，飞机未关车")["engine_status"] == "RUNNING"


def test_stopped_running_is_stopped() -> None:
    assert extract("发动机已停止运转")["engine_status"] == "STOPPED"


def test_unspecified_fluid_leak_is_fuel() -> None:
    assert extract("105机位油料泄漏")["fluid_type"] == "FUEL"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("105机位油料泄漏，是液压油", "HYDRAULIC"),
        ("液压油料泄漏", "HYDRAULIC"),
        ("润滑油料泄漏", "OIL"),
        ("机油料泄漏", "OIL"),
        ("油料泄漏, hydraulic fluid", "HYDRAULIC"),
    ],
)
def test_unspecified_fluid_leak_gives_way_to_a_named_fluid(text: str, expected: str) -> None:
    assert extract(text)["fluid_type"] == expected


def test_a_later_mention_of_the_same_length_wins() -> None:
    # "持续" then a correction "不再" (both two characters).
    assert extract("刚才还持续，现在不再")["continuous"] is False


# --- leak size from an area ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("6平方米", "LARGE"),
        ("6 m2", "LARGE"),
        ("6 sqm", "LARGE"),
        ("6m2", "LARGE"),
        ("5.5 square meters", "LARGE"),
        ("exactly 5 m2", "MEDIUM"),
        ("5平方米", "MEDIUM"),
        ("about 2 m2", "MEDIUM"),
        ("1 m2", "MEDIUM"),
        ("0.5 m²", "SMALL"),
        ("0.9 平米", "SMALL"),
    ],
)
def test_leak_size_from_area(text: str, expected: str) -> None:
    assert extract(text)["leak_size"] == expected


def test_an_area_is_not_a_flight_number() -> None:
    assert "flight_no" not in extract("fuel leak about 6m2")


def test_leak_size_is_not_invented() -> None:
    assert "leak_size" not in extract("CA1234 在105机位燃油泄漏")


# --- flight numbers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CA1234 在105机位燃油泄漏", "CA1234"),
        ("3U8888 reports a leak", "3U8888"),
        ("航班9C8521漏油", "9C8521"),
        ("ca1234 stand 105", "CA1234"),
        ("XY123 at stand 105", "XY123"),  # well-formed, even if not in today's schedule
        ("A320 at stand 105, flight CA1234", "CA1234"),
    ],
)
def test_flight_number(text: str, expected: str) -> None:
    assert extract(text)["flight_no"] == expected


@pytest.mark.parametrize(
    "text", ["A320", "A320 at stand 105 leaking fuel", "B737-800 机型", "滑行道B2", "taxiway A3"]
)
def test_aircraft_types_and_node_ids_are_not_flight_numbers(text: str) -> None:
    assert "flight_no" not in extract(text)


# --- positions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("105", "105"),
        ("105机位", "105"),
        ("机位105", "105"),
        ("105号机位", "105"),
        ("stand 105", "105"),
        ("Stand 105", "105"),
        ("滑行道B2", "B2"),
        ("B2滑行道", "B2"),
        ("taxiway B2", "B2"),
        ("taxiway b2", "B2"),
        ("CA1234 在105机位燃油泄漏", "105"),
    ],
)
def test_position(text: str, expected: str) -> None:
    assert extract(text)["position"] == expected


@pytest.mark.parametrize("text", ["stand 999", "999机位", "taxiway Z9"])
def test_unknown_position_is_not_extracted(text: str) -> None:
    assert "position" not in extract(text)


# --- bare answers to a question ---------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("yes", True),
        ("Yes.", True),
        ("是", True),
        ("是的", True),
        ("有", True),
        ("no", False),
        ("No", False),
        ("否", False),
        ("否。", False),
        ("没有", False),
    ],
)
def test_bare_yes_no_answers_the_asked_bool_field(answer: str, expected: bool) -> None:
    assert extract(answer, asked="continuous") == {"continuous": expected}


@pytest.mark.parametrize(
    ("slug", "asked", "answer", "expected"),
    [
        ("bird_strike", "engine_ingestion", "是，左发吸入", {"engine_ingestion": True}),
        ("bird_strike", "engine_ingestion", "对 左边那台", {"engine_ingestion": True}),
        ("bird_strike", "engine_ingestion", "Yes, the left one", {"engine_ingestion": True}),
        ("oil_spill", "continuous", "不是，已经止住了", {"continuous": False}),
        ("oil_spill", "continuous", "no, it stopped", {"continuous": False}),
        # The rest of the answer is read as any message: another field's words count.
        (
            "tire_burst",
            "debris",
            "是，跑道上有碎片，冒烟了",
            {"debris": True, "fire_or_smoke": True},
        ),
        # A synonym's own phrase is no yes/no opening the answer: "no debris" states debris.
        ("tire_burst", "fire_or_smoke", "no debris", {"debris": False}),
        ("tire_burst", "fire_or_smoke", "有碎片", {"debris": True}),
    ],
)
def test_a_yes_or_no_opening_a_longer_answer_answers_the_asked_field(
    slug: str, asked: str, answer: str, expected: dict[str, Any]
) -> None:
    found = {
        n: e.value
        for n, e in extract_fields(builtin_definition(slug), answer, demo_graph(), asked).items()
    }
    assert {k: v for k, v in found.items() if k in expected or k == asked} == expected


@pytest.mark.parametrize("answer", ["yes", "是"])
def test_bare_yes_means_nothing_unless_a_bool_field_was_asked(answer: str) -> None:
    assert extract(answer) == {}
    assert extract(answer, asked="engine_status") == {}


@pytest.mark.parametrize("answer", ["嗯", "maybe", "not sure"])
def test_an_unclear_answer_sets_nothing(answer: str) -> None:
    assert extract(answer, asked="continuous") == {}


def test_a_synonym_wins_over_a_bare_answer() -> None:
    assert extract("已止住", asked="continuous") == {"continuous": False}


# --- language -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏", "zh"),
        ("MU5678 stand 101 hydraulic leak, engines off, no longer leaking, about 2 m2", "en"),
        ("stand 105 漏油", "zh"),
        ("CA1234 105", "en"),
    ],
)
def test_detect_language(text: str, expected: str) -> None:
    assert detect_language(text) == expected


def test_worked_examples_read_completely() -> None:
    assert extract("CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏") == {
        "flight_no": "CA1234",
        "position": "105",
        "fluid_type": "FUEL",
        "engine_status": "RUNNING",
        "continuous": True,
    }
    assert extract(
        "MU5678 stand 101 hydraulic leak, engines off, no longer leaking, about 2 m2"
    ) == {
        "flight_no": "MU5678",
        "position": "101",
        "fluid_type": "HYDRAULIC",
        "engine_status": "STOPPED",
        "continuous": False,
        "leak_size": "MEDIUM",
    }


# --- one span, one field ----------------------------------------------------------------


def readings(text: str, asked: str | None = None) -> dict[str, tuple[Any, str, bool]]:
    return {
        name: (found.value, found.evidence, found.confirmed)
        for name, found in extract_fields(oil_spill(), text, demo_graph(), asked).items()
    }


def test_still_running_is_about_the_engine_not_the_leak() -> None:
    # The live defect: "仍在" (a synonym of a continuing leak) modifies "运转" here.
    assert readings("发动机仍在运转", asked="engine_status") == {
        "engine_status": ("RUNNING", "运转", True),
        "continuous": (True, "仍在运转", False),  # to be confirmed by the operator
    }


def test_no_longer_running_says_nothing_certain_about_either_field() -> None:
    assert readings("发动机不再运转") == {"continuous": (False, "不再运转", False)}


def test_an_aspect_word_of_its_own_still_counts() -> None:
    assert readings("仍在运转，持续漏") == {
        "engine_status": ("RUNNING", "运转", True),
        "continuous": (True, "持续", True),
    }
    assert readings("燃油持续泄漏") == {
        "fluid_type": ("FUEL", "燃油", True),
        "continuous": (True, "持续", True),
    }


def test_english_phrases_name_their_own_subject() -> None:
    assert readings("engine running, still leaking") == {
        "engine_status": ("RUNNING", "engine running", True),
        "continuous": (True, "still leaking", True),
    }


def test_evidence_is_the_operators_words_with_their_span() -> None:
    text = "Stand 105: JET FUEL leaking"
    found = extract_fields(oil_spill(), text, demo_graph())
    start, end = found["fluid_type"].span or (0, 0)
    assert text[start:end] == found["fluid_type"].evidence == "JET FUEL"
    start, end = found["position"].span or (0, 0)
    assert text[start:end] == "Stand 105"


# --- denial and doubt --------------------------------------------------------------------


def read_as(slug: str, text: str) -> dict[str, Any]:
    return {
        name: found.value
        for name, found in extract_fields(builtin_definition(slug), text, demo_graph()).items()
        if found.confirmed
    }


@pytest.mark.parametrize(
    ("slug", "text", "field"),
    [
        # Each of these used to read as the value the operator denied.
        ("oil_spill", "发动机没有关车", "engine_status"),
        ("oil_spill", "发动机没在运转", "engine_status"),
        ("oil_spill", "the engine is not running", "engine_status"),
        ("oil_spill", "engines have not been shut down", "engine_status"),
        ("oil_spill", "engine no longer running", "engine_status"),
        ("oil_spill", "not sure whether the engine is running", "engine_status"),
        ("oil_spill", "不确定是否持续", "continuous"),
        ("oil_spill", "未停止泄漏", "continuous"),
        ("oil_spill", "不是燃油", "fluid_type"),
        ("bird_strike", "没有吸入发动机", "engine_ingestion"),
        ("bird_strike", "跑道上没有发现残骸", "remains_on_runway"),
        ("bird_strike", "did not see any carcass", "remains_on_runway"),
        ("tire_burst", "没有发现碎片", "debris"),
        ("tire_burst", "there is no tire debris", "debris"),
        ("tire_burst", "no visible smoke", "fire_or_smoke"),
        ("tire_burst", "there isn\u2019t any smoke", "fire_or_smoke"),
        # Said, right after, to have ended: "running has stopped" read as running.
        ("oil_spill", "发动机运转已经停了", "engine_status"),
        ("oil_spill", "发动机运转停止了", "engine_status"),
        ("tire_burst", "冒烟已经没了", "fire_or_smoke"),
        ("tire_burst", "the smoke has stopped", "fire_or_smoke"),
        ("tire_burst", "smoke is gone", "fire_or_smoke"),
    ],
)
def test_a_denied_or_doubted_synonym_is_no_reading(slug: str, text: str, field: str) -> None:
    # Not the opposite value either: the agent asks the operator.
    assert field not in read_as(slug, text)


@pytest.mark.parametrize(
    ("slug", "text", "field", "expected"),
    [
        # A denial word inside a synonym is the synonym's own.
        ("oil_spill", "燃油不断泄漏", "continuous", True),
        ("oil_spill", "飞机未关车", "engine_status", "RUNNING"),
        ("oil_spill", "no longer leaking", "continuous", False),
        ("bird_strike", "没有吸入", "engine_ingestion", False),
        ("tire_burst", "no debris", "debris", False),
        # A denial in another clause governs nothing here.
        ("oil_spill", "没有人员受伤，发动机运转", "engine_status", "RUNNING"),
        ("oil_spill", "No fire, but engine running", "engine_status", "RUNNING"),
        ("oil_spill", "no injuries and the engine is running", "engine_status", "RUNNING"),
        ("tire_burst", "无碎片，轮胎冒烟", "fire_or_smoke", True),
        # Nor one further back than the window.
        ("oil_spill", "没有任何人员在附近，燃油", "fluid_type", "FUEL"),
        # 非常 is "very": 非 is not a denial.
        ("oil_spill", "燃油泄漏，非常大面积", "leak_size", "LARGE"),
        # How operators say a leak stopped.
        ("oil_spill", "已经停止泄漏", "continuous", False),
        ("oil_spill", "漏油已经停止", "continuous", False),
        ("oil_spill", "油已经不漏了", "continuous", False),
        ("oil_spill", "the leak has stopped", "continuous", False),
        # An end said in another clause, further on, or of something else is not this
        # state's; 停在 is parked at.
        ("oil_spill", "发动机运转，漏油停了", "engine_status", "RUNNING"),
        ("oil_spill", "the engine is running, the leak stopped", "engine_status", "RUNNING"),
        ("oil_spill", "发动机关车后漏油停了", "engine_status", "STOPPED"),
        ("oil_spill", "飞机停在105机位，发动机运转中", "engine_status", "RUNNING"),
        ("oil_spill", "发动机运转着停在105机位", "engine_status", "RUNNING"),
        # The word that ends it is the other value's synonym: that value reads.
        ("oil_spill", "the engine running has stopped", "engine_status", "STOPPED"),
        ("tire_burst", "smoke from the tire until the truck stopped", "fire_or_smoke", True),
    ],
)
def test_a_synonym_outside_a_denial_still_reads(
    slug: str, text: str, field: str, expected: Any
) -> None:
    assert read_as(slug, text)[field] == expected


def test_the_leak_stopping_says_nothing_about_the_engine() -> None:
    # "stopped" is also the engine's synonym: the longer leak phrase takes the span.
    assert read_as("oil_spill", "leak has stopped") == {"continuous": False}
