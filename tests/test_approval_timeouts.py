"""Timeouts never approve: an expired approval becomes `timeout` and a manual to-do that
operators resolve with a note. The sweeper runs with the workers' periodic tasks."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from aero.models import AuditLog
from approvals.actions import APPROVE, CONFIRM, do_decide, sweep_expired_approvals
from approvals.models import Approval, ManualTodo
from diagnosis.maintenance import run_periodic_tasks
from diagnosis.models import Event, Restriction, ToolCall
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
