"""Issue 32, item 3: the reporter's words win over a model's guess. A value the words
state is taken even when a model proposed another (the model's value dropped, noted);
"不是，航班号是CA1234" is read as CA1234; no question is asked twice without new
information; "不知道" to an optional or an inferred question closes it (with an event)
and moves on, to a required one explains once why it is needed and offers the
correction form; a yes/no that opens a longer answer is read.

The scripted-model tests run both with the calls in the job and as waits. Personas:
alice operates, bob approves."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import reverse

from diagnosis.actions import do_answer, do_correct_fact, do_create_session
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.models import Event, LLMCall, Session
from scenarios_admin.models import Scenario
from tests.llm_helpers import fake_llm, fake_provider
from tests.web_helpers import approve_everything, login

__all__ = ["fake_llm"]  # the fixture

pytestmark = pytest.mark.services

WRONG = {
    "flight_no": {"value": "MU9999", "quote": "MU9999"},
    "position": {"value": "106", "quote": "106"},
    "fluid_type": {"value": "HYDRAULIC", "quote": "液压油"},
}


@pytest.fixture(params=[False, True], ids=["calls-in-the-job", "calls-as-waits"])
def scripted(request: pytest.FixtureRequest, settings: Any, fake_llm: FakeLLMServer) -> Any:
    """A scripted model for the extraction, both ways: calls made inside the job (the
    CLI's inline backend), and as waits the LLM runner answers (production; inline here).
    The reasoning is the policy's (not under test)."""
    settings.AERO_LLM_WAITS = request.param
    settings.AERO_LLM_REACT = False

    def script(*rules: dict[str, Any]) -> FakeLLMServer:
        fake_llm.set_script({"rules": [*rules, {"json": {}}]})
        fake_provider(fake_llm)
        return fake_llm

    return script


def start(user: User, text: str, slug: str = "oil_spill") -> Session:
    session = do_create_session(user, Scenario.objects.get(slug=slug), text)
    session.refresh_from_db()
    return session


def answer(session: Session, text: str) -> Session:
    do_answer(session.pk, session.created_by, text)
    session.refresh_from_db()
    return session


def questions(session: Session) -> list[str]:
    return [
        e.payload["text"]
        for e in Event.objects.filter(session=session, type="agent.question").order_by("seq")
    ]


def closed(session: Session) -> list[tuple[str, str, bool]]:
    return [
        (e.payload["field"], e.payload["reason"], e.payload["optional"])
        for e in Event.objects.filter(session=session, type="agent.question_closed").order_by("seq")
    ]


def page(user: User, session: Session, language: str = "en") -> str:
    url = reverse("diagnosis:session-detail", args=[session.pk])
    with override_settings(LANGUAGE_CODE=language):
        return login(user).get(url, HTTP_ACCEPT_LANGUAGE=language).content.decode()


# --- a model's wrong values ------------------------------------------------------------


def test_the_texts_values_win_over_the_models_wrong_ones(
    builtin: None, scripted: Any, alice: User
) -> None:
    scripted({"match": {"last_user": "燃油泄漏"}, "json": WRONG})
    session = start(alice, "CA1234 105机位 燃油泄漏")

    fields = session.snapshot["fields"]
    assert (fields["flight_no"], fields["position"], fields["fluid_type"]) == (
        "CA1234",
        "105",
        "FUEL",
    )
    # Nothing of the model's is put to the operator: the next question is the engine's.
    assert session.snapshot["question"]["field"] == "engine_status"
    assert not session.snapshot.get("unconfirmed")
    extracted = Event.objects.filter(session=session, type="fields.extracted").first()
    assert extracted is not None
    assert extracted.payload["dropped"] == {
        "flight_no": {"value": "MU9999", "kept": "CA1234"},
        "position": {"value": "106", "kept": "105"},
        "fluid_type": {"value": "HYDRAULIC", "kept": "FUEL"},
    }
    assert LLMCall.objects.filter(session=session, purpose="extract", status="ok").exists()
    english = page(alice, session)
    assert english.count('data-testid="model-value-dropped"') == 3
    assert "the model's Flight number “MU9999” was dropped: the operator's words say" in english
    assert "模型给出的航班号“MU9999”已弃用" in page(alice, session, "zh-hans")


@pytest.mark.parametrize(
    "reply", ["不是，航班号是CA1234", "no, it is CA1234", "不是 CA1234"], ids=["zh", "en", "bare"]
)
def test_no_it_is_x_is_read_as_x(builtin: None, scripted: Any, alice: User, reply: str) -> None:
    """The model invents a flight the text never names, and insists on it in the answer:
    the operator's "no, it is CA1234" is read as CA1234, and the risk is assessed."""
    scripted(
        {
            "match": {"last_user": "燃油泄漏"},
            "json": {"flight_no": {"value": "MU9999", "quote": ""}},
        },
        {"match": {"last_user": "CA1234"}, "json": {"flight_no": {"value": "MU9999", "quote": ""}}},
    )
    session = start(alice, "105机位燃油泄漏，发动机运转，还在持续漏")
    assert session.snapshot["question"]["field"] == "flight_no"
    assert "MU9999" in session.snapshot["question"]["text"]

    session = answer(session, reply)

    assert session.snapshot["fields"]["flight_no"] == "CA1234"
    assert session.snapshot["risk"]["rule"] == "OS-01"
    assert sum("MU9999" in q for q in questions(session)) == 1


def test_a_declined_value_is_not_put_again(builtin: None, scripted: Any, alice: User) -> None:
    """ "不是" to "is the flight MU9999?" and the model says MU9999 again: the flight is
    asked plainly, the confirmation closes with a reason, and it is never put again."""
    scripted({"json": {"flight_no": {"value": "MU9999", "quote": ""}}})
    session = start(alice, "105机位燃油泄漏，发动机运转，还在持续漏")
    assert "MU9999" in session.snapshot["question"]["text"]

    session = answer(session, "不是")
    assert session.snapshot["question"]["field"] == "flight_no"
    assert "MU9999" not in session.snapshot["question"]["text"]
    assert closed(session) == [("flight_no", "declined", False)]

    session = answer(session, "嗯")  # names nothing: asked plainly once more, not confirmed
    assert "MU9999" not in session.snapshot["question"]["text"]
    assert sum("MU9999" in q for q in questions(session)) == 1
    assert "flight_no" not in session.snapshot["fields"]


# --- "I don't know" ----------------------------------------------------------------------


def test_dont_know_to_an_inferred_value_moves_on_and_a_required_one_is_explained_once(
    builtin: None, alice: User
) -> None:
    session = start(alice, "CA1234 在105机位燃油泄漏，发动机仍在运转")
    first = session.snapshot["question"]
    assert first["field"] == "continuous" and first["text"].startswith("请确认")

    session = answer(session, "不知道")
    # The inference is dropped (not assumed), the confirmation closes with why, and the
    # required fact is asked plainly, saying why it is needed and where else to give it.
    assert closed(session) == [("continuous", "unsure", False)]
    second = session.snapshot["question"]
    assert second["field"] == "continuous" and second["text"] != first["text"]
    assert second["text"].startswith("风险评估需要这一项")
    assert "更正" in second["text"] and second["offer_correction"]
    assert 'data-testid="offer-correction"' in page(alice, session, "zh-hans")
    assert 'id="correct-continuous" data-testid="correct-continuous" open' in page(alice, session)

    session = answer(session, "还是不知道")
    third = session.snapshot["question"]["text"]
    assert third.startswith("评估风险仍需要：是否持续泄漏")  # not explained twice
    assert len(set(questions(session))) == len(questions(session)) == 3
    assert not session.snapshot.get("risk")

    session = answer(session, "还在漏")
    assert session.snapshot["risk"]["rule"] == "OS-01"


def test_dont_know_to_an_optional_question_closes_it_and_the_response_goes_on(
    builtin: None, alice: User, bob: User
) -> None:
    session = start(alice, "3U8888 在滑行道B2滑行时爆胎，地面有碎片", "tire_burst")
    assert session.snapshot["question"]["optional"]
    before = list(session.tool_calls.filter(is_action=True).values_list("pk", "status"))

    session = answer(session, "不知道")

    assert closed(session) == [("fire_or_smoke", "unsure", True)]
    assert session.snapshot["question"] is None
    assert len(questions(session)) == 1  # never asked again
    assert list(session.tool_calls.filter(is_action=True).values_list("pk", "status")) == before
    assert 'data-testid="question-closed-unsure"' in page(bob, session)
    approve_everything(session, bob)
    session.refresh_from_db()
    assert session.status == "completed"
    assert "可选问题未获回答" in session.report.markdown


def test_an_optional_question_closed_by_a_correction_is_logged(
    whole_timeline_on_page: None, builtin: None, alice: User, bob: User
) -> None:
    session = start(alice, "3U8888 在滑行道B2滑行时爆胎，地面有碎片", "tire_burst")
    assert session.snapshot["question"]["field"] == "fire_or_smoke"

    do_correct_fact(session.pk, alice, "position", "B3")
    session.refresh_from_db()

    assert closed(session) == [("fire_or_smoke", "correction", True)]
    assert session.snapshot["fields"]["position"] == "B3"
    assert 'data-testid="question-closed-correction"' in page(bob, session)


# --- a yes/no that goes on ---------------------------------------------------------------


def test_yes_that_goes_on_answers_the_bird_strike_question(builtin: None, alice: User) -> None:
    session = start(alice, "CA1234 起飞滑跑时在跑道06/24发生鸟击", "bird_strike")
    assert session.snapshot["question"]["field"] == "engine_ingestion"

    session = answer(session, "是，左发吸入")

    assert session.snapshot["fields"]["engine_ingestion"] is True
    assert session.snapshot["risk"]["rule"] == "BS-01"


def test_the_left_engine_ingesting_the_bird_is_read_from_the_opening(
    builtin: None, alice: User
) -> None:
    session = start(alice, "CA1234 起飞滑跑时左发吸入鸟，跑道06/24", "bird_strike")

    assert session.snapshot["fields"]["engine_ingestion"] is True
    assert session.snapshot["risk"]["rule"] == "BS-01"
    assert "engine_ingestion" not in [
        e.payload["field"] for e in Event.objects.filter(session=session, type="agent.question")
    ]
