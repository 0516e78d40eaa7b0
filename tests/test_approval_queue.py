"""The approval queue page and its live socket; decisions from the queue."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection

from approvals.models import Approval
from tests.test_live_timeline import cookie_for
from tests.web_helpers import STAND_FUEL_LEAK, TAXIWAY_FUEL_LEAK, waiting_session
from tests.web_helpers import approval_for as approval

pytestmark = pytest.mark.services


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def tools_in(html: str) -> list[str]:
    return re.findall(r'data-tool="([a-z_]+)" data-risk="R\d"', html)


def test_queue_lists_every_open_approval_by_incident_nearest_deadline_first(
    builtin: None, make_user: Callable[..., User]
) -> None:
    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    stand_session = waiting_session(olga, STAND_FUEL_LEAK)
    runway_session = waiting_session(olga, TAXIWAY_FUEL_LEAK)
    page = signed_in(abel).get("/approvals/")
    assert page.status_code == 200
    html = page.content.decode()
    risks = re.findall(r'data-risk="(R\d)"', html)
    # Grouped by incident: the runway incident (an R3, the nearest deadline) leads; each
    # incident's title appears once, its actions highest risk first.
    incidents = re.findall(r'id="incident-([0-9a-f-]+)"', html)
    assert incidents == [str(runway_session.pk), str(stand_session.pk)]
    assert html.count(f">{stand_session.title}</a></h2>") == 1
    for block in html.split('data-testid="incident"')[1:]:
        in_block = re.findall(r'data-risk="(R\d)"', block)
        assert in_block == sorted(in_block, reverse=True)
    assert risks[0] == "R3"
    assert len(risks) == Approval.objects.open().count()
    runway = approval(runway_session, "close_runway", runway="06/24")
    item = html[html.index(f'id="approval-{runway.pk}"') :]
    assert "runway=<strong>06/24</strong>" in item
    assert "times out in" in item
    # The incident's head names its risk rule; its impact map loads when its folded panel
    # opens.
    runway_block = html.split('data-testid="incident"')[1]
    assert "rule OS-01" in runway_block and f'id="approval-{runway.pk}"' in runway_block
    map_part = f"/approvals/incidents/{runway_session.pk}/map/"
    assert f'hx-get="{map_part}"' in runway_block
    assert "<svg" in signed_in(abel).get(map_part).content.decode()
    assert "requested by the agent for olga" in item

    only_r3 = signed_in(abel).get("/approvals/?risk=R3").content.decode()
    assert tools_in(only_r3) == ["close_runway"]
    bogus = signed_in(abel).get("/approvals/?risk=R9&scenario=nope")
    assert bogus.status_code == 200 and len(tools_in(bogus.content.decode())) == len(risks)
    htmx = signed_in(abel).get("/approvals/?risk=R1", headers={"HX-Request": "true"})
    assert htmx.content.decode().lstrip().startswith('<section id="approval-queue"')


@pytest.mark.parametrize("roles", [("operator",), ("auditor",), ()])
def test_queue_refuses_non_approvers(
    builtin: None, make_user: Callable[..., User], roles: tuple[str, ...]
) -> None:
    session = waiting_session(make_user("olga", "operator"))
    crew = approval(session, "dispatch_cleanup_crew")
    client = signed_in(make_user("eve", *roles))
    assert client.get("/approvals/").status_code == 403
    response = client.post(
        f"/approvals/{crew.pk}/decide/", {"decision": "approve", "digest": crew.digest}
    )
    assert response.status_code == 403
    assert Approval.objects.get(pk=crew.pk).status == "pending"
    assert Client().get("/approvals/").status_code == 302


def test_deciding_from_the_queue(builtin: None, make_user: Callable[..., User]) -> None:
    session = waiting_session(make_user("olga", "operator"))
    abel = signed_in(make_user("abel", "approver"))
    crew = approval(session, "dispatch_cleanup_crew")
    response = abel.post(
        f"/approvals/{crew.pk}/decide/?next=queue",
        {"decision": "approve", "digest": crew.digest, "next": "queue"},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert f'id="approval-{crew.pk}"' not in html  # decided ones leave
    assert Approval.objects.get(pk=crew.pk).status == "approved"

    stand = approval(session, "suspend_stand_operations")
    rejected = abel.post(
        f"/approvals/{stand.pk}/decide/",
        {"decision": "reject", "digest": stand.digest, "next": "queue"},
        follow=True,
    )
    assert "A rejection needs a reason." in rejected.content.decode()
    assert rejected.redirect_chain[-1][0].endswith("/approvals/")


def read_queue(ws: ClientConnection, until: Callable[[str], bool]) -> str:
    while True:
        html = ws.recv(timeout=15)
        assert isinstance(html, str)
        if until(html):
            return html


def test_queue_updates_live(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    from websockets.sync.client import connect

    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    url = asgi_server.replace("http://", "ws://") + "/ws/approvals/?risk=R2"
    # max_queue=None: frames the test leaves unread never stop the client reading, so
    # its close sees the server's close frame (past 16 unread frames websockets stops
    # reading and every close waited out its 10 s timeout).
    with connect(
        url,
        open_timeout=10,
        max_queue=None,
        additional_headers={"Cookie": cookie_for(abel), "Origin": asgi_server},
    ) as ws:
        first = read_queue(ws, lambda html: "approval-queue" in html)
        assert 'data-count="0"' in first

        session = waiting_session(olga)  # runs here; the notice reaches daphne via Redis
        html = read_queue(ws, lambda h: 'data-count="3"' in h)
        assert sorted(tools_in(html)) == [
            "close_taxiway",
            "close_taxiway",
            "suspend_stand_operations",
        ]

        stand = approval(session, "suspend_stand_operations")
        signed_in(abel).post(
            f"/approvals/{stand.pk}/decide/",
            {"decision": "reject", "reason": "no", "digest": stand.digest},
        )
        html = read_queue(ws, lambda h: 'data-count="2"' in h)
        assert "suspend_stand_operations" not in html


def test_queue_socket_refuses_non_approvers(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    from websockets.sync.client import connect

    url = asgi_server.replace("http://", "ws://") + "/ws/approvals/"
    operator = make_user("olga", "operator")
    with (
        pytest.raises((InvalidStatus, ConnectionClosed)),  # refused, or closed at once
        connect(
            url,
            open_timeout=10,
            max_queue=None,
            additional_headers={"Cookie": cookie_for(operator), "Origin": asgi_server},
        ) as ws,
    ):
        ws.recv(timeout=5)
