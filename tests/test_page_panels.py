"""Issue 37 item 3: the session page's panels are rendered once and shared
(diagnosis/page_panels.py). A page shown again, or to another viewer with the same
roles, renders no panel, nor does a page after the live push rendered them; and a panel
is never stale: what changes without an event (an approval's state, a run's end,
another session's closure, the clock) shows at once, and each viewer's forms carry their
own CSRF token.

Personas: olga operates, bob approves, carol audits."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from approvals.cards import deadline_html
from approvals.models import Approval
from diagnosis import page_panels
from diagnosis.live_render import render_updates
from diagnosis.models import AgentRun, Session, ToolCall
from packs.airport.models import Restriction
from tests.web_helpers import approval_for, login, waiting_session

pytestmark = pytest.mark.services


@pytest.fixture
def bob(make_user: Callable[..., User]) -> User:
    return make_user("bob", "approver")


@pytest.fixture
def session(builtin: None, olga: User) -> Session:
    return waiting_session(olga)


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every panel the module renders (a kept one is not rendered)."""
    rendered: list[str] = []
    original = page_panels._render

    def counting(panel: str, context: dict[str, Any]) -> str:
        rendered.append(panel)
        return original(panel, context)

    monkeypatch.setattr(page_panels, "_render", counting)
    return rendered


def page(user: User, session: Session) -> str:
    response = login(user).get(f"/sessions/{session.pk}/")
    assert response.status_code == 200
    return str(response.content.decode())


def panel(html: str, name: str) -> str:
    start = html.index(f'<section id="{name}"')
    return html[start : html.index("</section>", start)]


def test_a_page_shown_again_or_to_another_viewer_renders_no_panel(
    session: Session, olga: User, make_user: Callable[..., User], renders: list[str]
) -> None:
    first = page(olga, session)
    assert sorted(renders) == sorted(page_panels.PANELS)
    renders.clear()

    again = page(olga, session)
    other = page(make_user("otto", "operator"), session)

    assert renders == []
    for name in page_panels.PANELS:
        # the same panel but for the viewer's own CSRF token
        strip = re.compile(r'name="csrfmiddlewaretoken" value="[^"]+"')
        assert strip.sub("", panel(again, name)) == strip.sub("", panel(first, name))
        assert strip.sub("", panel(other, name)) == strip.sub("", panel(first, name))
    assert "\x00" not in again and "hx-swap-oob" not in again


def test_each_viewer_gets_their_own_csrf_token_and_a_push_none(
    session: Session, bob: User, make_user: Callable[..., User]
) -> None:
    tokens = []
    for user in (bob, make_user("bea", "approver")):
        client = login(user)
        html = client.get(f"/sessions/{session.pk}/").content.decode()
        actions = panel(html, "session-actions")
        found = set(re.findall(r'name="csrfmiddlewaretoken" value="([^"]+)"', actions))
        assert len(found) == 1 and 'class="decide"' in actions
        # the token the forms carry is accepted with this viewer's cookie
        approval = approval_for(session, "dispatch_cleanup_crew")
        posted = client.post(
            f"/approvals/{approval.pk}/decide/",
            {"decision": "reject", "reason": "x", "digest": "stale",
             "csrfmiddlewaretoken": next(iter(found))},
        )  # fmt: skip
        assert posted.status_code != 403
        tokens.append(next(iter(found)))
    assert tokens[0] != tokens[1]

    pushed = render_updates(frozenset({"approver"}), session.pk, session.last_seq - 1)
    assert pushed is not None
    assert "csrfmiddlewaretoken" not in pushed.html and "\x00" not in pushed.html


def test_the_push_renders_the_panels_the_page_then_reuses(
    session: Session, olga: User, renders: list[str]
) -> None:
    # the answer box changes (no key known): the push sends it with the events' panels
    pushed = render_updates(frozenset({"operator"}), session.pk, 0, None)
    assert pushed is not None and renders
    sent = set(renders)
    assert 'id="session-composer" class="card" data-key=' in pushed.html
    renders.clear()

    html = page(olga, session)

    assert set(renders) == set(page_panels.PANELS) - sent
    composer = panel(html, "session-composer")
    assert "hx-swap-oob" not in composer and 'name="csrfmiddlewaretoken"' in composer


def test_an_approval_decided_without_an_event_shows_at_once(session: Session, bob: User) -> None:
    approval = approval_for(session, "dispatch_cleanup_crew")
    before = panel(page(bob, session), "session-actions")
    assert f'data-approval="{approval.pk}"' in before

    Approval.objects.filter(pk=approval.pk).update(status="rejected", decided_at=timezone.now())
    ToolCall.objects.filter(pk=approval.tool_call_id).update(status="rejected")

    after = panel(page(bob, session), "session-actions")
    assert f'data-approval="{approval.pk}"' not in after


def test_another_sessions_closure_shows_as_already_in_force(session: Session, olga: User) -> None:
    closure = approval_for(session, "close_taxiway", taxiway="A")
    row = f'id="action-{closure.tool_call_id}"'
    assert "already in force" not in panel(page(olga, session), "session-actions")

    holder = waiting_session(olga)
    Restriction.objects.create(
        kind="taxiway",
        target="A",
        session=holder,
        tool_call=ToolCall.objects.create(
            session=holder, call_id="by-hand", idempotency_key="k", tool_name="close_taxiway"
        ),
    )

    actions = panel(page(olga, session), "session-actions")
    shown = actions[actions.index(row) : actions.index("</tr>", actions.index(row))]
    assert "already in force" in shown


def test_a_runs_end_written_after_the_last_event_shows_at_once(
    session: Session, olga: User
) -> None:
    run = AgentRun.objects.filter(session=session, parent__isnull=True).latest("started_at")
    assert f'data-run="{run.pk}" data-status="{run.status}"' in page(olga, session)

    AgentRun.objects.filter(pk=run.pk).update(status="failed")

    assert f'data-run="{run.pk}" data-status="failed"' in page(olga, session)


def test_deadlines_and_running_times_are_as_of_each_request(
    session: Session, bob: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    approval = approval_for(session, "dispatch_cleanup_crew")
    assert approval.deadline is not None
    AgentRun.objects.filter(session=session).update(status="running", ended_at=None)
    Session.objects.filter(pk=session.pk).update(status="running")
    session.refresh_from_db()
    first = page(bob, session)
    assert str(deadline_html(approval)) in panel(first, "session-actions")
    elapsed = re.findall(r'class="muted elapsed"[^>]*>([^<]*)<', panel(first, "session-agents"))

    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(minutes=7))
    later = page(bob, session)

    text = str(deadline_html(approval))
    assert text in panel(later, "session-actions")
    assert text not in panel(first, "session-actions")
    assert elapsed and elapsed != re.findall(
        r'class="muted elapsed"[^>]*>([^<]*)<', panel(later, "session-agents")
    )
