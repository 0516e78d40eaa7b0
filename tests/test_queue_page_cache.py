"""Issue 37 item 2: the approval queue's page is rendered once per queue change and
shared by every approver asking for the same path with the same roles and language
(approvals.page_cache). A cached page runs no statement once the viewer's sign-in is
held by the process (aero.session_store), yet a sign-out, a role taken away or a
deactivation counts on the very next request; it changes
right after a decision, a new approval or a timeout; each viewer still gets their own
name and CSRF token; a viewer without the role is still turned away.

Personas: olga operates, abel and bea approve, otto only operates."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.middleware.csrf import _unmask_cipher_token  # type: ignore[attr-defined]
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from aero import stamps
from approvals import page_cache, presenters
from approvals.actions import do_decide, sweep_expired_approvals
from approvals.models import Approval
from diagnosis.models import Session
from tests.web_helpers import (
    TAXIWAY_FUEL_LEAK,
    approval_for,
    login,
    waiting_session,
)

pytestmark = pytest.mark.services
TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def without_token(html: str) -> str:
    """The page with its viewer's CSRF token (the same in every form and header) left out."""
    token = TOKEN.search(html)
    return html.replace(token.group(1), "") if token else html


def counted(client: Client, monkeypatch: pytest.MonkeyPatch, path: str = "/approvals/") -> Any:
    """The page, its statements and how many times the queue was read to render it."""
    reads: list[int] = []
    read = presenters.queue_context

    def counting(*args: Any, **kwargs: Any) -> dict[str, Any]:
        reads.append(1)
        return read(*args, **kwargs)

    monkeypatch.setattr(presenters, "queue_context", counting)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    assert response.status_code == 200
    return response.content.decode(), len(queries), len(reads)


def test_a_cached_page_costs_the_sign_in_alone(
    stand_leak: Session, abel: User, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    bea = make_user("bea", "approver")
    first, first_queries, first_reads = counted(login(abel), monkeypatch)
    as_bea = login(bea)
    again, queries, reads = counted(as_bea, monkeypatch)

    assert first_reads == 1 and reads == 0
    # The signed-in session, its user, the user's roles: nothing of the queue.
    assert queries == 3 < first_queries
    # Then the sign-in is held by the process too: nothing at all.
    assert counted(as_bea, monkeypatch)[1:] == (0, 0)
    # The same page, each with their own name and token.
    assert without_token(first).replace(">abel<", ">x<") == without_token(again).replace(
        ">bea<", ">x<"
    )
    assert "<span>abel</span>" in first and "<span>bea</span>" in again
    assert ">abel<" not in again


def test_a_cached_page_reads_its_stamps_in_one_round_trip(
    stand_leak: Session, abel: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sign-in's stamps and the queue's are read together (aero.session_store)."""
    as_abel = login(abel)
    counted(as_abel, monkeypatch)
    counted(as_abel, monkeypatch)  # the page and the sign-in are held from here on
    round_trips: list[tuple[str, ...]] = []
    read_many = stamps.read_many

    def counting(*names: str) -> list[str]:
        round_trips.append(names)
        return read_many(*names)

    monkeypatch.setattr(stamps, "read_many", counting)
    assert counted(as_abel, monkeypatch)[1:] == (0, 0)
    assert len(round_trips) == 1 and stamps.QUEUE in round_trips[0]


def test_each_viewer_gets_their_own_token_and_name(
    stand_leak: Session, abel: User, make_user: Callable[..., User]
) -> None:
    bea = make_user("bea", "approver")
    crew = approval_for(stand_leak, "dispatch_cleanup_crew")
    as_abel, as_bea = Client(enforce_csrf_checks=True), Client(enforce_csrf_checks=True)
    as_abel.force_login(abel)
    as_bea.force_login(bea)
    abel_page = as_abel.get("/approvals/").content.decode()
    bea_page = as_bea.get("/approvals/").content.decode()

    abel_tokens, bea_tokens = set(TOKEN.findall(abel_page)), set(TOKEN.findall(bea_page))
    assert len(abel_tokens) == 1 and len(bea_tokens) == 1 and abel_tokens != bea_tokens
    assert f'"X-CSRFToken": "{bea_tokens.pop()}"' in bea_page
    assert "\x00" not in bea_page
    response = as_bea.post(
        f"/approvals/{crew.pk}/decide/",
        {
            "csrfmiddlewaretoken": TOKEN.findall(bea_page)[0],
            "decision": "approve",
            "digest": crew.digest,
            "next": "queue",
        },
    )
    assert response.status_code == 302
    assert Approval.objects.get(pk=crew.pk).status == "approved"


def test_a_decision_a_new_approval_and_a_timeout_show_on_the_next_page(
    stand_leak: Session, olga: User, abel: User, make_user: Callable[..., User]
) -> None:
    bea = make_user("bea", "approver")
    crew = approval_for(stand_leak, "dispatch_cleanup_crew")
    fire = approval_for(stand_leak, "request_fire_standby")

    def page() -> str:
        return login(bea).get("/approvals/").content.decode()

    before = page()
    # Cached from here on.
    assert f'id="approval-{crew.pk}"' in before and without_token(page()) == without_token(before)

    do_decide(crew.pk, abel, "approve", digest=crew.digest)
    assert f'id="approval-{crew.pk}"' not in page()

    runway = waiting_session(olga, TAXIWAY_FUEL_LEAK)
    assert f'id="incident-{runway.pk}"' in page()

    Approval.objects.filter(pk=fire.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    sweep_expired_approvals()
    assert Approval.objects.get(pk=fire.pk).status == "timeout"
    assert f'id="approval-{fire.pk}"' not in page()


@pytest.mark.parametrize("path", ["/approvals/", "/approvals/?risk=R2"])
def test_a_viewer_without_the_role_is_turned_away_from_a_cached_page(
    stand_leak: Session, olga: User, abel: User, path: str
) -> None:
    assert login(abel).get(path).status_code == 200  # cached for this path
    assert login(olga).get(path).status_code == 403
    signed_out = Client().get(path)
    assert signed_out.status_code == 302 and "/login" in signed_out["Location"]


def test_a_held_sign_in_counts_a_change_on_the_next_request(
    stand_leak: Session, abel: User
) -> None:
    client = login(abel)
    # The same sign-in in a second browser (or a copied cookie).
    other = Client()
    other.cookies["sessionid"] = client.cookies["sessionid"].value

    def status(c: Client = client) -> int:
        return c.get("/approvals/").status_code

    assert status() == status() == status(other) == 200  # held from here on
    approver = abel.groups.get(name="approver")
    abel.groups.remove(approver)
    assert status() == 403
    approver.user_set.add(abel)
    assert status() == 200
    User.objects.filter(pk=abel.pk).update(is_active=False)  # no signal: still held
    abel.is_active = False
    abel.save()
    assert status() == 302
    abel.is_active = True
    abel.save()
    assert status() == status(other) == 200
    client.post("/accounts/logout/")
    assert status(other) == 302


def test_a_message_is_shown_once_on_the_queue(stand_leak: Session, abel: User) -> None:
    client = login(abel)
    client.get("/approvals/")  # cached
    crew = approval_for(stand_leak, "dispatch_cleanup_crew")
    client.post(
        f"/approvals/{crew.pk}/decide/",
        {"decision": "nonsense", "digest": crew.digest, "next": "queue"},
    )
    with_message = client.get("/approvals/").content.decode()
    assert 'role="alert"' in with_message
    assert 'class="messages"' not in client.get("/approvals/").content.decode()


def test_the_pages_are_kept_apart_by_language_and_filter(stand_leak: Session, abel: User) -> None:
    client = login(abel)
    english = client.get("/approvals/").content.decode()
    only_r3 = client.get("/approvals/?risk=R3").content.decode()
    client.post("/language/", {"language": "zh-hans", "next": "/approvals/"})
    chinese = client.get("/approvals/").content.decode()

    assert 'lang="en"' in english and '<html lang="zh' in chinese
    assert only_r3 != english and 'value="R3" selected' in only_r3
    assert len(page_cache._local) >= 3


def test_the_pages_token_is_masked_afresh_and_accepted(stand_leak: Session, abel: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(abel)
    client.get("/approvals/")  # the first sets the secret's cookie
    secret = client.cookies["csrftoken"].value
    tokens = [TOKEN.findall(client.get("/approvals/").content.decode())[0] for _ in range(3)]

    assert len(set(tokens)) == 3 and all(len(t) == 64 and t.isalnum() for t in tokens)
    assert {_unmask_cipher_token(t) for t in tokens} == {secret}
    response = client.post("/approvals/notify/", {"csrfmiddlewaretoken": tokens[-1], "on": "1"})
    assert response.status_code == 302
