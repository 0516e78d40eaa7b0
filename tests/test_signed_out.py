"""An operator whose sign-in ran out loses nothing they typed (aero.drafts): the post is
not run, the sign-in page says why, and the page the form is on shows the text again
after the sign-in. An htmx post gets a 401, an htmx GET takes the whole page to sign in:
never the sign-in page in its target."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from diagnosis.models import Event, Session
from scenarios_admin.models import Scenario
from tests.web_helpers import NO_POSITION, login, make_session

TYPED = "MU5678 在203机位燃油泄漏，发动机已关闭"
PASSWORD = "pw-for-tests"


def sign_in(client: Client, user: User) -> None:
    """Through the sign-in form, as a person does (not force_login: a fresh session)."""
    response = client.post(reverse("login"), {"username": user.username, "password": PASSWORD})
    assert response.status_code == 302


def test_a_new_incident_posted_after_the_sign_in_ran_out_is_kept_for_after_it(
    builtin: None, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    oil = Scenario.objects.get(slug="oil_spill")
    client = Client()  # the sign-in ran out: no session cookie any more
    posted = client.post(
        reverse("diagnosis:session-create"),
        {"message": TYPED, "scenario": str(oil.pk)},
        HTTP_REFERER="http://testserver/sessions/?status=running",
    )
    assert posted.status_code == 302
    assert posted["Location"] == f"{reverse('login')}?next=/sessions/%3Fstatus%3Drunning"
    assert Session.objects.count() == 0  # nothing was run for nobody

    page = client.get(posted["Location"])
    assert "You were signed out before this was sent: nothing was saved." in page.content.decode()

    sign_in(client, olga)
    form_page = client.get("/sessions/?status=running").content.decode()
    assert TYPED in form_page  # in the form, unsent, to check and send
    assert f'<option value="{oil.pk}" selected>' in form_page
    assert Session.objects.count() == 0
    # Shown once: a later visit starts from an empty form.
    assert TYPED not in client.get("/sessions/").content.decode()


def test_the_address_a_sign_in_may_return_to_is_not_a_blank_405(
    db: None, make_user: Callable[..., User]
) -> None:
    client = login(make_user("olga", "operator"))
    response = client.get(reverse("diagnosis:session-create"))
    assert response.status_code == 302 and response["Location"] == reverse("diagnosis:session-list")


def test_an_answer_sent_by_htmx_after_the_sign_in_ran_out_gets_a_401(
    builtin: None, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    session = make_session(olga, NO_POSITION)
    events = Event.objects.filter(session=session).count()
    client = Client()
    answer = reverse("diagnosis:session-answer", args=[session.pk])
    response = client.post(answer, {"message": "105机位"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 401
    assert response["HX-Reswap"] == "none"  # the form stays as typed
    assert b"<form" not in response.content  # not the sign-in page
    assert Event.objects.filter(session=session).count() == events

    # Signed in again in that browser, the page has the answer in its box.
    sign_in(client, olga)
    page = client.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert 'value="105机位"' in page


def test_a_refused_update_comes_back_in_its_box(
    builtin: None, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    session = make_session(olga)
    client = login(olga)
    too_long = "消防车已到场。" * 700  # over the 4,000 characters an update takes
    response = client.post(
        reverse("diagnosis:session-update", args=[session.pk]), {"text": too_long}, follow=True
    )
    page = response.content.decode()
    assert "Nothing was saved" in page
    assert f'value="{too_long}"' in page
    assert not Event.objects.filter(
        session=session, type="timeline.appended", payload__kind="operator_update"
    ).exists()


def sign_in_then(url: str) -> str:
    """Where a sign-in page's address returns to (its `next`)."""
    parts = urlsplit(url)
    assert parts.path == reverse("login")
    return parse_qs(parts.query)["next"][0]


def test_a_panel_loaded_by_htmx_after_the_sign_in_ran_out_takes_the_page_to_sign_in(
    builtin: None, make_user: Callable[..., User]
) -> None:
    """Replay's "verify the chain" panel (or a filter, a poll): never the sign-in page
    inside the panel; the whole page goes to sign in and comes back to where it was."""
    olga = make_user("olga", "operator")
    session = make_session(olga, NO_POSITION)
    page = reverse("replay:replay-step", args=[session.pk]) + "?seq=3"
    response = Client().get(
        reverse("replay:replay-chain", args=[session.pk]),
        HTTP_HX_REQUEST="true",
        HTTP_HX_CURRENT_URL=f"http://testserver{page}",
    )
    assert response.status_code == 200 and not response.content  # nothing to swap in
    assert sign_in_then(response["HX-Redirect"]) == page

    # A page address from another site is not followed: back to the panel's own address.
    response = Client().get(
        reverse("replay:replay-chain", args=[session.pk]),
        HTTP_HX_REQUEST="true",
        HTTP_HX_CURRENT_URL="https://evil.example/phish",
    )
    chain = reverse("replay:replay-chain", args=[session.pk])
    assert sign_in_then(response["HX-Redirect"]) == chain


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_signed_out_visitor_is_sent_to_sign_in(
    db: None, method: str, make_user: Callable[..., User]
) -> None:
    """Denied access: nothing of a session page without a sign-in."""
    make_user("olga", "operator")
    response: Any = getattr(Client(), method.lower())(reverse("diagnosis:session-create"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_expired_sessions_are_deleted_once_an_hour(db: None, monkeypatch: Any) -> None:
    """Ended sign-ins and signed-out drafts do not pile up in the session table."""
    from datetime import timedelta

    from django.contrib.sessions.models import Session as SignIn
    from django.utils import timezone

    from aero import sessions

    now = timezone.now()
    SignIn.objects.create(session_key="gone", session_data="", expire_date=now - timedelta(1))
    SignIn.objects.create(session_key="live", session_data="", expire_date=now + timedelta(1))
    monkeypatch.setattr(sessions, "_last_clear", None)
    assert sessions.clear_expired_sessions() is True
    assert set(SignIn.objects.values_list("session_key", flat=True)) == {"live"}
    SignIn.objects.create(session_key="later", session_data="", expire_date=now - timedelta(1))
    assert sessions.clear_expired_sessions() is False  # not again within the hour
    assert SignIn.objects.filter(session_key="later").exists()
