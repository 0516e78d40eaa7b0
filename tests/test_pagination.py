"""Keyset pagination: walking every page of the approval queue, the session list and the
timeline shows each item exactly once, in order, however the data grows."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from approvals import presenters as queue_presenters
from approvals.models import Approval
from diagnosis import presenters
from diagnosis.actions import do_create_session
from diagnosis.models import Session
from scenarios_admin.models import Scenario
from tests.web_helpers import STAND_FUEL_LEAK, TAXIWAY_FUEL_LEAK, make_session

pytestmark = pytest.mark.services
NEXT = re.compile(r'<a rel="next" href="([^"]+)"')


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def walk(client: Client, url: str, item: re.Pattern[str]) -> list[list[str]]:
    pages = []
    while url:
        response = client.get(url)
        assert response.status_code == 200
        html = response.content.decode()
        pages.append(item.findall(html))
        found = NEXT.search(html)
        url = found.group(1).replace("&amp;", "&") if found else ""
        if url.startswith("?"):
            url = response.request["PATH_INFO"] + url
        assert len(pages) < 20
    return pages


def test_the_queue_pages_by_incident_and_never_splits_one(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    sessions = [
        make_session(olga, STAND_FUEL_LEAK),
        make_session(olga, TAXIWAY_FUEL_LEAK),
        make_session(olga, STAND_FUEL_LEAK),
    ]
    monkeypatch.setattr(queue_presenters, "QUEUE_PAGE", 2)  # incidents a page
    open_approvals = list(Approval.objects.open())
    assert len(open_approvals) > 5
    incident_of = {a.pk: a.session_id for a in open_approvals}
    nearest = {
        s.pk: min(a.deadline for a in open_approvals if a.session_id == s.pk and a.deadline)
        for s in sessions
    }
    expected = sorted(nearest, key=lambda pk: (nearest[pk], pk))

    pages = walk(signed_in(abel), "/approvals/", re.compile(r'id="approval-(\d+)"'))

    # Every open approval once; each incident whole on one page, nearest deadline first.
    shown = [int(pk) for page in pages for pk in page]
    assert sorted(shown) == sorted(incident_of)
    incidents = [list(dict.fromkeys(incident_of[int(pk)] for pk in page)) for page in pages]
    assert [len(page) for page in incidents] == [2, 1]
    assert [pk for page in incidents for pk in page] == expected
    first = signed_in(abel).get("/approvals/").content.decode()
    assert f'data-open="{len(open_approvals)}"' in first
    # A cursor that is no incident cursor shows the first page, not an error.
    assert signed_in(abel).get("/approvals/?after=nope").content.decode().count(
        'class="queue-item"'
    ) == len(pages[0])


def test_incidents_without_a_deadline_page_after_the_timed_ones(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lift request never times out (no deadline). Incidents with only such requests
    come after every timed one, and a page that ends on one still links to the next page
    (it was a server error)."""
    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    timed, *untimed = [
        make_session(olga, STAND_FUEL_LEAK),
        make_session(olga, TAXIWAY_FUEL_LEAK),
        make_session(olga, STAND_FUEL_LEAK),
    ]
    Approval.objects.filter(session__in=untimed).update(deadline=None)
    monkeypatch.setattr(queue_presenters, "QUEUE_PAGE", 2)  # incidents a page
    incident_of = {a.pk: a.session_id for a in Approval.objects.open()}

    pages = walk(signed_in(abel), "/approvals/", re.compile(r'id="approval-(\d+)"'))

    shown = [int(pk) for page in pages for pk in page]
    assert sorted(shown) == sorted(incident_of)
    incidents = [list(dict.fromkeys(incident_of[int(pk)] for pk in page)) for page in pages]
    assert incidents == [[timed.pk, min(s.pk for s in untimed)], [max(s.pk for s in untimed)]]


def test_the_session_list_pages_newest_first(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    olga = make_user("olga", "operator")
    monkeypatch.setattr("diagnosis.actions.enqueue_advance", lambda session_id: None)
    oil = Scenario.objects.get(slug="oil_spill")
    for n in range(5):
        do_create_session(olga, oil, f"fuel leak number {n}")
    monkeypatch.setattr(presenters, "SESSION_PAGE", 2)
    expected = [
        str(pk)
        for pk in Session.objects.order_by("-created_at", "-pk").values_list("pk", flat=True)
    ]
    pages = walk(signed_in(olga), "/sessions/", re.compile(r'href="/sessions/([0-9a-f-]{36})/"'))
    assert [len(page) for page in pages] == [2, 2, 1]
    assert [pk for page in pages for pk in page] == expected
    filtered = signed_in(olga).get("/sessions/?status=queued&before=not-a-uuid")
    assert filtered.status_code == 200


def test_the_session_page_shows_its_newest_events_and_pages_back_to_the_first(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page holds the newest SESSION_PAGE_EVENTS rows; "Earlier events" is a link to
    the paged timeline (no JS) and, through htmx, the rows before the oldest shown for the
    top of the list with the link moved before them: following it back reaches seq 1,
    every event once."""
    olga = make_user("olga", "operator")
    session = make_session(olga, STAND_FUEL_LEAK)
    monkeypatch.setattr(presenters, "SESSION_PAGE_EVENTS", 4)
    monkeypatch.setattr(presenters, "TIMELINE_PAGE", 5)
    assert session.last_seq > 10
    client = signed_in(olga)
    page = client.get(f"/sessions/{session.pk}/").content.decode()
    seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', page)]
    assert seqs == list(range(session.last_seq - 3, session.last_seq + 1))
    link = f"/sessions/{session.pk}/events/?before={seqs[0]}"
    assert f'href="{link}"' in page and f'hx-get="{link}"' in page

    # Without JS: the link opens the paged timeline, the TIMELINE_PAGE events before it.
    earlier = client.get(link).content.decode()
    assert [int(s) for s in re.findall(r'data-seq="(\d+)"', earlier)] == list(
        range(seqs[0] - 5, seqs[0])
    )

    # With htmx: rows only, then the link to the page before them (out of band).
    shown = list(seqs)
    while True:
        rows = client.get(link, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="timeline-list")
        html = rows.content.decode()
        assert "<html" not in html and 'id="timeline-earlier" hx-swap-oob="true"' in html
        older = [int(s) for s in re.findall(r'data-seq="(\d+)"', html)]
        assert older and older[-1] == shown[0] - 1
        shown = older + shown
        found = re.search(r'hx-get="([^"]+)"', html)
        if found is None:
            break
        link = found.group(1).replace("&amp;", "&")
    assert shown == list(range(1, session.last_seq + 1))


def test_an_incident_shows_a_page_of_its_approvals_and_links_to_the_rest(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page's size is bounded whatever an incident proposes: the first approvals of
    each incident (riskiest first), "n more" with a link to that incident's own page,
    which lists them all and keeps the incident through a decision."""
    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    busy = make_session(olga, TAXIWAY_FUEL_LEAK)
    other = make_session(olga, STAND_FUEL_LEAK)
    monkeypatch.setattr(queue_presenters, "INCIDENT_ITEMS", 2)
    mine = list(Approval.objects.open().filter(session=busy))
    now = timezone.now()
    assert len(mine) > 3
    client = signed_in(abel)
    card = re.compile(r'id="approval-(\d+)"')

    html = client.get("/approvals/").content.decode()
    block = html[html.index(f'id="incident-{busy.pk}"') :]
    block = block[: block.index("</p>", block.index('data-testid="incident-more"'))]
    shown = [int(pk) for pk in card.findall(block)]
    assert len(shown) == 2
    riskiest = sorted(
        mine, key=lambda a: (a.risk_class, -(a.deadline or now).timestamp()), reverse=True
    )
    assert shown == [a.pk for a in riskiest[:2]]
    assert f"{len(mine)} actions wait" in block
    link = f"/approvals/?risk=&amp;scenario=&amp;incident={busy.pk}"
    assert f'href="{link}" data-testid="incident-more">{len(mine) - 2} more actions wait' in block
    in_chinese = signed_in(abel)
    in_chinese.cookies[settings.LANGUAGE_COOKIE_NAME] = "zh-hans"
    zh = in_chinese.get("/approvals/").content.decode()
    assert f"还有 {len(mine) - 2} 项措施待审批：查看该事件的全部措施" in zh
    # The open count is every open approval, not the ones shown.
    assert f'data-open="{Approval.objects.open().count()}"' in html

    own = client.get(link.replace("&amp;", "&")).content.decode()
    assert re.findall(r'id="incident-([0-9a-f-]+)"', own) == [str(busy.pk)]
    assert sorted(int(pk) for pk in card.findall(own)) == sorted(a.pk for a in mine)
    assert 'data-testid="incident-more"' not in own
    assert f'data-open="{len(mine)}"' in own and 'data-testid="all-incidents"' in own
    assert (
        f'ws-connect="/ws/approvals/?risk=&amp;scenario=&amp;after=&amp;incident={busy.pk}' in own
    )
    # A decision on that page answers with that page (the form carries the incident).
    first = riskiest[0]
    assert f'name="incident" value="{busy.pk}"' in own
    after = client.post(
        f"/approvals/{first.pk}/decide/?next=queue",
        {
            "decision": "reject",
            "reason": "not now",
            "digest": first.digest,
            "next": "queue",
            "incident": str(busy.pk),
        },
        headers={"HX-Request": "true"},
    ).content.decode()
    assert sorted(int(pk) for pk in card.findall(after)) == sorted(
        a.pk for a in mine if a.pk != first.pk
    )
    assert str(other.pk) not in after
    # Not an incident id: every incident, never an error page.
    bogus = client.get("/approvals/?incident=nope")
    assert bogus.status_code == 200
    assert str(other.pk) in bogus.content.decode()


def test_an_incident_page_is_for_approvers_only(
    builtin: None, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    busy = make_session(olga, TAXIWAY_FUEL_LEAK)
    for roles in (("operator",), ("auditor",), ()):
        client = signed_in(make_user(f"eve{len(roles)}{''.join(roles)}", *roles))
        assert client.get(f"/approvals/?incident={busy.pk}").status_code == 403
    assert Client().get(f"/approvals/?incident={busy.pk}").status_code == 302
