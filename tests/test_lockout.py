"""Sign-in lockouts by username and address together (issue 29, item 4): nobody locks an
approver out from elsewhere, a locked-out approver still decides with an API token, and
lockouts and their lifting are in the audit log."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from aero.models import AuditLog
from tests.api_helpers import call, token_for
from tests.web_helpers import STAND_FUEL_LEAK, approval_for, waiting_session

PASSWORD = "pw-for-tests"
ATTACKER = "10.6.6.6"


def sign_in(username: str, password: str, address: str) -> tuple[int, str]:
    response = Client(REMOTE_ADDR=address).post(
        "/accounts/login/", {"username": username, "password": password}
    )
    return response.status_code, response.content.decode()


def fail_to_the_limit(username: str, address: str) -> None:
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert sign_in(username, "wrong", address)[0] == 200
    assert sign_in(username, "wrong", address)[0] == 429


def test_failures_from_another_address_never_lock_the_user_out(
    make_user: Callable[..., User],
) -> None:
    make_user("abel", "approver", password=PASSWORD)

    fail_to_the_limit("abel", ATTACKER)
    status, page = sign_in("abel", PASSWORD, ATTACKER)  # even the right password, there
    assert status == 429
    assert "Too many failed sign-ins for <strong>abel</strong> from this address" in page
    # Failures spread over many addresses lock none of them.
    for n in range(settings.AXES_FAILURE_LIMIT + 1):
        assert sign_in("abel", "wrong", f"10.7.0.{n + 1}")[0] == 200

    assert sign_in("abel", PASSWORD, "10.0.1.1")[0] == 302  # the real approver, elsewhere


def test_a_locked_out_approver_still_decides_with_an_api_token(
    builtin: None, make_user: Callable[..., User]
) -> None:
    alice = make_user("alice", "operator", password=PASSWORD)
    bob = make_user("bob", "approver", password=PASSWORD)
    session = waiting_session(alice, STAND_FUEL_LEAK)
    r1 = approval_for(session, "dispatch_cleanup_crew")
    # Behind one NAT with the attacker: the pair is locked.
    fail_to_the_limit("bob", "127.0.0.1")
    assert sign_in("bob", PASSWORD, "127.0.0.1")[0] == 429

    decided = call(
        "POST", f"/api/v1/approvals/{r1.pk}/approve", token_for(bob), {"digest": r1.digest}
    )

    assert decided.status_code == 200, decided.content
    assert decided.json()["approver"] == "bob"


def test_a_lockout_and_its_lifting_are_audited_once(make_user: Callable[..., User]) -> None:
    make_user("olga", "operator", password=PASSWORD)
    fail_to_the_limit("olga", ATTACKER)
    for _ in range(3):  # refused tries while locked add nothing to the log
        assert sign_in("olga", "wrong", ATTACKER)[0] == 429

    locked = AuditLog.objects.filter(action="auth.locked_out")
    assert [(e.object_id, e.detail["address"]) for e in locked] == [("olga", ATTACKER)]
    assert not AuditLog.objects.filter(action="auth.lockout_lifted").exists()

    call_command("axes_reset_username", "olga")

    lifted = AuditLog.objects.filter(action="auth.lockout_lifted")
    assert [(e.object_id, e.detail["address"]) for e in lifted] == [("olga", ATTACKER)]
    assert sign_in("olga", PASSWORD, ATTACKER)[0] == 302


@pytest.mark.parametrize("failures", [1, settings.AXES_FAILURE_LIMIT - 1])
def test_a_success_below_the_limit_is_no_lifting(
    make_user: Callable[..., User], failures: int
) -> None:
    make_user("olga", "operator", password=PASSWORD)
    for _ in range(failures):
        assert sign_in("olga", "wrong", ATTACKER)[0] == 200
    assert sign_in("olga", PASSWORD, ATTACKER)[0] == 302
    assert not AuditLog.objects.filter(
        action__in=["auth.locked_out", "auth.lockout_lifted"]
    ).exists()
