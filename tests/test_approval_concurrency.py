"""Concurrent approvers and double clicks against PostgreSQL: exactly one decision is
recorded per step, whatever the timing."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections
from django.test import Client

from aero.models import AuditLog
from approvals.models import Approval
from diagnosis.models import Event, ToolCall
from tests.web_helpers import approval_for as approval
from tests.web_helpers import waiting_session

pytestmark = pytest.mark.services


def post_together(requests: list[tuple[User, str, dict[str, str]]]) -> list[int]:
    """POST all requests at the same moment, each from its own thread and connection."""
    barrier = threading.Barrier(len(requests))
    statuses: list[int] = [0] * len(requests)

    def worker(index: int, user: User, url: str, data: dict[str, str]) -> None:
        client = Client()
        client.force_login(user)
        try:
            barrier.wait(timeout=10)
            statuses[index] = client.post(url, data, headers={"HX-Request": "true"}).status_code
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=worker, args=(i, *request)) for i, request in enumerate(requests)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return statuses


@pytest.mark.parametrize("attempt", range(3))
def test_two_approvers_at_once_record_one_decision(
    builtin: None, make_user: Callable[..., User], attempt: int
) -> None:
    assert connection.vendor == "postgresql"
    session = waiting_session(make_user("olga", "operator"))
    abel, bea = make_user("abel", "approver"), make_user("bea", "approver")
    crew = approval(session, "dispatch_cleanup_crew")
    url = f"/approvals/{crew.pk}/decide/"
    data = {"decision": "approve", "digest": crew.digest}

    statuses = post_together([(abel, url, data), (bea, url, data)])

    assert sorted(statuses) == [200, 400]  # one recorded, one told it was already decided
    crew.refresh_from_db()
    assert crew.status == "approved" and crew.approver in (abel, bea)
    assert AuditLog.objects.filter(action="approval.approved", object_id=str(crew.pk)).count() == 1
    assert (
        Event.objects.filter(
            session=session, type="approval.approved", payload__tool_call=crew.tool_call_id
        ).count()
        == 1
    )
    assert ToolCall.objects.get(pk=crew.tool_call_id).attempts == 1  # executed once


def test_a_double_click_on_approve_is_not_a_confirmation(
    builtin: None, make_user: Callable[..., User]
) -> None:
    session = waiting_session(make_user("olga", "operator"))
    abel = make_user("abel", "approver")
    stand = approval(session, "suspend_stand_operations")
    url = f"/approvals/{stand.pk}/decide/"
    data = {"decision": "approve", "digest": stand.digest}

    statuses = post_together([(abel, url, data), (abel, url, data)])

    assert sorted(statuses) == [200, 400]
    stand.refresh_from_db()
    assert stand.status == "confirming"  # still needs its explicit confirmation
    assert ToolCall.objects.get(pk=stand.tool_call_id).status == "awaiting_approval"
    assert Approval.objects.get(pk=stand.pk).approver is None


def test_reject_and_approve_racing(builtin: None, make_user: Callable[..., User]) -> None:
    session = waiting_session(make_user("olga", "operator"))
    abel, bea = make_user("abel", "approver"), make_user("bea", "approver")
    fire = approval(session, "request_fire_standby")
    url = f"/approvals/{fire.pk}/decide/"
    statuses = post_together(
        [
            (abel, url, {"decision": "approve", "digest": fire.digest}),
            (bea, url, {"decision": "reject", "reason": "not needed", "digest": fire.digest}),
        ]
    )
    assert sorted(statuses) == [200, 400]
    fire.refresh_from_db()
    assert fire.status in ("approved", "rejected")
    decided = Event.objects.filter(
        session=session,
        payload__tool_call=fire.tool_call_id,
        type__in=["approval.approved", "approval.rejected"],
    )
    assert decided.count() == 1
