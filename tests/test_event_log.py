"""The event log is the whole truth: every session, whatever path it took, rebuilds from
its events alone (`fold_events`) into exactly its tables."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User

from approvals.actions import APPROVE, CONFIRM, REJECT, do_decide
from approvals.models import Approval
from diagnosis.fold import fold_events
from diagnosis.models import Event
from tests.log_helpers import assert_projections_match
from tests.web_helpers import TAXIWAY_FUEL_LEAK, approval_for, waiting_session

pytestmark = pytest.mark.services


@pytest.fixture
def people(builtin: None, make_user: Callable[..., User]) -> dict[str, User]:
    return {
        "olga": make_user("olga", "operator"),
        "abel": make_user("abel", "approver"),
    }


def test_a_decided_session_rebuilds_from_its_events(people: dict[str, User]) -> None:
    olga, abel = people["olga"], people["abel"]
    session = waiting_session(olga, TAXIWAY_FUEL_LEAK)
    assert_projections_match(session)

    crew = approval_for(session, "dispatch_cleanup_crew")
    do_decide(crew.pk, abel, REJECT, "crew already on the way")
    runway = approval_for(session, "close_runway", runway="06/24")
    do_decide(runway.pk, abel, APPROVE, "fuel at the runway exit")
    taxiway = Approval.objects.filter(session=session, action_name="close_taxiway").first()
    assert taxiway is not None
    do_decide(taxiway.pk, abel, APPROVE)
    assert_projections_match(session)  # mid-way: one R2 approved once, not confirmed
    do_decide(taxiway.pk, abel, CONFIRM)
    for item in Approval.objects.filter(session=session).open():
        while item.is_open:
            item = do_decide(item.pk, abel, CONFIRM if item.status == "confirming" else APPROVE)

    state = assert_projections_match(session)
    assert state.status == "completed"
    assert state.report is not None
    assert state.report.sha256 == hashlib.sha256(state.report.markdown.encode()).hexdigest()
    by_name = {a.action_name: a for a in state.approvals.values()}
    assert [d.step for d in by_name["close_taxiway"].decisions] == ["first_approved", "approved"]
    assert [(d.step, d.by, d.reason) for d in by_name["dispatch_cleanup_crew"].decisions] == [
        ("rejected", "abel", "crew already on the way")
    ]


def test_the_fold_at_a_seq_is_the_state_then(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    events = list(Event.objects.filter(session=session).order_by("seq"))
    risk_seq = next(e.seq for e in events if e.type == "risk.assessed")
    before = fold_events(events[: risk_seq - 1])
    at = fold_events(events[:risk_seq])
    assert before.risk is None and at.risk == session.snapshot["risk"]
    assert fold_events(events[:2]).status == "queued" and fold_events(events[:2]).fields == {}
