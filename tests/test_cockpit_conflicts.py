"""Issue 12, a conflicting answer (a second tab says 液压油 after 燃油 was known): the agent
shows it and asks before changing the fact; a yes changes it, a no keeps the old value.
Nothing is dropped without a word.

Personas: alice operates."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from diagnosis.actions import do_answer
from diagnosis.models import Event, Session
from tests.log_helpers import assert_projections_match
from tests.web_helpers import make_session

pytestmark = pytest.mark.services

FUEL_NO_POSITION = "CA1234 燃油泄漏，发动机运转，持续泄漏"


@pytest.fixture
def asking_position(builtin: None, alice: User) -> Session:
    session = make_session(alice, FUEL_NO_POSITION)
    assert session.snapshot["fields"]["fluid_type"] == "FUEL"
    assert session.snapshot["question"]["field"] == "position"
    return session


def answer(session: Session, user: User, text: str) -> Session:
    do_answer(session.pk, user, text)
    session.refresh_from_db()
    return session


def test_a_conflicting_answer_is_shown_and_asked_not_taken_or_dropped(
    asking_position: Session, alice: User
) -> None:
    session = answer(asking_position, alice, "液压油")

    question = session.snapshot["question"]
    assert question["field"] == "fluid_type"
    assert "液压油" in question["text"] and "燃油" in question["text"]
    assert session.snapshot["fields"]["fluid_type"] == "FUEL"  # not changed unseen
    extracted = Event.objects.filter(session=session, type="fields.extracted").last()
    assert extracted is not None
    assert extracted.payload["unconfirmed"]["fluid_type"]["replaces"] == "FUEL"
    assert_projections_match(session)


def test_yes_changes_the_fact_and_the_agent_carries_on(
    asking_position: Session, alice: User
) -> None:
    answer(asking_position, alice, "液压油")

    session = answer(asking_position, alice, "是")

    assert session.snapshot["fields"]["fluid_type"] == "HYDRAULIC"
    assert session.snapshot["question"]["field"] == "position"  # back to what was missing
    assert_projections_match(session)


def test_no_keeps_the_known_value(asking_position: Session, alice: User) -> None:
    answer(asking_position, alice, "液压油")

    session = answer(asking_position, alice, "否")

    assert session.snapshot["fields"]["fluid_type"] == "FUEL"
    assert session.snapshot["question"]["field"] == "position"


def test_the_same_value_again_is_no_conflict(asking_position: Session, alice: User) -> None:
    session = answer(asking_position, alice, "燃油，在105机位")

    assert session.snapshot["fields"]["fluid_type"] == "FUEL"
    assert session.snapshot["fields"]["position"] == "105"
    assert session.snapshot.get("question") is None
