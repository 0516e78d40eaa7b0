"""The event log is the whole truth: every session, whatever path it took, rebuilds from
its events alone (`fold_events`) into exactly its tables."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any
from unittest.mock import ANY

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from approvals.actions import APPROVE, CONFIRM, REJECT, do_decide, sweep_expired_approvals
from approvals.models import Approval, ManualTodo
from diagnosis.actions import ActionError, do_answer, do_cancel, do_retry
from diagnosis.agent.providers import OfflineProvider, Usage
from diagnosis.fold import fold_events
from diagnosis.lifts import do_request_lift
from diagnosis.models import Event, LLMCall, ToolCall
from packs.airport.models import Restriction
from tests.log_helpers import assert_projections_match
from tests.web_helpers import (
    NO_POSITION,
    TAXIWAY_FUEL_LEAK,
    approval_for,
    approve_everything,
    login,
    make_session,
    waiting_session,
)

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
    do_decide(crew.pk, abel, REJECT, "crew already on the way", digest=crew.digest)
    runway = approval_for(session, "close_runway", runway="06/24")
    do_decide(runway.pk, abel, APPROVE, "fuel at the runway exit", digest=runway.digest)
    taxiway = Approval.objects.filter(session=session, action_name="close_taxiway").first()
    assert taxiway is not None
    do_decide(taxiway.pk, abel, APPROVE, digest=taxiway.digest)
    assert_projections_match(session)  # mid-way: one R2 approved once, not confirmed
    do_decide(taxiway.pk, abel, CONFIRM, digest=taxiway.digest)
    for item in Approval.objects.filter(session=session).open():
        while item.is_open:
            item = do_decide(
                item.pk,
                abel,
                CONFIRM if item.status == "confirming" else APPROVE,
                digest=item.digest,
            )

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
    risk_seq = next(
        e.seq for e in events if e.type == "finding.recorded" and e.payload["kind"] == "risk"
    )
    before = fold_events(events[: risk_seq - 1])
    at = fold_events(events[:risk_seq])
    assert before.risk is None and at.risk == session.snapshot["risk"]
    assert fold_events(events[:2]).status == "queued" and fold_events(events[:2]).fields == {}


def test_an_answered_question_rebuilds(people: dict[str, User]) -> None:
    session = make_session(people["olga"], NO_POSITION)
    assert session.status == "waiting_user" and session.snapshot["question"]
    state = assert_projections_match(session)
    assert state.question is not None and state.questions[0].answered_seq is None
    do_answer(session.pk, people["olga"], "105机位")
    state = assert_projections_match(session)
    assert state.questions[0].answered_seq == state.messages[-1].seq
    assert state.fields["position"] == "105" and state.status == "waiting_user"


def test_cancel_closes_pending_approvals_with_events_and_writes_a_report(
    people: dict[str, User],
) -> None:
    olga, abel = people["olga"], people["abel"]
    session = waiting_session(olga)
    crew = approval_for(session, "dispatch_cleanup_crew")
    do_decide(crew.pk, abel, APPROVE, digest=crew.digest)
    stand = approval_for(session, "suspend_stand_operations")
    do_decide(stand.pk, abel, APPROVE, digest=stand.digest)  # R2: approved once, never confirmed
    still_open = Approval.objects.filter(session=session).open().count()
    assert still_open >= 2

    do_cancel(session.pk, olga, "false alarm: it was water")

    assert not Approval.objects.filter(session=session).open().exists()
    canceled = Event.objects.filter(session=session, type="approval.canceled")
    assert canceled.count() == still_open
    assert {e.payload["reason"] for e in canceled} == {"false alarm: it was water"}
    assert set(
        ToolCall.objects.filter(session=session, is_action=True).values_list("status", flat=True)
    ) >= {"canceled"}
    state = assert_projections_match(session)
    assert state.status == "canceled" and state.report is not None
    assert "false alarm: it was water" in state.report.markdown
    assert "会话已取消" in state.report.markdown  # the operator wrote in Chinese

    # Nothing left for the sweeper: no to-dos, no events later.
    Approval.objects.filter(session=session).update(deadline=timezone.now() - timedelta(hours=1))
    last = Event.objects.filter(session=session).count()
    assert sweep_expired_approvals() == 0
    assert not ManualTodo.objects.filter(session=session).exists()
    assert Event.objects.filter(session=session).count() == last
    with pytest.raises(ActionError, match="the session was canceled"):
        do_decide(stand.pk, abel, CONFIRM, digest=stand.digest)

    # The page shows readable lines, not raw event types.
    page = login(olga).get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert "Session canceled" in page and "by olga" in page
    assert "closed undecided" in page
    assert ">session.canceled<" not in page and "\nsession.canceled\n" not in page


def test_timeouts_rebuild(
    people: dict[str, User], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The clock moves past the deadlines (editing them in SQL would be a change the log
    # does not know of); the first approval came in time.
    settings.AERO_APPROVAL_TIMEOUT_MINUTES = {"R1": 1, "R2": 1, "R3": 1}
    session = waiting_session(people["olga"])
    stand = approval_for(session, "suspend_stand_operations")
    do_decide(stand.pk, people["abel"], APPROVE, digest=stand.digest)
    now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: now() + timedelta(minutes=2))
    assert sweep_expired_approvals() >= 2
    state = assert_projections_match(session)
    assert state.status == "completed"
    timed_out = [a for a in state.approvals.values() if a.status == "timeout"]
    assert timed_out and all(a.todo for a in timed_out)
    assert [d.step for d in state.approvals[stand.tool_call.call_id].decisions] == [
        "first_approved",
        "timeout",
    ]


class Flaky:
    """A provider that always fails: the chain falls back to the next."""

    name, model, retries = "flaky", "flaky-1", 1

    def extract(self, *args: Any) -> Any:
        raise ConnectionError("upstream 503")


class Metered(OfflineProvider):
    """The offline extraction, billed: every call costs tokens."""

    name, model = "metered", "metered-1"

    def extract(self, *args: Any) -> Any:
        found, _ = super().extract(*args)
        return found, Usage(100, 20, Decimal("0.0125"))


def test_fallback_retry_and_rerun_never_duplicate_events_or_tokens(
    people: dict[str, User], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """The input parser crashes after its (paid) model call, every attempt of the first
    job: the session fails. A retry re-runs the same step: the model call, the fallback
    and the node's events are logged once and the tokens counted once."""
    import diagnosis.jobs.job as jobs_module
    import packs.airport.agent.policy as policy_module

    monkeypatch.setattr(
        jobs_module, "configured_providers", lambda stamp=None: [Flaky(), Metered()]
    )
    original = policy_module.missing_p1
    crashes = {"left": settings.AERO_JOB_ATTEMPTS}

    def crash_first(*args: Any) -> Any:
        if crashes["left"]:
            crashes["left"] -= 1
            raise RuntimeError("worker lost its database connection")
        return original(*args)

    monkeypatch.setattr(policy_module, "missing_p1", crash_first)
    session = make_session(people["olga"])
    assert session.status == "failed"
    assert_projections_match(session)
    # Each crashed step rolled back whole: no model call, usage or extraction is left.
    crashed = Event.objects.filter(session=session)
    assert not crashed.filter(type__in=["llm.call", "llm.fallback", "fields.extracted"]).exists()
    assert not LLMCall.objects.filter(session=session).exists()
    assert crashed.filter(type="agent.node_failed").count() == settings.AERO_JOB_ATTEMPTS

    do_retry(session.pk, people["olga"])
    state = assert_projections_match(session)
    assert state.status == "waiting_user"
    session.refresh_from_db()
    assert (session.tokens_in, session.tokens_out, session.cost) == (100, 20, Decimal("0.0125"))
    events = Event.objects.filter(session=session)
    assert events.filter(type="llm.call").count() == 2  # flaky failed, metered answered
    assert events.filter(type="llm.fallback").count() == 1
    assert events.filter(type="fields.extracted").count() == 1
    assert events.filter(type="agent.node_failed").count() == settings.AERO_JOB_ATTEMPTS
    started = events.filter(type="agent.node_started", payload__node="input_parser")
    assert started.count() == 1
    assert LLMCall.objects.filter(session=session).count() == 2
    assert state.fallbacks == [{"from": "flaky", "to": "metered", "error": ANY}]
    assert "upstream 503" in state.fallbacks[0]["error"]
    failed = [
        e for e in events if e.type == "session.status_changed" and e.payload["to"] == "failed"
    ]
    assert len(failed) == 1


def test_a_lifted_closure_rebuilds_in_every_session_it_touched(
    people: dict[str, User],
) -> None:
    olga, abel = people["olga"], people["abel"]
    session = waiting_session(olga)
    approve_everything(session, abel)
    assert session.status == "completed"
    closure = Restriction.objects.get(session=session, kind="stand")
    other = waiting_session(olga)  # open while the closure is in force: its map shows it

    lift = do_request_lift(closure.pk, olga, "stand cleaned and inspected")
    approval = Approval.objects.get(tool_call=lift)
    do_decide(approval.pk, abel, APPROVE, digest=approval.digest)
    do_decide(approval.pk, abel, CONFIRM, digest=approval.digest)
    closure.refresh_from_db()
    assert closure.lifted_at is not None

    state = assert_projections_match(session)
    lifted = [r for r in state.restrictions if (r.kind, r.target) == ("stand", closure.target)]
    assert lifted and lifted[0].lifted_by == "abel"
    assert state.tool_calls[lift.call_id].status == "completed"
    assert [d.step for d in state.approvals[lift.call_id].decisions] == [
        "first_approved",
        "approved",
    ]
    assert_projections_match(other)
    assert Event.objects.filter(
        session=other, type="timeline.appended", payload__kind="restriction_lifted"
    ).exists()
