"""Timeouts never approve: an expired approval becomes `timeout` and a manual to-do that
operators resolve with a note. The sweeper runs with the workers' periodic tasks and in
the web processes; a decision after the deadline is refused whether or not it ran."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from aero.models import AuditLog
from approvals.actions import APPROVE, CONFIRM, do_decide, sweep_expired_approvals
from approvals.models import Approval, ManualTodo
from diagnosis import maintenance
from diagnosis.maintenance import register, run_periodic_tasks, start_web_ticker, stop_web_ticker
from diagnosis.models import Event, ToolCall
from packs.airport.models import Restriction
from tests.web_helpers import approval_for as approval
from tests.web_helpers import waiting_session

pytestmark = pytest.mark.services


def expire(item: Approval) -> None:
    Approval.objects.filter(pk=item.pk).update(deadline=timezone.now() - timedelta(seconds=1))


def test_expired_approval_becomes_a_manual_todo_never_an_approval(
    builtin: None, make_user: Callable[..., User]
) -> None:
    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    session = waiting_session(olga)
    closure = approval(session, "close_taxiway", taxiway="A")
    do_decide(closure.pk, abel, APPROVE, digest=closure.digest)  # approved once, never confirmed
    expire(closure)
    assert sweep_expired_approvals() == 1
    assert sweep_expired_approvals() == 0  # once

    closure.refresh_from_db()
    assert closure.status == "timeout" and closure.approver is None
    assert ToolCall.objects.get(pk=closure.tool_call_id).status == "timeout"
    assert not Restriction.objects.filter(kind="taxiway", target="A").exists()
    todo = ManualTodo.objects.get(approval=closure)
    assert "close_taxiway" in todo.title and todo.is_open
    event = Event.objects.get(session=session, type="approval.timeout")
    assert event.payload["todo"] == todo.pk
    assert AuditLog.objects.filter(action="approval.timeout", object_id=str(closure.pk)).exists()
    with pytest.raises(Exception, match="timed out"):
        do_decide(closure.pk, abel, CONFIRM, digest=closure.digest)

    # The other approvals are decided in time: the session completes, the report says so.
    for item in Approval.objects.filter(session=session).open():
        while item.is_open:
            item = do_decide(
                item.pk,
                abel,
                CONFIRM if item.status == "confirming" else APPROVE,
                digest=item.digest,
            )
    session.refresh_from_db()
    assert session.status == "completed"
    assert "超时（转人工）" in session.report.markdown  # the operator wrote in Chinese


def test_the_periodic_tasks_include_the_sweeper(
    builtin: None, make_user: Callable[..., User]
) -> None:
    session = waiting_session(make_user("olga", "operator"))
    for item in Approval.objects.filter(session=session):
        expire(item)
    run_periodic_tasks()
    assert set(Approval.objects.filter(session=session).values_list("status", flat=True)) == {
        "timeout"
    }
    assert ManualTodo.objects.filter(session=session).count() == 5
    session.refresh_from_db()
    assert session.status == "completed"  # every action settled: nothing waits any more


def test_operators_resolve_todos_with_a_note(builtin: None, make_user: Callable[..., User]) -> None:
    olga = make_user("olga", "operator")
    session = waiting_session(olga)
    crew = approval(session, "dispatch_cleanup_crew")
    expire(crew)
    sweep_expired_approvals()
    todo = ManualTodo.objects.get()
    client = Client()
    client.force_login(olga)

    page = client.get("/approvals/todos/")
    assert page.status_code == 200 and "dispatch_cleanup_crew" in page.content.decode()
    empty = client.post(f"/approvals/todos/{todo.pk}/resolve/", {"note": "  "}, follow=True)
    assert "a note is required" in empty.content.decode()
    todo.refresh_from_db()
    assert todo.is_open

    done = client.post(
        f"/approvals/todos/{todo.pk}/resolve/", {"note": "crew called by radio"}, follow=True
    )
    assert "To-do resolved." in done.content.decode()
    todo.refresh_from_db()
    assert todo.resolved_by == olga and todo.note == "crew called by radio"
    assert AuditLog.objects.filter(action="todo.resolved", object_id=str(todo.pk)).exists()
    assert Event.objects.filter(
        session=session, type="timeline.appended", payload__kind="todo_resolved"
    ).exists()
    again = client.post(f"/approvals/todos/{todo.pk}/resolve/", {"note": "twice"}, follow=True)
    assert "already resolved" in again.content.decode()


@pytest.mark.parametrize("roles", [("approver",), ("auditor",), ()])
def test_todo_pages_refuse_other_roles(
    builtin: None, make_user: Callable[..., User], roles: tuple[str, ...]
) -> None:
    session = waiting_session(make_user("olga", "operator"))
    crew = approval(session, "dispatch_cleanup_crew")
    expire(crew)
    sweep_expired_approvals()
    todo = ManualTodo.objects.get()
    client = Client()
    client.force_login(make_user("eve", *roles))
    # Approvers read the to-dos (issue 12); only operators and admins resolve them.
    assert client.get("/approvals/todos/").status_code == (200 if "approver" in roles else 403)
    assert client.post(f"/approvals/todos/{todo.pk}/resolve/", {"note": "x"}).status_code == 403
    todo.refresh_from_db()
    assert todo.is_open
    anonymous = Client().get("/approvals/todos/")
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]


def test_a_decision_after_the_deadline_is_refused_with_no_sweeper_running(
    builtin: None, make_user: Callable[..., User]
) -> None:
    """No worker swept it: the late decision itself turns the approval into its timeout
    to-do (with its event) and is refused; nothing executes."""
    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    session = waiting_session(olga)
    crew = approval(session, "dispatch_cleanup_crew")
    expire(crew)
    client = Client()
    client.force_login(abel)

    page = client.post(
        f"/approvals/{crew.pk}/decide/",
        {"decision": "approve", "digest": crew.digest},
        follow=True,
    )
    assert page.status_code == 200
    assert "deadline for this decision passed" in page.content.decode()
    crew.refresh_from_db()
    assert crew.status == "timeout" and crew.approver is None
    assert ToolCall.objects.get(pk=crew.tool_call_id).status == "timeout"
    todo = ManualTodo.objects.get(approval=crew)
    assert todo.is_open
    assert Event.objects.get(session=session, type="approval.timeout").payload["todo"] == todo.pk
    assert not Event.objects.filter(session=session, type="approval.approved").exists()
    assert not Event.objects.filter(
        session=session, type="tool.call_completed", payload__tool_name="dispatch_cleanup_crew"
    ).exists()
    # A second try is told what happened; the timeout is recorded once.
    with pytest.raises(Exception, match="timed out"):
        do_decide(crew.pk, abel, APPROVE, digest=crew.digest)
    assert Event.objects.filter(session=session, type="approval.timeout").count() == 1
    assert sweep_expired_approvals() == 0


def test_a_confirmation_after_the_deadline_is_refused(
    builtin: None, make_user: Callable[..., User]
) -> None:
    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    session = waiting_session(olga)
    closure = approval(session, "close_taxiway", taxiway="A")
    do_decide(closure.pk, abel, APPROVE, digest=closure.digest)
    expire(closure)
    with pytest.raises(Exception, match="deadline for this decision passed"):
        do_decide(closure.pk, abel, CONFIRM, "confirmed late", digest=closure.digest)
    closure.refresh_from_db()
    assert closure.status == "timeout"
    assert not Restriction.objects.filter(kind="taxiway", target="A").exists()
    assert ManualTodo.objects.filter(approval=closure).exists()


def test_the_web_process_sweeps_timeouts_with_every_worker_down(
    builtin: None, make_user: Callable[..., User], settings: Any
) -> None:
    """The gunicorn and daphne processes start a ticker that runs the sweeper: no job
    worker is needed for an approval to time out."""
    session = waiting_session(make_user("olga", "operator"))
    crew = approval(session, "dispatch_cleanup_crew")
    expire(crew)
    settings.AERO_WEB_TICK_SECONDS = 0.05
    assert start_web_ticker()
    try:
        give_up = time.monotonic() + 10
        while time.monotonic() < give_up and not ManualTodo.objects.filter(approval=crew).exists():
            time.sleep(0.05)
    finally:
        stop_web_ticker()
    crew.refresh_from_db()
    assert crew.status == "timeout"
    assert ManualTodo.objects.filter(approval=crew).count() == 1


def test_the_web_ticker_runs_only_the_web_tasks(builtin: None, settings: Any) -> None:
    ran: list[str] = []
    register("test-worker-only", lambda: ran.append("worker"))
    register("test-web", lambda: ran.append("web"), web=True)
    try:
        run_periodic_tasks(web_only=True)
        assert ran == ["web"]
        settings.AERO_WEB_TICK_SECONDS = 0
        assert start_web_ticker() is False  # switched off
    finally:
        maintenance._TASKS.pop("test-worker-only")
        maintenance._TASKS.pop("test-web")
        maintenance._WEB_TASKS.discard("test-web")


def test_one_approval_that_cannot_time_out_does_not_hold_up_the_others(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timeout that fails (a lock wait, a bad row) is retried at the next pass; every
    other expired approval still becomes its manual to-do in this one."""
    from approvals import actions

    session = waiting_session(make_user("olga", "operator"))
    closure = approval(session, "close_taxiway", taxiway="A")
    crew = approval(session, "dispatch_cleanup_crew")
    expire(closure)
    expire(crew)
    do_timeout = actions.do_timeout

    def broken_for_one(approval_id: int) -> bool:
        if approval_id == closure.pk:
            raise RuntimeError("lock timeout")
        return do_timeout(approval_id)

    monkeypatch.setattr(actions, "do_timeout", broken_for_one)
    assert sweep_expired_approvals() == 1
    crew.refresh_from_db()
    closure.refresh_from_db()
    assert (crew.status, closure.status) == ("timeout", "pending")

    monkeypatch.setattr(actions, "do_timeout", do_timeout)
    assert sweep_expired_approvals() == 1  # the next pass
    closure.refresh_from_db()
    assert closure.status == "timeout"


def test_a_burst_of_expiries_is_timed_out_in_bounded_batches_longest_expired_first(
    builtin: None, make_user: Callable[..., User], settings: Any
) -> None:
    """Approvals created together expire together: each pass times out at most
    AERO_TIMEOUT_BATCH of them (each timeout queues its session's job), the longest
    expired first, and the next passes the rest; nothing is timed out twice."""
    session = waiting_session(make_user("olga", "operator"))
    items = list(Approval.objects.filter(session=session).order_by("pk"))
    assert len(items) == 5
    now = timezone.now()
    for n, item in enumerate(items):
        Approval.objects.filter(pk=item.pk).update(deadline=now - timedelta(seconds=10 - n))
    settings.AERO_TIMEOUT_BATCH = 2

    assert sweep_expired_approvals() == 2
    timed_out = set(Approval.objects.filter(status="timeout").values_list("pk", flat=True))
    assert timed_out == {items[0].pk, items[1].pk}
    assert Event.objects.filter(session=session, type="approval.timeout").count() == 2
    assert sweep_expired_approvals() == 2
    assert sweep_expired_approvals() == 1
    assert sweep_expired_approvals() == 0
    assert Event.objects.filter(session=session, type="approval.timeout").count() == 5
    assert ManualTodo.objects.filter(session=session).count() == 5
