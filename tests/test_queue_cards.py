"""Issue 37 item 2: the approval queue's incident cards are rendered once per change and
shared by every approver and process (approvals/cards.py). A page whose cards are cached
renders none and reads no session or action whole; whatever changes shows on the next
page (a decision, an approve-once, an argument edit, a closure coming into force); the
deadline's text and the viewer's CSRF token are the request's own, so the page works
without JS.

Personas: olga operates, abel and bea approve."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from aero import stamps
from approvals import cards
from approvals.actions import do_decide, do_edit_args
from approvals.models import Approval
from diagnosis.eventlog.names import FINDING_RECORDED
from diagnosis.events import append_event
from diagnosis.models import Session, ToolCall
from packs.airport.models import Restriction
from tests.web_helpers import (
    TAXIWAY_FUEL_LEAK,
    approval_for,
    login,
    waiting_session,
)

pytestmark = pytest.mark.services
TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def card(html: str, approval: Approval) -> str:
    start = html.index(f'id="approval-{approval.pk}"')
    return html[start : html.index("</article>", start)]


def cards_of(html: str) -> str:
    """The page's cards, the viewer's token left out."""
    start = html.index('<div class="card incident"')
    return TOKEN.sub("", html[start : html.index("</section>", start)])


def counted(client: Client, monkeypatch: pytest.MonkeyPatch) -> tuple[str, int, int]:
    """The queue page, its statements and how many cards it rendered."""
    rendered: list[Any] = []
    render = cards.render_card

    def counting(group: dict[str, Any], context: dict[str, Any]) -> str:
        rendered.append(group["session_id"])
        return render(group, context)

    monkeypatch.setattr(cards, "render_card", counting)
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/approvals/")
    assert response.status_code == 200
    return response.content.decode(), len(queries), len(rendered)


def test_a_card_is_rendered_once_and_every_later_page_reads_it_from_the_cache(
    stand_leak: Session, olga: User, abel: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    runway_leak = waiting_session(olga, TAXIWAY_FUEL_LEAK)
    first, first_queries, first_rendered = counted(login(abel), monkeypatch)
    # The page itself is kept until the queue's stamp moves (approvals.page_cache): a
    # change elsewhere renders the page again, from the cards kept.
    stamps.touch_now(stamps.QUEUE)
    again, queries, rendered = counted(login(abel), monkeypatch)

    assert first_rendered == 2 and rendered == 0
    # Cached: the session, the viewer's groups, the incidents with the open count, the
    # cards' facts (their actions with their sessions), the board (topology,
    # restrictions), the scenarios of the filter. Rendering the two cards read their
    # actions with their sessions whole.
    assert queries == 8
    assert first_queries > queries
    assert cards_of(again) == cards_of(first)
    assert f'id="incident-{runway_leak.pk}"' in again and f'id="incident-{stand_leak.pk}"' in again


def test_a_decision_an_approve_once_and_an_edit_show_on_the_next_page(
    stand_leak: Session, abel: User, make_user: Callable[..., User]
) -> None:
    bea = make_user("bea", "approver")
    crew = approval_for(stand_leak, "dispatch_cleanup_crew")
    stand = approval_for(stand_leak, "suspend_stand_operations")
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")

    def page() -> str:
        return login(bea).get("/approvals/").content.decode()

    assert f'id="approval-{crew.pk}"' in page()  # the cards are cached from here on

    do_decide(stand.pk, abel, "approve", "needed", digest=stand.digest)  # still open
    html = page()
    assert "approved once by abel, awaiting confirmation" in card(html, stand)
    assert 'value="confirm"' in card(html, stand)

    do_edit_args(closure.pk, abel, {"taxiway": "C"}, "A is the only way out", digest=closure.digest)
    html = page()
    assert "Arguments changed by abel" in card(html, closure)
    assert "Close taxiway C" in card(html, closure)
    assert f'value="{Approval.objects.get(pk=closure.pk).digest}"' in card(html, closure)

    do_decide(crew.pk, abel, "approve", digest=crew.digest)
    assert f'id="approval-{crew.pk}"' not in page()


def test_a_closure_coming_into_force_shows_on_the_next_page(
    stand_leak: Session, olga: User, abel: User
) -> None:
    closure = approval_for(stand_leak, "close_taxiway", taxiway="A")
    before = login(abel).get("/approvals/").content.decode()
    assert 'data-testid="in-force"' not in card(before, closure)

    other = waiting_session(olga, TAXIWAY_FUEL_LEAK)
    Restriction.objects.create(
        kind="taxiway",
        target="A",
        session=other,
        tool_call=ToolCall.objects.create(
            session=other, call_id="by-hand", idempotency_key="k", tool_name="close_taxiway"
        ),
    )
    after = login(abel).get("/approvals/").content.decode()

    assert 'data-testid="in-force"' in card(after, closure)


def test_a_cached_card_tells_the_time_left_as_of_the_request(
    stand_leak: Session, abel: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    crew = approval_for(stand_leak, "dispatch_cleanup_crew")
    deadline = timezone.now() + timedelta(minutes=8, seconds=30)
    Approval.objects.filter(pk=crew.pk).update(deadline=deadline)
    assert "times out in 9 min" in card(login(abel).get("/approvals/").content.decode(), crew)

    # Seven minutes later, the same card from the cache.
    monkeypatch.setattr(cards.timezone, "now", lambda: deadline - timedelta(seconds=50))
    html, _, rendered = counted(login(abel), monkeypatch)

    assert rendered == 0
    assert "times out in 50 s" in card(html, crew)
    assert 'class="deadline deadline-urgent"' in card(html, crew)


def test_each_approver_decides_a_shared_card_with_their_own_token(
    stand_leak: Session, abel: User, make_user: Callable[..., User]
) -> None:
    """Without JS: the card's form posts the viewer's CSRF token."""
    bea = make_user("bea", "approver")
    crew = approval_for(stand_leak, "dispatch_cleanup_crew")
    as_abel, as_bea = Client(enforce_csrf_checks=True), Client(enforce_csrf_checks=True)
    as_abel.force_login(abel)
    as_bea.force_login(bea)
    abel_page = as_abel.get("/approvals/").content.decode()
    bea_page = as_bea.get("/approvals/").content.decode()
    abel_token = TOKEN.findall(card(abel_page, crew))
    bea_token = TOKEN.findall(card(bea_page, crew))
    assert abel_token and bea_token
    assert as_bea.cookies["csrftoken"].value != as_abel.cookies["csrftoken"].value

    response = as_bea.post(
        f"/approvals/{crew.pk}/decide/",
        {
            "csrfmiddlewaretoken": bea_token[0],
            "decision": "approve",
            "digest": crew.digest,
            "next": "queue",
        },
    )

    assert response.status_code == 302
    assert Approval.objects.get(pk=crew.pk).status == "approved"


def test_the_incident_facts_an_event_changes_show_on_the_next_page(
    stand_leak: Session, abel: User
) -> None:
    """A card's key reads the session's last event, not its facts (risk, impact): the
    facts change only with an event, so a new risk assessment still makes a new card."""
    crew = approval_for(stand_leak, "dispatch_cleanup_crew")
    before = login(abel).get("/approvals/").content.decode()
    risk = dict(Session.objects.get(pk=stand_leak.pk).snapshot["risk"])
    assert f"score {risk['score']}" in before

    append_event(
        stand_leak.pk,
        FINDING_RECORDED,
        {"kind": "risk", **risk, "score": 97, "rule": "OS-TEST"},
        producer="test",
    )
    after = login(abel).get("/approvals/").content.decode()

    assert "score 97" in after and "rule OS-TEST" in after
    assert f'id="approval-{crew.pk}"' in after
