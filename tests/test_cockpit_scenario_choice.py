"""Issue 12, the wrong-scenario trap: nothing is preselected, AERO suggests a scenario from
the message's words, warns before opening when another scenario fits better, and reads
"有烟" as smoke at a tire burst (TB-01, not TB-03).

Personas: alice operates."""

# Chinese incident reports use full-width punctuation on purpose.

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from playwright.sync_api import Browser, expect

from diagnosis.actions import do_create_session
from diagnosis.models import Event, Session
from scenarios_admin.models import Scenario
from tests.browser_helpers import sign_in
from tests.log_helpers import assert_projections_match
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


def suggest_select(user: User, **params: str) -> str:
    response = login(user).get(reverse("diagnosis:session-suggest"), params)
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.services
def test_typing_the_message_preselects_the_scenario_it_reads_like(
    builtin: None, alice: User
) -> None:
    oil_spill = Scenario.objects.get(slug="oil_spill")
    page = login(alice).get(reverse("diagnosis:session-list")).content.decode()
    textarea = re.search(r"<textarea[^>]*>", page)
    assert textarea is not None
    # The message re-renders the select as it is typed (the field is sent with it).
    assert f'hx-get="{reverse("diagnosis:session-suggest")}"' in textarea.group(0)
    assert 'hx-target="#scenario-choice"' in textarea.group(0)

    fragment = suggest_select(alice, message=STAND_FUEL_LEAK, scenario="", suggested="")

    assert selected_scenario(fragment) == str(oil_spill.pk)
    assert "Chosen from the message: Apron fluid spill (it mentions" in fragment
    assert f'name="suggested" id="id_suggested" value="{oil_spill.pk}"' in fragment
    assert not Session.objects.exists()


@pytest.mark.services
def test_the_operators_own_choice_is_never_replaced_while_typing(
    builtin: None, alice: User
) -> None:
    bird = Scenario.objects.get(slug="bird_strike")

    fragment = suggest_select(alice, message=STAND_FUEL_LEAK, scenario=str(bird.pk), suggested="")

    assert selected_scenario(fragment) == str(bird.pk)
    assert "Chosen from the message" not in fragment


@pytest.mark.services
def test_aeros_earlier_choice_gives_way_when_the_message_no_longer_fits(
    builtin: None, alice: User
) -> None:
    oil_spill = Scenario.objects.get(slug="oil_spill")

    fragment = suggest_select(
        alice, message="CA1234 needs help", scenario=str(oil_spill.pk), suggested=str(oil_spill.pk)
    )

    assert selected_scenario(fragment) is None
    assert "Chosen from the message" not in fragment


@pytest.mark.services
def test_a_kept_message_comes_back_with_its_scenario_preselected(
    builtin: None, alice: User
) -> None:
    oil_spill = Scenario.objects.get(slug="oil_spill")
    client = login(alice)
    client.logout()
    # Signed out, the post is kept for after the sign-in (aero.drafts), without a scenario.
    client.post(reverse("diagnosis:session-create"), {"message": STAND_FUEL_LEAK})
    client.force_login(alice)

    page = client.get(reverse("diagnosis:session-list")).content.decode()

    assert STAND_FUEL_LEAK in page
    assert selected_scenario(page) == str(oil_spill.pk)


@pytest.mark.services
def test_only_an_operator_may_ask_for_the_suggestion(builtin: None, alice: User, bob: User) -> None:
    url = reverse("diagnosis:session-suggest")

    assert login(bob).get(url, {"message": STAND_FUEL_LEAK}).status_code == 403
    anonymous = Client().get(url, {"message": STAND_FUEL_LEAK})
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("login"))


@pytest.mark.services
def test_without_a_scenario_aero_suggests_one_and_keeps_the_text(
    builtin: None, alice: User
) -> None:
    page = create(alice, message=STAND_FUEL_LEAK)
    oil_spill = Scenario.objects.get(slug="oil_spill")

    assert "Choose a scenario. Suggested from the message: Apron fluid spill." in page
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

    assert "This message reads more like Tire burst" in page
    assert f'name="scenario" value="{tire.pk}"' in page  # "open as 爆胎"
    assert selected_scenario(page) == str(bird.pk)  # the choice is kept, not overridden
    assert not Session.objects.exists()


@pytest.mark.services
def test_one_shared_word_does_not_interrupt_the_choice(builtin: None, alice: User) -> None:
    oil_spill = Scenario.objects.get(slug="oil_spill")

    # "机位" is a tire burst phase word too; that alone is no sign of a wrong scenario.
    response = login(alice).post(
        reverse("diagnosis:session-create"),
        {"scenario": str(oil_spill.pk), "message": "CA1234 105机位 leak"},
    )

    assert response.status_code == 302


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


# --- after the start: the agent says so and offers to switch ----------------------------


@pytest.fixture
def bird_for_a_tire_burst(builtin: None, alice: User) -> Session:
    session = do_create_session(alice, Scenario.objects.get(slug="bird_strike"), TIRE_SMOKE)
    session.refresh_from_db()
    return session


@pytest.mark.services
def test_the_agent_says_when_the_message_fits_another_scenario_better(
    bird_for_a_tire_burst: Session, alice: User
) -> None:
    note = Event.objects.get(session=bird_for_a_tire_burst, type="agent.note")
    page = (
        login(alice)
        .get(reverse("diagnosis:session-detail", args=[bird_for_a_tire_burst.pk]))
        .content.decode()
    )

    assert note.payload["suggested"]["slug"] == "tire_burst"
    assert "这条消息更像“爆胎”" in note.payload["text"]
    banner = page[page.index('data-testid="scenario-mismatch"') :]
    assert "This message reads more like Tire burst" in banner
    assert 'name="scenario" value="tire_burst"' in banner


@pytest.mark.services
def test_switching_carries_the_text_over_and_closes_the_old_session_with_a_reason(
    bird_for_a_tire_burst: Session, alice: User
) -> None:
    old = bird_for_a_tire_burst

    response = login(alice).post(
        reverse("diagnosis:session-switch", args=[old.pk]), {"scenario": "tire_burst"}
    )

    new = Session.objects.exclude(pk=old.pk).get()
    assert response.status_code == 302
    assert response["Location"] == reverse("diagnosis:session-detail", args=[new.pk])
    assert new.scenario.slug == "tire_burst"
    assert Event.objects.filter(session=new, type="user.message").first().payload["text"] == (  # type: ignore[union-attr]
        TIRE_SMOKE
    )
    assert new.snapshot["fields"]["fire_or_smoke"] is True
    old.refresh_from_db()
    assert old.status == "canceled"
    assert f"continued in session {new.pk}" in str(
        Event.objects.get(session=old, type="session.canceled").payload
    )
    went = Event.objects.get(session=old, payload__kind="scenario_switched_to")
    came = Event.objects.get(session=new, payload__kind="scenario_switched_from")
    assert went.payload["session"] == str(new.pk) and came.payload["session"] == str(old.pk)
    assert_projections_match(old)
    assert_projections_match(new)
    page = login(alice).get(reverse("diagnosis:session-detail", args=[old.pk])).content.decode()
    assert 'data-testid="scenario-mismatch"' not in page
    assert reverse("diagnosis:session-detail", args=[new.pk]) in page


@pytest.mark.services
def test_a_switch_needs_a_known_scenario_and_an_operator(
    bird_for_a_tire_burst: Session, alice: User, bob: User
) -> None:
    url = reverse("diagnosis:session-switch", args=[bird_for_a_tire_burst.pk])

    unknown = login(alice).post(url, {"scenario": "no_such"}, follow=True)
    denied = login(bob).post(url, {"scenario": "tire_burst"})

    assert "Choose a scenario to switch to." in unknown.content.decode()
    assert denied.status_code == 403
    assert Session.objects.count() == 1
    bird_for_a_tire_burst.refresh_from_db()
    assert bird_for_a_tire_burst.status != "canceled"


# --- in a browser: one press -------------------------------------------------------------


@pytest.mark.services
@pytest.mark.browser
def test_in_a_browser_the_typed_message_chooses_the_scenario_and_one_press_opens(
    builtin: None, asgi_server: str, browser: Browser, alice: User
) -> None:
    oil_spill = Scenario.objects.get(slug="oil_spill")
    page = sign_in(browser, asgi_server, alice)
    try:
        page.fill("#id_message", STAND_FUEL_LEAK)
        expect(page.locator("#id_scenario")).to_have_value(str(oil_spill.pk))
        expect(page.get_by_test_id("scenario-suggested")).to_contain_text("Apron fluid spill")

        page.click("text=Open session")

        expect(page.get_by_test_id("session-status")).to_be_visible()
        assert Session.objects.get().scenario == oil_spill
    finally:
        page.context.close()
