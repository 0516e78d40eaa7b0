"""Issue 37 item 2: the approval queue's folded parts (each card's impact map, each
action's argument editor) load when they are opened, so the page stays small. Opened,
they show what the page used to hold; each part has the queue's access checks, is
cached under the queue's stamp as the page is (a change shows at once) and carries the
viewer's own CSRF token; without JS the folded panel links to the incident's page.

Personas: olga operates, abel and bea approve."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.template.loader import render_to_string
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals import presenters
from approvals.actions import do_decide, do_edit_args
from approvals.models import Approval
from diagnosis.models import Session
from tests.web_helpers import approval_for, login

pytestmark = pytest.mark.services
TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def edit_form_url(approval: Approval, query: str = "?risk=&scenario=&incident=") -> str:
    return f"/approvals/{approval.pk}/edit-form/{query}"


def map_url(session: Session) -> str:
    return f"/approvals/incidents/{session.pk}/map/"


def test_the_page_folds_its_parts_and_links_them(stand_leak: Session, abel: User) -> None:
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")
    page = login(abel).get("/approvals/").content.decode()

    # Neither the map nor the editor's form is on the page: their panels load them.
    assert "<svg" not in page and "edit-args-form" not in page
    assert f'hx-get="{map_url(stand_leak)}" hx-trigger="toggle once"' in page
    assert f'hx-get="{edit_form_url(closure).replace("&", "&amp;")}"' in page
    # Without JS, the folded panels link to the incident's page, which has both.
    assert page.count(f'href="/sessions/{stand_leak.pk}/') >= 3
    session_page = login(abel).get(f"/sessions/{stand_leak.pk}/").content.decode()
    editor = f'name="arg-taxiway" id="edit-session-actions-{closure.pk}-taxiway"'
    assert "<svg" in session_page and editor in session_page


def test_the_map_part_is_the_map_the_page_held(stand_leak: Session, abel: User) -> None:
    part = login(abel).get(map_url(stand_leak))

    assert part.status_code == 200
    context = presenters.incident_map(stand_leak)
    assert context is not None
    assert part.content.decode() == render_to_string(context["map"]["template"], context)
    assert "<svg" in part.content.decode() and 'class="node' in part.content.decode()


def test_the_editor_part_edits_with_the_viewers_token(
    stand_leak: Session, abel: User, make_user: Callable[..., User]
) -> None:
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")
    as_abel = Client(enforce_csrf_checks=True)
    as_abel.force_login(abel)
    as_abel.get("/approvals/")
    part = as_abel.get(edit_form_url(closure, "?risk=R2")).content.decode()
    bea_part = login(make_user("bea", "approver")).get(edit_form_url(closure, "?risk=R2"))

    assert 'class="edit-args-form"' in part and 'name="arg-taxiway"' in part
    assert f'id="edit-approval-queue-{closure.pk}-taxiway"' in part and 'value="A"' in part
    assert '<input type="hidden" name="risk" value="R2">' in part
    assert "\x00" not in part
    (token,) = set(TOKEN.findall(part))
    assert token not in bea_part.content.decode()  # cached, each with their own token
    response = as_abel.post(
        f"/approvals/{closure.pk}/edit/",
        {
            "csrfmiddlewaretoken": token,
            "digest": closure.digest,
            "next": "queue",
            "arg-taxiway": "C",
            "edit_reason": "A is the stand's only way out",
        },
    )
    assert response.status_code == 302
    closure.refresh_from_db()
    assert closure.tool_call.request_payload["taxiway"] == "C"


def test_a_part_changes_at_once_after_an_edit_or_a_decision(
    stand_leak: Session, abel: User, make_user: Callable[..., User]
) -> None:
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")
    client = login(abel)
    assert 'value="A"' in client.get(edit_form_url(closure)).content.decode()
    with CaptureQueriesContext(connection) as queries:
        cached = client.get(edit_form_url(closure))
    assert cached.status_code == 200 and not any(
        "approvals_approval" in q["sql"] for q in queries.captured_queries
    )

    do_edit_args(
        closure.pk, abel, {"taxiway": "C"}, "A is the stand's only way out", digest=closure.digest
    )
    assert 'value="C"' in client.get(edit_form_url(closure)).content.decode()

    closure.refresh_from_db()
    do_decide(closure.pk, abel, "approve", digest=closure.digest)
    do_decide(closure.pk, make_user("bea", "approver"), "confirm", digest=closure.digest)
    assert client.get(edit_form_url(closure)).status_code == 404


@pytest.mark.parametrize("part", ["map", "editor"])
def test_a_viewer_without_the_role_is_turned_away_from_a_part(
    stand_leak: Session, olga: User, abel: User, part: str
) -> None:
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")
    path = map_url(stand_leak) if part == "map" else edit_form_url(closure)
    assert login(abel).get(path).status_code == 200  # cached for this path
    assert login(olga).get(path).status_code == 403
    signed_out = Client().get(path)
    assert signed_out.status_code == 302 and "/login" in signed_out["Location"]


def test_no_part_of_a_deleted_session_or_an_unknown_action(stand_leak: Session, abel: User) -> None:
    client = login(abel)
    assert client.get("/approvals/999999/edit-form/").status_code == 404
    Session.objects.filter(pk=stand_leak.pk).update(deleted_at=stand_leak.updated_at)
    assert client.get(map_url(stand_leak)).status_code == 404
