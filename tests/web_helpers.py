"""Plain factories shared by the web view tests. Sessions are opened through the same action
the view calls, so the agent runs inline when the creating transaction commits: callers need
the `builtin` fixture (transactional database)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from approvals.actions import do_decide
from approvals.models import Approval
from diagnosis.actions import do_create_session
from diagnosis.models import Session
from scenarios_admin.models import Scenario

# Every P1 field given: the agent runs straight to the approvals (R1 and R2 on stand 105).
STAND_FUEL_LEAK = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"
# A taxiway node next to runway 06/24: the impact reaches the runway, so close_runway (R3).
TAXIWAY_FUEL_LEAK = "MU5678 滑行道C1 燃油泄漏 发动机运转 持续泄漏"
# The position is missing: the agent asks where the spill is.
NO_POSITION = "CA1234 fuel leak"


def make_session(user: User, message: str = STAND_FUEL_LEAK) -> Session:
    session = do_create_session(user, Scenario.objects.get(slug="oil_spill"), message)
    session.refresh_from_db()
    return session


def waiting_session(user: User, message: str = STAND_FUEL_LEAK) -> Session:
    """A session that ran until its actions wait for approvers."""
    session = make_session(user, message)
    assert session.status == "waiting_user"
    return session


def approval_for(session: Session, tool: str, **args: Any) -> Approval:
    approvals = [
        a
        for a in Approval.objects.filter(session=session, action_name=tool).select_related(
            "tool_call"
        )
        if all(a.tool_call.request_payload.get(k) == v for k, v in args.items())
    ]
    assert len(approvals) == 1, f"expected one {tool} {args}, got {approvals}"
    return approvals[0]


def approve_everything(session: Session, approver: User) -> None:
    """Approve (and confirm) every open approval of the session, as an approver would."""
    while True:
        open_approvals = list(
            Approval.objects.filter(session=session, status__in=["pending", "confirming"]).order_by(
                "pk"
            )
        )
        if not open_approvals:
            break
        for approval in open_approvals:
            step = "confirm" if approval.status == "confirming" else "approve"
            do_decide(approval.pk, approver, step, "approved in a test", digest=approval.digest)
    session.refresh_from_db()


def login(user: User | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def login_url(next_path: str) -> str:
    return f"{reverse('login')}?next={next_path}"
