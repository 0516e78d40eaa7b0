"""Admins soft-delete sessions: gone from every list, events and audit entries kept, the
log says so (`session.deleted`), open approvals closed with events, still replayable."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from aero.models import AuditLog
from approvals.models import Approval
from diagnosis.actions import ActionError, do_delete_session, do_retry
from diagnosis.chain import verify_chain
from diagnosis.models import Event, Session
from tests.log_helpers import assert_projections_match
from tests.web_helpers import login, login_url, waiting_session

pytestmark = pytest.mark.services


@pytest.fixture
def people(builtin: None, make_user: Callable[..., User]) -> dict[str, User]:
    return {
        "olga": make_user("olga", "operator"),
        "abel": make_user("abel", "approver"),
        "carol": make_user("carol", "auditor"),
        "ada": make_user("ada", "admin"),
    }


def delete_url(session: Session) -> str:
    return reverse("diagnosis:session-delete", args=[session.pk])


def test_an_admin_deletes_a_waiting_session_after_confirming(people: dict[str, User]) -> None:
    olga, ada = people["olga"], people["ada"]
    session = waiting_session(olga)
    open_before = Approval.objects.filter(session=session).open().count()
    admin = login(ada)

    page = admin.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert f'href="{delete_url(session)}"' in page  # the button, for admins only
    assert (
        delete_url(session)
        not in login(olga)
        .get(reverse("diagnosis:session-detail", args=[session.pk]))
        .content.decode()
    )

    confirm = admin.get(delete_url(session)).content.decode()
    assert "canceled</strong> first" in confirm
    assert f"{open_before} open approvals will be closed undecided" in confirm

    # Without a reason or without the tick: refused, nothing changes.
    response = admin.post(delete_url(session), {"reason": "", "confirm": "on"})
    assert response.status_code == 400
    assert "a reason is required" in response.content.decode()
    response = admin.post(delete_url(session), {"reason": "duplicate of another session"})
    assert response.status_code == 400 and "Tick the box" in response.content.decode()
    session.refresh_from_db()
    assert session.deleted_at is None and session.status == "waiting_user"

    response = admin.post(
        delete_url(session), {"reason": "duplicate of another session", "confirm": "on"}
    )
    assert response.status_code == 302 and response["Location"] == reverse("diagnosis:session-list")
    session.refresh_from_db()
    assert session.deleted_at is not None and session.deleted_by == ada
    assert session.status == "canceled"

    # Out of the lists and the queue; the live page is gone.
    listing = admin.get(reverse("diagnosis:session-list")).content.decode()
    assert str(session.pk) not in listing and "was deleted" in listing
    assert admin.get(reverse("diagnosis:session-detail", args=[session.pk])).status_code == 404
    queue = login(people["abel"]).get(reverse("approvals:queue")).content.decode()
    assert str(session.pk) not in queue
    assert not Approval.objects.filter(session=session).open().exists()
    assert Event.objects.filter(session=session, type="approval.canceled").count() == open_before

    # Kept: events, the audit entry, the chain; the fold marks it deleted.
    deleted = Event.objects.get(session=session, type="session.deleted")
    assert deleted.payload["by"] == "ada"
    assert deleted.payload["reason"] == "duplicate of another session"
    entry = AuditLog.objects.get(action="session.deleted", object_id=str(session.pk))
    assert entry.detail["reason"] == "duplicate of another session"
    state = assert_projections_match(session)
    assert state.is_deleted and state.deleted_by == "ada" and state.deleted_at == session.deleted_at
    assert verify_chain(session.pk).ok

    with pytest.raises(ActionError, match="already deleted"):
        do_delete_session(session.pk, ada, "again")


def test_a_deleted_failed_session_cannot_be_retried(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    Session.objects.filter(pk=session.pk).update(status="failed")
    do_delete_session(session.pk, people["ada"], "test data")
    with pytest.raises(ActionError, match="deleted"):
        do_retry(session.pk, people["olga"])
    # Its approvals were still open (the session had failed): closed with events too.
    assert not Approval.objects.filter(session=session).open().exists()


@pytest.mark.parametrize("persona", ["olga", "abel", "carol"])
def test_only_admins_may_delete(people: dict[str, User], persona: str) -> None:
    session = waiting_session(people["olga"])
    client = login(people[persona])
    assert client.get(delete_url(session)).status_code == 403
    response = client.post(delete_url(session), {"reason": "mine now", "confirm": "on"})
    assert response.status_code == 403
    session.refresh_from_db()
    assert session.deleted_at is None


def test_anonymous_is_sent_to_login(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    response = login(None).get(delete_url(session))
    assert response.status_code == 302 and response["Location"] == login_url(delete_url(session))


def test_the_admin_action_asks_for_a_reason_then_deletes(people: dict[str, User]) -> None:
    session = waiting_session(people["olga"])
    root = User.objects.create_superuser("root", password="pw-for-tests")
    client = login(root)
    changelist = reverse("admin:diagnosis_session_changelist")
    picked = {"action": "soft_delete", "_selected_action": [str(session.pk)]}
    confirm = client.post(changelist, picked)
    assert confirm.status_code == 200
    assert "Delete sessions?" in confirm.content.decode()
    session.refresh_from_db()
    assert session.deleted_at is None

    response = client.post(
        changelist, {**picked, "confirm_delete": "1", "reason": "", "confirm": "on"}
    )
    assert "a reason is required" in response.content.decode()
    response = client.post(
        changelist, {**picked, "confirm_delete": "1", "reason": "training data", "confirm": "on"}
    )
    assert response.status_code == 302
    session.refresh_from_db()
    assert session.deleted_by == root and session.status == "canceled"
    assert Event.objects.filter(session=session, type="session.deleted").exists()
