"""Issue 12, the wrong-scenario trap: nothing is preselected, AERO suggests a scenario from
the message's words, warns before opening when another scenario fits better, and reads
"有烟" as smoke at a tire burst (TB-01, not TB-03).

Personas: alice operates."""

# Chinese incident reports use full-width punctuation on purpose.

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from diagnosis.models import Session
from scenarios_admin.models import Scenario
from tests.scenario_helpers import assess, extract
from tests.web_helpers import STAND_FUEL_LEAK, login

TIRE_SMOKE = "MU5678 在跑道06/24起飞滑跑时爆胎，跑道上有轮胎碎片，有烟"


def create(user: User, **data: str) -> str:
    response = login(user).post(reverse("diagnosis:session-create"), data)
    assert response.status_code == 400, "the form should have come back, not a session"
    return response.content.decode()


def selected_scenario(page: str) -> str | None:
    select = re.search(r'<select name="scenario".*?</select>', page, flags=re.S)
    assert select is not None
    chosen = re.search(r'<option value="(\d*)" selected>', select.group(0))
    return chosen.group(1) or None if chosen else None  # "" is the "choose" prompt


@pytest.mark.services
def test_the_new_incident_form_preselects_no_scenario(builtin: None, alice: User) -> None:
    page = login(alice).get(reverse("diagnosis:session-list")).content.decode()

    assert selected_scenario(page) is None
    assert "let AERO suggest from the message" in page


@pytest.mark.services
def test_without_a_scenario_aero_suggests_one_and_keeps_the_text(
    builtin: None, alice: User
) -> None:
    page = create(alice, message=STAND_FUEL_LEAK)
    oil_spill = Scenario.objects.get(slug="oil_spill")

    assert "Choose a scenario. Suggested from the message: 机坪漏油." in page
    assert selected_scenario(page) == str(oil_spill.pk)
    suggestion = re.search(r'data-testid="scenario-suggestion">(.*?)</p>', page, re.S)
    assert suggestion is not None and "燃油" in suggestion.group(1)
    assert STAND_FUEL_LEAK in page
    assert not Session.objects.exists()


@pytest.mark.services
def test_a_message_matching_nothing_asks_for_a_choice(builtin: None, alice: User) -> None:
    page = create(alice, message="CA1234 needs help, please call back")

    assert "the message does not clearly match one" in page
    assert selected_scenario(page) is None
    assert not Session.objects.exists()


@pytest.mark.services
def test_a_message_fitting_another_scenario_better_is_flagged_before_opening(
    builtin: None, alice: User
) -> None:
    bird = Scenario.objects.get(slug="bird_strike")
    tire = Scenario.objects.get(slug="tire_burst")

    page = create(alice, scenario=str(bird.pk), message=TIRE_SMOKE)

    assert "This message reads more like 爆胎" in page
    assert f'name="scenario" value="{tire.pk}"' in page  # "open as 爆胎"
    assert selected_scenario(page) == str(bird.pk)  # the choice is kept, not overridden
    assert not Session.objects.exists()


@pytest.mark.services
def test_the_operator_may_keep_the_chosen_scenario(builtin: None, alice: User) -> None:
    bird = Scenario.objects.get(slug="bird_strike")

    response = login(alice).post(
        reverse("diagnosis:session-create"),
        {"scenario": str(bird.pk), "message": TIRE_SMOKE, "keep_scenario": "1"},
    )

    assert response.status_code == 302
    assert Session.objects.get().scenario == bird


@pytest.mark.services
def test_switching_opens_the_suggested_scenario_with_the_text(builtin: None, alice: User) -> None:
    bird = Scenario.objects.get(slug="bird_strike")
    tire = Scenario.objects.get(slug="tire_burst")

    # The "open as 爆胎" button sends a second scenario value after the select's.
    response = login(alice).post(
        reverse("diagnosis:session-create"),
        {"scenario": [str(bird.pk), str(tire.pk)], "message": TIRE_SMOKE},
    )

    assert response.status_code == 302
    session = Session.objects.get()
    assert session.scenario == tire
    assert session.title == TIRE_SMOKE


@pytest.mark.parametrize("text", ["有烟", "跑道上有轮胎碎片，有烟", "冒出烟雾", "有火"])
def test_smoke_said_plainly_is_read_as_fire_or_smoke(text: str) -> None:
    assert extract("tire_burst", text)["fire_or_smoke"] is True


@pytest.mark.parametrize("text", ["没有烟", "没有冒烟", "未见烟"])
def test_no_smoke_is_not_read_as_smoke(text: str) -> None:
    assert extract("tire_burst", text)["fire_or_smoke"] is False


def test_debris_with_smoke_on_the_runway_is_tb01_not_tb03() -> None:
    fields = extract("tire_burst", TIRE_SMOKE)

    risk = assess("tire_burst", fields)

    assert (risk["rule"], risk["score"]) == ("TB-01", 95)
