"""The R0-R3 policy, integrity checks and the two-person rule, through approvals.actions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from aero.models import AuditLog
from approvals.actions import APPROVE, CONFIRM, REJECT, do_decide
from approvals.models import Approval
from diagnosis.actions import ActionError, do_answer, do_cancel
from diagnosis.models import Event, Session, ToolCall
from packs.airport.models import Restriction
from tests.web_helpers import TAXIWAY_FUEL_LEAK, waiting_session
from tests.web_helpers import approval_for as approval

pytestmark = pytest.mark.services


@pytest.fixture
def people(builtin: None, make_user: Callable[..., User]) -> dict[str, User]:
    return {
        "olga": make_user("olga", "operator"),
        "abel": make_user("abel", "approver"),
        "bea": make_user("bea", "approver"),
        "max": make_user("max", "operator", "approver"),
    }


def decide_all(session: Session, user: User, reason: str = "ok") -> None:
    for item in Approval.objects.filter(session=session).open():
        while item.is_open:
            step = CONFIRM if item.status == "confirming" else APPROVE
            item = do_decide(item.pk, user, step, reason, digest=item.digest)


def test_r0_runs_at_once_and_r1_needs_one_approval(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    atc = ToolCall.objects.get(session=session, tool_name="notify_atc")
    assert (atc.risk_class, atc.status) == ("R0", "completed")
    assert not Approval.objects.filter(tool_call=atc).exists()

    crew = approval(session, "dispatch_cleanup_crew")
    assert ToolCall.objects.get(pk=crew.tool_call_id).status == "awaiting_approval"
    crew = do_decide(crew.pk, people["abel"], APPROVE, digest=crew.digest)
    assert crew.status == "approved"
    assert ToolCall.objects.get(pk=crew.tool_call_id).status == "completed"  # executed on resume
    entry = AuditLog.objects.get(action="approval.approved", object_id=str(crew.pk))
    assert entry.actor == people["abel"]
    assert entry.detail["digest"] == crew.digest and entry.detail["tool"] == "dispatch_cleanup_crew"


def test_r2_needs_a_separate_confirmation(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    closure = approval(session, "close_taxiway", taxiway="A")
    with pytest.raises(ActionError, match="nothing to confirm"):
        do_decide(closure.pk, people["abel"], CONFIRM, digest=closure.digest)

    closure = do_decide(closure.pk, people["abel"], APPROVE, digest=closure.digest)
    assert closure.status == "confirming"
    assert ToolCall.objects.get(pk=closure.tool_call_id).status == "awaiting_approval"
    assert not Restriction.objects.exists()  # nothing runs on the first approval
    # A second "approve" (a double click) is not a confirmation.
    with pytest.raises(ActionError, match="confirm it explicitly"):
        do_decide(closure.pk, people["abel"], APPROVE, digest=closure.digest)

    closure = do_decide(
        closure.pk, people["abel"], CONFIRM, digest=closure.digest
    )  # same approver: allowed by default
    assert closure.status == "approved"
    assert list(Restriction.objects.values_list("kind", "target")) == [("taxiway", "A")]
    assert Event.objects.filter(session=session, type="approval.first_approved").count() == 1


def test_r3_needs_a_written_reason(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"], TAXIWAY_FUEL_LEAK)
    runway = approval(session, "close_runway", runway="06/24")
    assert runway.risk_class == "R3"
    with pytest.raises(ActionError, match="written reason"):
        do_decide(runway.pk, people["abel"], APPROVE, digest=runway.digest)
    assert Approval.objects.get(pk=runway.pk).status == "pending"
    runway = do_decide(
        runway.pk,
        people["abel"],
        APPROVE,
        "fuel on the runway exit, confirmed by tower",
        digest=runway.digest,
    )
    assert runway.status == "approved"
    assert Restriction.objects.filter(
        kind="runway", target="06/24", lifted_at__isnull=True
    ).exists()


def test_rejection_needs_a_reason_and_the_agent_carries_on(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    closure = approval(session, "close_taxiway", taxiway="B")
    with pytest.raises(ActionError, match="rejection needs a reason"):
        do_decide(closure.pk, people["abel"], REJECT, digest=closure.digest)
    do_decide(
        closure.pk, people["abel"], REJECT, "taxiway B is upwind and dry", digest=closure.digest
    )
    assert ToolCall.objects.get(pk=closure.tool_call_id).status == "rejected"
    note = Event.objects.get(session=session, type="agent.note")
    assert "close_taxiway" in note.payload["text"] and "upwind and dry" in note.payload["text"]

    decide_all(session, people["abel"])
    session.refresh_from_db()
    assert session.status == "completed"
    assert "upwind and dry" in session.report.markdown
    assert not Restriction.objects.filter(kind="taxiway", target="B").exists()


def test_two_person_rule(people: dict[str, User], settings: Any) -> None:
    settings.AERO_TWO_PERSON_RULE = True
    session = waiting_session(people["max"])  # max created it and is also an approver
    stand = approval(session, "suspend_stand_operations")
    with pytest.raises(ActionError, match="creator cannot approve"):
        do_decide(stand.pk, people["max"], APPROVE, digest=stand.digest)
    crew = approval(session, "dispatch_cleanup_crew")
    assert (
        do_decide(crew.pk, people["max"], APPROVE, digest=crew.digest).status == "approved"
    )  # R1: no rule

    stand = do_decide(stand.pk, people["abel"], APPROVE, digest=stand.digest)
    with pytest.raises(ActionError, match="different approver"):
        do_decide(stand.pk, people["abel"], CONFIRM, digest=stand.digest)
    assert do_decide(stand.pk, people["bea"], CONFIRM, digest=stand.digest).status == "approved"


def test_two_person_rule_makes_r3_two_steps(people: dict[str, User], settings: Any) -> None:
    settings.AERO_TWO_PERSON_RULE = True
    session = waiting_session(people["olga"], TAXIWAY_FUEL_LEAK)
    runway = approval(session, "close_runway", runway="06/24")
    runway = do_decide(runway.pk, people["abel"], APPROVE, digest=runway.digest)
    assert runway.status == "confirming"
    with pytest.raises(ActionError, match="written reason"):
        do_decide(runway.pk, people["bea"], CONFIRM, digest=runway.digest)
    assert (
        do_decide(runway.pk, people["bea"], CONFIRM, "tower agrees", digest=runway.digest).status
        == "approved"
    )


def test_stale_requests_are_refused(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    crew = approval(session, "dispatch_cleanup_crew")
    with pytest.raises(ActionError, match="not the one you were shown"):
        do_decide(crew.pk, people["abel"], APPROVE, digest="0" * 64)

    ToolCall.objects.filter(pk=crew.tool_call_id).update(request_payload={"position": "106"})
    with pytest.raises(ActionError, match="arguments changed"):
        do_decide(crew.pk, people["abel"], APPROVE, digest=crew.digest)

    fire = approval(session, "request_fire_standby")
    snapshot = session.snapshot
    snapshot["risk"]["level"] = "LOW"
    Session.objects.filter(pk=session.pk).update(snapshot=snapshot)
    with pytest.raises(ActionError, match="state moved on"):
        do_decide(fire.pk, people["abel"], APPROVE, digest=fire.digest)

    do_cancel(session.pk, people["olga"], "false alarm")
    stand = approval(session, "suspend_stand_operations")
    with pytest.raises(ActionError, match="canceled"):
        do_decide(stand.pk, people["abel"], APPROVE, digest=stand.digest)
    assert not AuditLog.objects.filter(action__startswith="approval.").exists()


def test_a_chat_message_never_counts_as_approval(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    with pytest.raises(ActionError, match="nothing to answer"):
        do_answer(session.pk, people["olga"], "approve all, go ahead")
    assert set(Approval.objects.filter(session=session).values_list("status", flat=True)) == {
        "pending"
    }
    assert not Event.objects.filter(session=session, type="user.message", seq__gt=2).exists()


def test_an_approved_action_runs_once_even_if_the_job_is_retried(
    people: dict[str, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    from packs.airport.agent.nodes import execution

    session = waiting_session(people["olga"])
    original = execution.run_action
    failures = {"left": 1}

    def run_then_crash(ctx: Any, tool_call_id: int) -> ToolCall:
        result = original(ctx, tool_call_id)
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("worker lost its database connection")
        return result

    monkeypatch.setattr(execution, "run_action", run_then_crash)
    closure = approval(session, "close_taxiway", taxiway="A")
    do_decide(closure.pk, people["abel"], APPROVE, digest=closure.digest)
    do_decide(closure.pk, people["abel"], CONFIRM, digest=closure.digest)

    assert failures["left"] == 0  # the first attempt crashed after executing
    assert Event.objects.filter(
        session=session, type="session.status_changed", payload__to="retrying"
    ).exists()
    assert Restriction.objects.filter(kind="taxiway", target="A").count() == 1
    tool_call = ToolCall.objects.get(pk=closure.tool_call_id)
    assert (tool_call.status, tool_call.attempts) == ("completed", 1)
    session.refresh_from_db()
    assert session.status == "waiting_user"


def test_deadlines_follow_the_risk_class(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"], TAXIWAY_FUEL_LEAK)
    minutes = {
        a.risk_class: round((a.deadline - a.created_at).total_seconds() / 60)
        for a in Approval.objects.filter(session=session)
        if a.deadline is not None
    }
    assert minutes == {"R1": 15, "R2": 10, "R3": 5}
