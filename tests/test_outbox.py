"""The outbox: an action's effect reaches its external system with the call's idempotency
key, from an outbox row that committed with the decision; the result is recorded once;
a crash between the effect and the recording never repeats the effect; transient
failures are retried twice (1 s, 2 s) and then end as a failure the user sees."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from approvals.actions import APPROVE, CONFIRM, do_decide
from diagnosis import external, jobs, outbox
from diagnosis.models import Event, ExternalEffect, Outbox, Session, ToolCall
from packs.airport import actions as airport_actions
from packs.airport.models import Restriction
from tests.log_helpers import assert_projections_match
from tests.web_helpers import approval_for, approve_everything, login, waiting_session

pytestmark = pytest.mark.services


class Crash(BaseException):
    """The worker dies here (not an error the code could catch and record)."""


@pytest.fixture
def people(builtin: None, make_user: Callable[..., User]) -> dict[str, User]:
    return {
        "olga": make_user("olga", "operator"),
        "abel": make_user("abel", "approver"),
        "bea": make_user("bea", "approver"),
    }


@pytest.fixture
def no_faults() -> Iterator[None]:
    yield
    external.fault = None


@pytest.fixture
def delays(monkeypatch: pytest.MonkeyPatch, settings: Any) -> list[float]:
    """The executor's waits between attempts, recorded instead of slept."""
    settings.AERO_TOOL_BACKOFF = 1.0
    waited: list[float] = []
    monkeypatch.setattr(outbox, "sleep", waited.append)
    return waited


def events_of(session: Session, call: ToolCall) -> list[str]:
    return list(
        Event.objects.filter(session=session, payload__tool_call=call.pk)
        .order_by("seq")
        .values_list("type", flat=True)
    )


def test_every_action_reaches_its_system_once_with_its_key(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    approve_everything(session, people["abel"])  # abel approves, then confirms: no 2-person
    assert session.status == "completed"

    actions = list(ToolCall.objects.filter(session=session, is_action=True))
    assert actions and all(call.status == "completed" for call in actions)
    for call in actions:
        effect = ExternalEffect.objects.get(idempotency_key=call.idempotency_key)
        assert effect.requests == 1
        assert effect.operation == call.tool_name
        assert call.response_payload["reference"] == effect.response["reference"]
        assert Outbox.objects.get(tool_call=call).status == "done"
        assert events_of(session, call)[-3:] == [
            "tool.call_queued",
            "tool.call_started",
            "tool.call_completed",
        ]
    # notify_atc is R0: handed over in the agent's step, no decision needed.
    atc = next(c for c in actions if c.tool_name == "notify_atc")
    assert ExternalEffect.objects.get(idempotency_key=atc.idempotency_key).system == "atc"
    assert_projections_match(session)


def test_the_outbox_row_commits_with_the_decision(
    people: dict[str, User], settings: Any, clean_queue: None
) -> None:
    """Nothing has run yet (the job waits in the queue): the decision already left the
    call `executing`, its pending row and its event; the external system saw nothing."""
    session = waiting_session(people["olga"])
    crew = approval_for(session, "dispatch_cleanup_crew")
    settings.AERO_JOB_BACKEND = "rq"
    do_decide(crew.pk, people["abel"], APPROVE, digest=crew.digest)

    call = ToolCall.objects.get(pk=crew.tool_call_id)
    assert call.status == "executing"
    row = Outbox.objects.get(tool_call=call)
    assert (row.status, row.idempotency_key) == ("pending", call.idempotency_key)
    assert call.attempts == 0  # not tried yet
    assert events_of(session, call)[-2:] == ["approval.approved", "tool.call_queued"]
    assert not ExternalEffect.objects.filter(idempotency_key=call.idempotency_key).exists()
    assert_projections_match(session)


def test_a_crash_between_the_effect_and_its_record_never_repeats_the_effect(
    people: dict[str, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    session = waiting_session(people["olga"])
    closure = approval_for(session, "close_taxiway", taxiway="A")
    do_decide(closure.pk, people["abel"], APPROVE, digest=closure.digest)

    def die(*args: Any) -> str:
        raise Crash()

    record = outbox.record_success
    monkeypatch.setattr(outbox, "record_success", die)
    with pytest.raises(Crash):  # the confirmation's job performs the effect, then dies
        do_decide(closure.pk, people["bea"], CONFIRM, digest=closure.digest)
    call = ToolCall.objects.get(pk=closure.tool_call_id)
    effect = ExternalEffect.objects.get(idempotency_key=call.idempotency_key)
    assert effect.requests == 1
    assert call.status == "running" and Outbox.objects.get(tool_call=call).status == "pending"
    assert not Restriction.objects.filter(tool_call=call).exists()

    # A new job (the reconciler's, after the lease lapsed) re-runs the step.
    monkeypatch.setattr(outbox, "record_success", record)
    Session.objects.filter(pk=session.pk).update(
        lease_token=None, lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    jobs.advance_session(str(session.pk))

    call.refresh_from_db()
    assert call.status == "completed" and call.attempts == 2
    effect.refresh_from_db()
    assert effect.requests == 2  # the same key, sent again ...
    assert ExternalEffect.objects.filter(idempotency_key=call.idempotency_key).count() == 1
    assert call.response_payload["reference"] == effect.response["reference"]  # ... one effect
    assert Restriction.objects.filter(tool_call=call).count() == 1
    assert events_of(session, call).count("tool.call_completed") == 1
    assert events_of(session, call).count("tool.call_queued") == 1
    assert_projections_match(session)


def test_a_transient_failure_is_retried_with_the_same_key(
    people: dict[str, User], delays: list[float], no_faults: None
) -> None:
    failures = iter([external.ExternalUnavailable("dispatch desk answered 503")])

    def flaky(system: str, operation: str, key: str) -> None:
        error = next(failures, None)
        if error is not None:
            raise error

    session = waiting_session(people["olga"])
    external.fault = flaky
    crew = approval_for(session, "dispatch_cleanup_crew")
    do_decide(crew.pk, people["abel"], APPROVE, digest=crew.digest)

    call = ToolCall.objects.get(pk=crew.tool_call_id)
    assert call.status == "completed" and call.attempts == 2
    assert delays == [1.0]
    assert ExternalEffect.objects.get(idempotency_key=call.idempotency_key).requests == 1
    assert events_of(session, call)[-5:] == [
        "tool.call_queued",
        "tool.call_started",
        "tool.call_retrying",
        "tool.call_started",
        "tool.call_completed",
    ]
    assert_projections_match(session)


def test_retries_run_out_into_a_failure_the_user_sees(
    people: dict[str, User], delays: list[float], no_faults: None
) -> None:
    def down(system: str, operation: str, key: str) -> None:
        raise external.ExternalUnavailable(f"{system} unreachable")

    session = waiting_session(people["olga"])
    external.fault = down
    crew = approval_for(session, "dispatch_cleanup_crew")
    do_decide(crew.pk, people["abel"], APPROVE, digest=crew.digest)

    call = ToolCall.objects.get(pk=crew.tool_call_id)
    assert call.status == "failed" and call.attempts == 3
    assert call.error == "gave up after 3 attempts: dispatch unreachable"
    assert delays == [1.0, 2.0]  # 2 retries, linear
    assert Outbox.objects.get(tool_call=call).status == "failed"
    assert not ExternalEffect.objects.filter(idempotency_key=call.idempotency_key).exists()
    types = events_of(session, call)
    assert types.count("tool.call_started") == 3
    assert types.count("tool.call_retrying") == 2
    assert types[-1] == "tool.call_failed"
    assert_projections_match(session)

    # On the session page: in the actions panel and on the timeline.
    page = login(people["olga"]).get(reverse("diagnosis:session-detail", args=[session.pk]))
    html = page.content.decode()
    assert "gave up after 3 attempts: dispatch unreachable" in html
    assert "attempt 2 failed (dispatch unreachable); retrying in 2.0 s" in html

    # Nothing is retried behind the user's back: the session goes on without it, and the
    # report lists the action as failed.
    external.fault = None
    approve_everything(session, people["abel"])
    assert session.status == "completed"
    call.refresh_from_db()
    assert call.status == "failed"
    # (in the session's language: its action table in words)
    (row,) = [r for r in session.report.markdown.splitlines() if r.startswith("| 派遣清污队 |")]
    assert "失败" in row


def test_external_systems_are_never_called_inside_our_transaction(builtin: None) -> None:
    with transaction.atomic(), pytest.raises(RuntimeError, match="outside the database"):
        external.request(airport_actions.ATC, "notify_atc", "k-1", {})
    assert not ExternalEffect.objects.exists()


def test_a_key_seen_before_returns_the_stored_response(builtin: None) -> None:
    first = external.request(airport_actions.DISPATCH, "fod_sweep", "k-2", {"runway": "06/24"})
    again = external.request(airport_actions.DISPATCH, "fod_sweep", "k-2", {"runway": "06/24"})
    assert again == first
    effect = ExternalEffect.objects.get(idempotency_key="k-2")
    assert effect.requests == 2


# --- lifting a closure: the same outbox, no session job behind it ---------------------


def tool_events_of(call: ToolCall) -> list[str]:
    """The call's own events (a lift's `timeline.appended` notes name it too)."""
    return [t for t in events_of(call.session, call) if t.startswith("tool.")]


def decided_lift(
    people: dict[str, User], before_deciding: Callable[[], None] = lambda: None
) -> tuple[Restriction, ToolCall, Session]:
    """A completed session's stand closure, and an approved-and-confirmed lift of it."""
    from approvals.models import Approval
    from diagnosis.lifts import do_request_lift

    session = waiting_session(people["olga"])
    approve_everything(session, people["abel"])
    closure = Restriction.objects.get(session=session, kind="stand")
    lift = do_request_lift(closure.pk, people["olga"], "stand cleaned and inspected")
    approval = Approval.objects.get(tool_call=lift)
    before_deciding()
    do_decide(approval.pk, people["abel"], APPROVE, digest=approval.digest)
    do_decide(approval.pk, people["bea"], CONFIRM, digest=approval.digest)
    closure.refresh_from_db()
    lift.refresh_from_db()
    return closure, lift, session


def test_a_lift_reaches_the_operations_system_once_with_its_key(
    people: dict[str, User],
) -> None:
    closure, lift, _ = decided_lift(people)

    assert closure.lifted_at is not None and closure.lifted_by == people["bea"]
    effect = ExternalEffect.objects.get(idempotency_key=lift.idempotency_key)
    assert (effect.system, effect.operation, effect.requests) == ("airport_ops", lift.tool_name, 1)
    assert effect.request["target"] == closure.target
    assert lift.status == "completed"
    assert lift.response_payload["reference"] == effect.response["reference"]
    assert Outbox.objects.get(tool_call=lift).status == "done"
    assert tool_events_of(lift)[-2:] == ["tool.call_queued", "tool.call_completed"]
    assert_projections_match(lift.session)


def test_a_crash_after_the_lift_decision_is_finished_by_the_sweeper_once(
    people: dict[str, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    from diagnosis import lifts

    def crash_before_sending(*args: Any, **kwargs: Any) -> str:
        raise Crash()  # the web process died right after the decision committed

    monkeypatch.setattr(lifts, "execute_lift", crash_before_sending)
    with pytest.raises(Crash):
        decided_lift(people)
    monkeypatch.undo()
    closure = Restriction.objects.get(kind="stand")
    lift = ToolCall.objects.get(tool_name="lift_restriction")
    assert closure.lifted_at is None  # decided, queued, not yet done: still in force
    assert lift.status == "executing"
    row = Outbox.objects.get(tool_call=lift)
    assert row.status == "pending"

    assert lifts.resume_pending_lifts() == 0  # a fresh row may still be on its way
    Outbox.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(minutes=5))

    # A pass whose sending fails (the database, say) ends quietly; the next one retries.
    def database_gone(*args: Any, **kwargs: Any) -> str:
        raise RuntimeError("connection lost")

    monkeypatch.setattr(lifts, "execute_lift", database_gone)
    assert lifts.resume_pending_lifts() == 1
    monkeypatch.undo()
    assert Outbox.objects.get(pk=row.pk).status == "pending"
    assert lifts.resume_pending_lifts() == 1
    assert lifts.resume_pending_lifts() == 0  # done: never sent again

    closure.refresh_from_db()
    assert closure.lifted_at is not None
    assert ExternalEffect.objects.get(idempotency_key=lift.idempotency_key).requests == 1
    assert tool_events_of(lift).count("tool.call_completed") == 1
    assert_projections_match(lift.session)


def test_a_lift_whose_answer_was_lost_is_recorded_once_without_a_second_effect(
    people: dict[str, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operations system lifted it, then our process died before recording: the
    repeat with the same key performs nothing and the lift is recorded once."""
    from diagnosis import lifts

    real_record = lifts._record_lift
    calls: list[int] = []

    def die_once(outbox_id: int, producer: str, **kwargs: Any) -> str:
        calls.append(outbox_id)
        if len(calls) == 1:
            raise Crash()
        return real_record(outbox_id, producer, **kwargs)

    monkeypatch.setattr(lifts, "_record_lift", die_once)
    with pytest.raises(Crash):
        decided_lift(people)
    lift = ToolCall.objects.get(tool_name="lift_restriction")
    row = Outbox.objects.get(tool_call=lift)
    Outbox.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(minutes=5))

    assert lifts.resume_pending_lifts() == 1
    effect = ExternalEffect.objects.get(idempotency_key=lift.idempotency_key)
    assert effect.requests == 2  # sent twice, performed once (the stored answer came back)
    lift.refresh_from_db()
    assert lift.status == "completed"
    assert lift.response_payload["reference"] == effect.response["reference"]
    assert Restriction.objects.get(kind="stand").lifted_at is not None
    assert tool_events_of(lift).count("tool.call_completed") == 1


def test_an_unreachable_operations_system_is_retried_then_the_lift_fails_visibly(
    people: dict[str, User], no_faults: None, delays: list[float]
) -> None:
    def down(system: str, operation: str, key: str) -> None:
        raise external.ExternalUnavailable("503 from airport_ops")

    def operations_system_goes_down() -> None:
        external.fault = down

    closure, lift, _ = decided_lift(people, operations_system_goes_down)

    assert delays == [1.0, 2.0]  # two retries, linear, then it gives up
    assert closure.lifted_at is None  # the closure stays in force, as on the real board
    assert lift.status == "failed" and "gave up after 3 attempts" in lift.error
    assert Outbox.objects.get(tool_call=lift).status == "failed"
    assert tool_events_of(lift)[-4:] == [
        "tool.call_queued",
        "tool.call_retrying",
        "tool.call_retrying",
        "tool.call_failed",
    ]
    assert not ExternalEffect.objects.filter(idempotency_key=lift.idempotency_key).exists()
    assert_projections_match(lift.session)


def test_a_lift_is_sent_in_the_background_not_in_the_deciding_request(
    people: dict[str, User],
    no_faults: None,
    delays: list[float],
    settings: Any,
    clean_queue: None,
) -> None:
    """The operations system is down. The approver who confirms the lift gets the page
    back with the lift "being sent": no attempt and no retry happened in the request.
    The background job then tries three times (two retries logged) and records the
    failure once; the board offers the lift again and the closure stays in force."""
    import django_rq
    from rq import SimpleWorker

    from approvals.models import Approval
    from diagnosis.lifts import do_request_lift, lift_job_id

    session = waiting_session(people["olga"])
    approve_everything(session, people["abel"])
    closure = Restriction.objects.get(session=session, kind="stand")
    lift = do_request_lift(closure.pk, people["olga"], "stand cleaned and inspected")
    approval = Approval.objects.get(tool_call=lift)
    do_decide(approval.pk, people["abel"], APPROVE, digest=approval.digest)

    attempts: list[str] = []

    def down(system: str, operation: str, key: str) -> None:
        attempts.append(key)
        raise external.ExternalUnavailable("503 from airport_ops")

    external.fault = down
    settings.AERO_JOB_BACKEND = "rq"  # as under `make run`: workers on Redis
    approver = login(people["bea"])
    answer = approver.post(
        reverse("approvals:decide", args=[approval.pk]),
        {"decision": CONFIRM, "digest": approval.digest},
    )
    assert answer.status_code == 302
    assert attempts == []  # nothing sent, nothing waited for in the request
    assert tool_events_of(lift)[-1] == "tool.call_queued"
    assert Outbox.objects.get(tool_call=lift).status == "pending"
    board = approver.get(reverse("airport:board")).content.decode()
    assert 'data-testid="lift-sending"' in board
    queue = django_rq.get_queue(settings.AERO_PRIORITY_QUEUE)  # ahead of session jobs
    assert queue.get_job_ids() == [lift_job_id(Outbox.objects.get(tool_call=lift).pk)]

    SimpleWorker([queue], connection=queue.connection).work(burst=True)

    assert len(attempts) == 3 and set(attempts) == {lift.idempotency_key}
    assert delays == [1.0, 2.0]
    lift.refresh_from_db()
    assert lift.status == "failed" and "gave up after 3 attempts" in lift.error
    assert tool_events_of(lift)[-4:] == [
        "tool.call_queued",
        "tool.call_retrying",
        "tool.call_retrying",
        "tool.call_failed",
    ]
    board = approver.get(reverse("airport:board")).content.decode()
    assert 'data-testid="lift-sending"' not in board
    # In force still, with nothing under way: the lift may be asked for again.
    assert f'<tr class="closed" data-target="{closure.target}">' in board
    assert 'data-testid="lift-pending"' not in board
    Outbox.objects.filter(tool_call=lift).update(created_at=timezone.now() - timedelta(minutes=5))
    from diagnosis.lifts import resume_pending_lifts

    assert resume_pending_lifts() == 0  # recorded once: never sent again
    assert len(attempts) == 3
    assert_projections_match(lift.session)


def test_a_lift_the_queue_cannot_take_is_left_to_the_sweeper(
    people: dict[str, User], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis down when the decision commits: the decision stands (no error for the
    approver), the row stays pending, and the sweeper sends it once."""
    import django_rq

    from diagnosis import lifts

    def no_redis(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("Redis is down")

    def redis_goes_down() -> None:
        settings.AERO_JOB_BACKEND = "rq"
        monkeypatch.setattr(django_rq, "get_queue", no_redis)

    closure, lift, _ = decided_lift(people, redis_goes_down)
    monkeypatch.undo()
    settings.AERO_JOB_BACKEND = "inline"
    assert closure.lifted_at is None and lift.status == "executing"
    row = Outbox.objects.get(tool_call=lift)
    Outbox.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    assert lifts.resume_pending_lifts() == 1
    closure.refresh_from_db()
    assert closure.lifted_at is not None
    assert ExternalEffect.objects.get(idempotency_key=lift.idempotency_key).requests == 1
