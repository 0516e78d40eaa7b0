"""Grounding: a field value counts only with evidence in the operator's text; an
ambiguous or invented P1 value is put to the operator, never assumed, and never drives a
rule. Includes the live defect: after the engine question, "发动机仍在运转" set the leak
as continuing (evidence "仍在") and the agent chose OS-01 without asking."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from diagnosis.actions import do_answer, do_create_session
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.agent.reading import Claim
from diagnosis.models import Event, LLMCall, Session
from packs.airport.agent.extraction import extract_fields
from packs.airport.agent.grounding import confirmation_answer, find_quote, ground, settle
from scenarios_admin.builtin import DATA_DIR, read_yaml
from scenarios_admin.models import Scenario
from tests.builtin_data import demo_graph, oil_spill
from tests.llm_helpers import fake_llm, fake_provider

__all__ = ["fake_llm"]  # the fixture


def grounded(text: str, claims: dict[str, Claim]) -> dict[str, tuple[Any, bool]]:
    """The verdict on each claim (what the synonyms read of other fields left out)."""
    return {
        name: (found.value, found.confirmed)
        for name, found in ground(oil_spill(), text, demo_graph(), claims).items()
        if name in claims
    }


def read(text: str, asked: str | None = None) -> dict[str, tuple[Any, bool]]:
    """What grounding keeps when the model claims nothing."""
    found = ground(oil_spill(), text, demo_graph(), {}, asked)
    return {name: (e.value, e.confirmed) for name, e in found.items()}


# --- the offline extractor keeps today's behaviour on every example case ----------------


@pytest.mark.parametrize(
    "path", sorted((DATA_DIR / "scenarios").glob("*.yaml")), ids=lambda p: p.stem
)
def test_every_example_case_reads_with_nothing_to_confirm(path: Any) -> None:
    """Grounding adds questions only where a reading is ambiguous; no shipped example is."""
    definition = read_yaml(path)
    for example in definition["examples"]:
        found = extract_fields(definition, example["text"], demo_graph())
        assert [name for name, e in found.items() if not e.confirmed] == [], example["text"]


# --- the model's values ---------------------------------------------------------------


def test_a_value_the_synonyms_tie_to_the_text_counts() -> None:
    found = ground(
        oil_spill(),
        "CA1234 在105机位燃油泄漏",
        demo_graph(),
        {"fluid_type": Claim("FUEL", "made up"), "flight_no": Claim("ca1234", "")},
    )
    assert (found["fluid_type"].value, found["fluid_type"].evidence) == ("FUEL", "燃油")
    assert found["fluid_type"].confirmed
    assert (found["flight_no"].value, found["flight_no"].confirmed) == ("CA1234", True)


def test_a_quote_that_exists_and_states_the_value_counts() -> None:
    # "ca 1234": no synonym reads it (the space), the model's quote states it.
    found = ground(
        oil_spill(),
        "flight ca 1234 leaking fuel",
        demo_graph(),
        {"flight_no": Claim("CA1234", "CA 1234")},
    )
    assert (found["flight_no"].value, found["flight_no"].evidence) == ("CA1234", "ca 1234")
    assert found["flight_no"].confirmed


def test_a_quote_for_a_choice_is_put_to_the_operator_with_the_quote() -> None:
    """Words exist, but what they mean is the model's reading: no synonym ties "spooled
    down" to STOPPED, so the operator confirms it, shown the words it came from."""
    text = "MU5678 at stand 101, both engines spooled down"
    found = ground(
        oil_spill(),
        text,
        demo_graph(),
        {"engine_status": Claim("STOPPED", "Engines  spooled down")},
    )
    assert not found["engine_status"].confirmed
    assert found["engine_status"].evidence == "engines spooled down"  # as the operator wrote it


def test_a_word_of_the_text_does_not_make_a_choice_true() -> None:
    """The live defect by the model's path: after the engine question, "仍在" (or "在")
    of "发动机仍在运转" quoted as a continuing leak; and "泄漏" (any leak) for one."""
    for quote in ("仍在", "在", "发动机仍在运转"):
        found = ground(
            oil_spill(),
            "发动机仍在运转",
            demo_graph(),
            {"engine_status": Claim("RUNNING", "运转"), "continuous": Claim(True, quote)},
            "engine_status",
        )
        assert (found["engine_status"].value, found["engine_status"].confirmed) == ("RUNNING", True)
        assert (found["continuous"].value, found["continuous"].confirmed) == (True, False), quote
    assert grounded("CA1234 在105机位燃油泄漏", {"continuous": Claim(True, "泄漏")}) == {
        "continuous": (True, False)
    }


def test_invented_values_are_not_confirmed() -> None:
    assert grounded(
        "fuel everywhere at the stand, hurry",
        {
            "flight_no": Claim("CA1234", "flight CA1234"),  # quote not in the text
            "position": Claim("105", "the stand"),  # quote exists, but does not name 105
            "engine_status": Claim("RUNNING", ""),
            "continuous": Claim(True, "still leaking"),
        },
    ) == {
        "flight_no": ("CA1234", False),
        "position": ("105", False),
        "engine_status": ("RUNNING", False),
        "continuous": (True, False),
    }


def test_what_the_synonyms_read_counts_where_the_model_said_nothing() -> None:
    """A model that leaves fields out does not hide what the operator plainly wrote;
    an ambiguous reading is still put to the operator."""
    assert read("CA1234 fuel leak at stand 105, engine running") == {
        "flight_no": ("CA1234", True),
        "position": ("105", True),
        "fluid_type": ("FUEL", True),
        "engine_status": ("RUNNING", True),
    }
    assert read("CA1234", "flight_no") == {"flight_no": ("CA1234", True)}  # a bare answer
    assert read("CA1234 在105机位燃油泄漏，发动机仍在运转")["continuous"] == (True, False)


def test_a_value_outside_the_scenario_is_dropped() -> None:
    assert (
        grounded("fuel leak", {"leak_size": Claim("HUGE", "leak"), "position": Claim("999", "")})
        == {}
    )


def test_a_span_that_evidences_one_field_does_not_evidence_another() -> None:
    # The model quotes the engine's words as proof that the leak continues.
    found = grounded(
        "CA1234 105机位燃油泄漏，发动机运转",
        {"engine_status": Claim("RUNNING", "发动机运转"), "continuous": Claim(True, "发动机运转")},
    )
    assert found == {"engine_status": ("RUNNING", True), "continuous": (True, False)}


def test_the_words_contradicting_the_model_win_and_the_models_value_is_noted() -> None:
    found = ground(
        oil_spill(), "液压油泄漏", demo_graph(), {"fluid_type": Claim("FUEL", "液压油泄漏")}
    )
    fluid = found["fluid_type"]
    assert (fluid.value, fluid.confirmed, fluid.dropped) == ("HYDRAULIC", True, "FUEL")


def test_the_reporters_words_win_over_every_wrong_model_value() -> None:
    """Issue 32: "CA1234 105机位 燃油泄漏" read by a model as MU9999 / 106 / HYDRAULIC
    (quoting its own words, or the text's): the text's own values, each model value noted."""
    text = "CA1234 105机位 燃油泄漏"
    for quotes in (("MU9999", "106机位", "液压油"), ("CA1234", "105机位", "燃油")):
        claims = {
            "flight_no": Claim("MU9999", quotes[0]),
            "position": Claim("106", quotes[1]),
            "fluid_type": Claim("HYDRAULIC", quotes[2]),
        }
        found = ground(oil_spill(), text, demo_graph(), claims)
        assert {n: (e.value, e.confirmed, e.dropped) for n, e in found.items()} == {
            "flight_no": ("CA1234", True, "MU9999"),
            "position": ("105", True, "106"),
            "fluid_type": ("FUEL", True, "HYDRAULIC"),
        }


def test_two_values_both_stated_are_put_to_the_operator() -> None:
    # The text names two flights; the model picks the second, quoting it: the words state
    # both, so the operator decides (no value is dropped).
    found = ground(
        oil_spill(),
        "CA1234 和 MU5678 之间 105机位漏油",
        demo_graph(),
        {"flight_no": Claim("MU5678", "MU5678")},
    )
    assert (found["flight_no"].value, found["flight_no"].confirmed) == ("MU5678", False)


def test_a_quote_of_a_denied_synonym_is_put_to_the_operator() -> None:
    # "没有关车": the engine was NOT shut down. Whichever way the model reads it, and
    # whatever it quotes of it, the operator confirms: it is no evidence by itself.
    text = "CA1234 105机位燃油泄漏，发动机没有关车"
    for claim in (Claim("STOPPED", "关车"), Claim("RUNNING", "没有关车")):
        assert grounded(text, {"engine_status": claim}) == {"engine_status": (claim.value, False)}
    # A quote elsewhere in the text is evidence as before.
    assert grounded(
        "发动机没有关车，发动机开着", {"engine_status": Claim("RUNNING", "发动机开着")}
    ) == {"engine_status": ("RUNNING", True)}


def test_quotes_are_found_ignoring_case_and_spacing() -> None:
    assert find_quote("Engine  RUNNING at 105", "engine running") == (0, 15)
    assert find_quote("engine running", "") is None
    assert find_quote("engine running", "engine stopped") is None


# --- confirmation answers --------------------------------------------------------------


def test_yes_confirms_the_pending_value_and_no_denies_a_bool() -> None:
    spec = oil_spill()["fields"]
    yes = confirmation_answer(spec["engine_status"], "RUNNING", "是的")
    assert yes is not None and (yes.value, yes.confirmed) == ("RUNNING", True)
    no = confirmation_answer(spec["continuous"], True, "No.")
    assert no is not None and no.value is False
    assert confirmation_answer(spec["engine_status"], "RUNNING", "no") is None  # asked again
    assert confirmation_answer(spec["engine_status"], "RUNNING", "关车了") is None


def test_settle_prefers_the_confirmation_and_drops_unconfirmed_p2() -> None:
    definition = oil_spill()
    found = ground(
        definition,
        "是",
        demo_graph(),
        {"leak_size": Claim("LARGE", ""), "engine_status": Claim("STOPPED", "")},
    )
    settled = dict(
        settle(
            definition,
            found,
            {"continuous": {"value": True, "evidence": "仍在运转"}},
            "continuous",
            "是",
        )
    )
    assert settled["continuous"].value is True and settled["continuous"].confirmed
    assert "leak_size" not in settled  # P2 without evidence: not worth a question, not used
    assert not settled["engine_status"].confirmed


# --- the agent, end to end (offline provider) --------------------------------------------


def start(make_user: Callable[..., User], text: str) -> Session:
    session = do_create_session(
        make_user("olga", "operator"), Scenario.objects.get(slug="oil_spill"), text
    )
    session.refresh_from_db()
    return session


def answer(session: Session, text: str) -> Session:
    do_answer(session.pk, session.created_by, text)
    session.refresh_from_db()
    return session


@pytest.mark.services
def test_engine_answer_does_not_settle_the_leak(
    builtin: None, make_user: Callable[..., User]
) -> None:
    session = start(make_user, "CA1234 在105机位燃油泄漏")
    assert session.snapshot["question"]["field"] == "engine_status"

    session = answer(session, "发动机仍在运转")
    assert session.snapshot["fields"]["engine_status"] == "RUNNING"
    assert session.snapshot["fields"].get("continuous") is None
    assert not session.snapshot.get("risk")  # no OS-01 on the engine's words
    question = session.snapshot["question"]
    assert question["field"] == "continuous"
    assert question["text"].startswith("请确认：我从“仍在运转”推断是否持续泄漏为“持续泄漏”")
    extracted = Event.objects.filter(session=session, type="fields.extracted").last()
    assert extracted is not None
    assert extracted.payload["unconfirmed"] == {
        "continuous": {"value": True, "evidence": "仍在运转"}
    }

    session = answer(session, "否")  # the leak has stopped: not OS-01
    assert session.snapshot["fields"]["continuous"] is False
    assert session.snapshot["evidence"]["continuous"] == "denied: 否"
    assert session.snapshot["risk"]["rule"] == "OS-03"


@pytest.mark.services
def test_the_models_reading_of_the_engine_answer_does_not_settle_the_leak(
    builtin: None,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    settings: Any,
) -> None:
    """The same defect through a scripted model over HTTP: it reads the engine answer as
    a continuing leak too, quoting "仍在". The operator is asked; "否" gives OS-03."""
    settings.AERO_LLM_REACT = False  # extraction only: the reasoning is not under test
    fake_llm.set_script(
        {
            "rules": [
                {
                    "match": {"last_user": "105机位"},
                    "json": {
                        "flight_no": {"value": "CA1234", "quote": "CA1234"},
                        "position": {"value": "105", "quote": "105机位"},
                        "fluid_type": {"value": "FUEL", "quote": "燃油"},
                    },
                },
                {
                    "match": {"last_user": "发动机仍在运转"},
                    "json": {
                        "engine_status": {"value": "RUNNING", "quote": "运转"},
                        "continuous": {"value": True, "quote": "仍在"},
                    },
                },
                {"json": {}},
            ]
        }
    )
    fake_provider(fake_llm)
    session = start(make_user, "CA1234 在105机位燃油泄漏")
    assert session.snapshot["question"]["field"] == "engine_status"

    session = answer(session, "发动机仍在运转")
    assert session.snapshot["fields"]["engine_status"] == "RUNNING"
    assert session.snapshot["fields"].get("continuous") is None
    assert not session.snapshot.get("risk")
    question = session.snapshot["question"]
    assert question["field"] == "continuous"
    assert question["text"].startswith("请确认：我从“仍在”推断是否持续泄漏为“持续泄漏”")

    session = answer(session, "否")
    assert session.snapshot["fields"]["continuous"] is False
    assert session.snapshot["risk"]["rule"] == "OS-03"
    assert LLMCall.objects.filter(session=session, status="ok").count() == 3


@pytest.mark.services
def test_a_confirmed_reading_drives_the_rule(builtin: None, make_user: Callable[..., User]) -> None:
    session = start(make_user, "CA1234 在105机位燃油泄漏，发动机仍在运转")
    assert session.snapshot["question"]["field"] == "continuous"
    session = answer(session, "是")
    assert session.snapshot["fields"]["continuous"] is True
    assert session.snapshot["risk"]["rule"] == "OS-01"


@pytest.mark.services
def test_the_worked_example_still_needs_no_question(
    builtin: None, make_user: Callable[..., User]
) -> None:
    session = start(make_user, "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏")
    assert session.snapshot["evidence"]["continuous"] == "持续"
    assert session.snapshot["risk"]["rule"] == "OS-01" and session.snapshot["risk"]["score"] == 95
    assert not Event.objects.filter(session=session, type="agent.question").exists()


def test_an_answer_that_says_no_and_states_the_value_is_read_as_that_value() -> None:
    pending = {"flight_no": {"value": "MU9999", "evidence": ""}}
    declined: dict[str, list[Any]] = {}
    text = "不是，航班号是CA1234"
    found = ground(oil_spill(), text, demo_graph(), {"flight_no": Claim("MU9999", "")}, "flight_no")
    settled = dict(settle(oil_spill(), found, pending, "flight_no", text, declined))
    assert (settled["flight_no"].value, settled["flight_no"].confirmed) == ("CA1234", True)
    assert declined == {"flight_no": ["MU9999"]}


def test_a_declined_value_is_not_put_again_without_new_words() -> None:
    pending = {"flight_no": {"value": "MU9999", "evidence": ""}}
    declined: dict[str, list[Any]] = {}
    found = ground(oil_spill(), "不是", demo_graph(), {"flight_no": Claim("MU9999", "")})
    assert settle(oil_spill(), found, pending, "flight_no", "不是", declined) == []
    assert pending == {} and declined == {"flight_no": ["MU9999"]}
    # The model says it again about the next message: not put to the operator again.
    again = ground(oil_spill(), "嗯", demo_graph(), {"flight_no": Claim("MU9999", "")})
    assert settle(oil_spill(), again, pending, "flight_no", "嗯", declined) == []
    # Another value it has not put yet is new: asked.
    other = ground(oil_spill(), "嗯", demo_graph(), {"flight_no": Claim("MU5678", "")})
    assert [n for n, _ in settle(oil_spill(), other, pending, None, "嗯", declined)] == [
        "flight_no"
    ]


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ("是，左发吸入", True),
        ("是的 左发", True),
        ("对，吸入了", True),
        ("yes, left engine", True),
        ("不是，只打到机身", False),
        ("no, the airframe", False),
    ],
)
def test_a_yes_or_no_that_opens_a_longer_answer_is_read(answer: str, value: bool) -> None:
    spec = oil_spill()["fields"]["continuous"]
    found = confirmation_answer(spec, True, answer)
    assert found is not None and found.value is value


def test_a_denied_reading_of_an_enum_is_dropped_and_asked_plainly() -> None:
    pending = {"engine_status": {"value": "RUNNING", "evidence": "运转"}}
    assert settle(oil_spill(), {}, pending, "engine_status", "不是") == []
    assert pending == {}


@pytest.mark.services
def test_a_denied_engine_state_is_asked_not_read_as_its_opposite(
    builtin: None, make_user: Callable[..., User]
) -> None:
    # "没有关车" (not shut down) was read as STOPPED: OS-05 instead of OS-01.
    session = start(make_user, "CA1234 在105机位燃油泄漏，发动机没有关车，还在持续漏")
    assert "engine_status" not in session.snapshot["fields"]
    assert session.snapshot["question"]["field"] == "engine_status"
    assert not session.snapshot.get("risk")
    session = answer(session, "发动机开着")
    assert session.snapshot["risk"]["rule"] == "OS-01"
