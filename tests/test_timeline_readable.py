"""The session timeline as an operator reads it: what happened, what the agent asked,
found and proposed, who decided; the agent's internals folded under a disclosure (still
in the log, on the full timeline and in replay); plain words for codes, with the code in
a tooltip; the list opens on its newest entry."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.urls import reverse
from playwright.sync_api import Browser, expect

from approvals.actions import do_decide
from diagnosis import presenters
from diagnosis.events import append_event
from diagnosis.models import Event, Session
from tests.browser_helpers import sign_in
from tests.web_helpers import approval_for, login, waiting_session

pytestmark = pytest.mark.services

ENTRY = re.compile(r'<li id="event-(\d+)" data-seq="\d+" data-type="([^"]+)" class="([^"]*)"')


def entries(page: str) -> dict[int, tuple[str, set[str]]]:
    """seq -> (event type, classes) of every timeline entry on the page."""
    return {int(seq): (kind, set(cls.split())) for seq, kind, cls in ENTRY.findall(page)}


# What the test server's page shows (the fixture below patches this process only).
SERVED_PAGE_EVENTS = presenters.SESSION_PAGE_EVENTS


@pytest.fixture(autouse=True)
def whole_timeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests read every entry of a session on its page: all on one page (the page
    otherwise shows the newest SESSION_PAGE_EVENTS, older ones a click away)."""
    monkeypatch.setattr(presenters, "SESSION_PAGE_EVENTS", presenters.TIMELINE_PAGE)


def detail_page(user: User, session: Session) -> str:
    return login(user).get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()


def test_agent_internals_are_folded_and_what_matters_is_not(builtin: None, alice: User) -> None:
    session = waiting_session(alice)
    page = detail_page(alice, session)
    shown = entries(page)
    assert len(shown) == session.last_seq  # nothing is dropped from the page or the log
    internal = {seq for seq, (_, cls) in shown.items() if "internal" in cls}
    kinds = {kind for seq, (kind, _) in shown.items() if seq in internal}
    assert kinds <= {
        "agent.node_started",
        "agent.node_completed",
        "tool.call_started",
        "tool.call_queued",
        "tool.call_completed",
        "llm.call",
        "fsm.transition",
        "session.status_changed",
    }
    assert {"agent.node_started", "agent.node_completed"} <= kinds
    for seq, (kind, cls) in shown.items():
        if kind in ("session.created", "user.message", "finding.recorded", "approval.required"):
            assert "internal" not in cls, (seq, kind)
    # The operator view is the short one: most of what the agent writes is internal.
    assert len(internal) > len(shown) / 2
    # The disclosure that shows them sits right before the list (CSS hides them while
    # it is closed, aero.css), so a live append folds new internals the same way.
    assert re.search(
        r'<details class="agent-details"[^>]*><summary>Show the agent\'s internal steps'
        r'</summary></details>\s*<ol id="timeline-list"',
        page,
    )
    # still all in the log
    assert Event.objects.filter(session=session, type="agent.node_started").exists()


def test_codes_become_plain_words_with_the_code_in_a_tooltip(builtin: None, alice: User) -> None:
    session = waiting_session(alice)
    page = detail_page(alice, session)
    # compliance states
    assert '<strong title="IMPACT_ANALYZED">Impact analysed</strong>' in page
    assert ">IMPACT_ANALYZED<" not in page
    # tools: the proposal and the actions table
    assert 'title="dispatch_cleanup_crew">Dispatch the cleanup crew</span>' in page
    assert "<code>dispatch_cleanup_crew</code>" not in page
    # the risk: level in words, the rule's reason in field labels, its id in a tooltip
    # (the session's first finding is its risk; its impact follows)
    risk = re.search(r'data-type="finding.recorded".*?</li>', page, flags=re.S)
    assert risk is not None
    assert '<strong class="risk-high" title="HIGH">High</strong>' in risk.group(0)
    assert 'title="rule OS-01"' in risk.group(0) and "because" in risk.group(0)
    assert "Fluid type" in risk.group(0) or "Engine running" in risk.group(0)
    # what was recognised: labels and value labels, the code in the tooltip
    extracted = re.search(r'data-type="fields.extracted".*?</li>', page, flags=re.S)
    assert extracted is not None and 'title="flight_no=CA1234"' in extracted.group(0)
    assert "Flight number: <strong>CA1234</strong>" in extracted.group(0)
    # checklist priorities and a scenario default
    assert 'title="P1">required<' in page and 'title="P2">if known<' in page
    assert 'title="default">scenario default (not reported)<' in page
    assert ">P1<" not in page and "“default”" not in page


def test_who_decided_reads_as_a_sentence(builtin: None, alice: User, bob: User) -> None:
    session = waiting_session(alice)
    approval = approval_for(session, "dispatch_cleanup_crew", position="105")
    do_decide(approval.pk, bob, "approve", "", digest=approval.digest)
    page = detail_page(alice, session)
    assert (
        'bob approved <span title="dispatch_cleanup_crew">Dispatch the cleanup crew (105)</span>'
        in page
    )


def test_two_decisions_on_one_tool_say_what_each_acts_on(
    builtin: None, alice: User, bob: User
) -> None:
    """Close taxiway A and close taxiway B: each line names its taxiway."""
    session = waiting_session(alice)
    for taxiway in ("A", "B"):
        closure = approval_for(session, "close_taxiway", taxiway=taxiway)
        do_decide(closure.pk, bob, "reject", f"taxiway {taxiway} stays open", digest=closure.digest)
    page = detail_page(alice, session)
    for taxiway in ("A", "B"):
        assert (
            f'bob rejected <span title="close_taxiway">Close taxiway ({taxiway})</span>'
            f": “<bdi>taxiway {taxiway} stays open</bdi>”"
        ) in page


def test_the_full_timeline_folds_the_same_internals(
    builtin: None, carol: User, alice: User
) -> None:
    session = waiting_session(alice)
    page = login(carol).get(reverse("diagnosis:session-events", args=[session.pk])).content
    html = page.decode()
    shown = entries(html)
    assert len(shown) == session.last_seq
    assert any("internal" in cls for _, cls in shown.values())
    assert '<details class="agent-details">' in html
    assert "Impact analysed" in html  # the scenario definition reaches this page too


@pytest.mark.browser
def test_the_timeline_opens_on_its_newest_entry_with_internals_folded(
    builtin: None, alice: User, browser: Browser, asgi_server: str
) -> None:
    session = waiting_session(alice)
    page = sign_in(browser, asgi_server, alice)
    page.set_viewport_size({"width": 1400, "height": 500})  # a list longer than its box
    page.goto(f"{asgi_server}{reverse('diagnosis:session-detail', args=[session.pk])}")
    timeline = page.locator("#timeline-list")
    internals = page.locator("#timeline-list > li.internal")
    expect(internals.first).to_be_hidden()
    # Opened on the newest entry: the list (a scroll box) is at its end, its newest
    # operator entry inside the box, its oldest scrolled out above it.
    where = timeline.evaluate(
        """list => {
          const items = [...list.querySelectorAll(":scope > li:not(.internal)")];
          const box = list.getBoundingClientRect();
          const newest = items[items.length - 1].getBoundingClientRect();
          const oldest = items[0].getBoundingClientRect();
          return {
            overflows: list.scrollHeight > list.clientHeight,
            atEnd: list.scrollHeight - list.clientHeight - list.scrollTop < 2,
            newestInside: newest.top >= box.top - 1 && newest.bottom <= box.bottom + 1,
            oldestAbove: oldest.bottom <= box.top + 1,
          };
        }"""
    )
    assert where == {"overflows": True, "atEnd": True, "newestInside": True, "oldestAbove": True}
    page.locator("details.agent-details > summary").click()
    expect(internals.last).to_be_visible()


@pytest.mark.browser
def test_switching_language_in_the_header(
    builtin: None, alice: User, browser: Browser, asgi_server: str
) -> None:
    page = sign_in(browser, asgi_server, alice, language="")  # no choice yet: the default
    expect(page.locator("html")).to_have_attribute("lang", "zh-Hans")
    page.get_by_role("button", name="English").click()
    expect(page.locator("html")).to_have_attribute("lang", "en")
    page.get_by_role("button", name="简体中文").click()
    expect(page.locator("html")).to_have_attribute("lang", "zh-Hans")
    expect(page.locator("header nav")).to_contain_text("会话")
    expect(page).to_have_url(re.compile(r"/sessions/$"))
    page.get_by_role("button", name="English").click()
    expect(page.locator("header nav")).to_contain_text("Sessions")


def test_every_kind_of_event_has_its_line_and_every_line_a_kind() -> None:
    """diagnosis/_event.html shows the line an event's type declares: a name without its
    partial would be a server error on any page showing that event; a partial no type
    names is a line no event can reach."""
    from django.template.loader import get_template

    from diagnosis.eventlog import registry
    from diagnosis.templatetags.timeline import EVENT_LINES_TEMPLATE

    source = (settings.BASE_DIR / "templates" / EVENT_LINES_TEMPLATE).read_text()
    defined = set(re.findall(r"\{% partialdef ([\w-]+) %\}", source))
    every = registry.possible_lines() | {"other"}
    # A pack's lines name their own template ("template#partial"): each must exist.
    own = {line for line in every if "#" in line}
    named = every - own
    assert defined == named
    for name in named:
        get_template(f"{EVENT_LINES_TEMPLATE}#{name}")
    assert own  # the diagnosis pack declares some: the check below runs
    for line in own:
        get_template(line)


@pytest.mark.parametrize(
    ("kind", "payload", "line"),
    [
        ("approval.canceled", {"withdrawn": "not_called_for"}, "approval-canceled-not-called-for"),
        ("approval.canceled", {"withdrawn": "corrected"}, "approval-canceled-withdrawn"),
        ("approval.canceled", {"withdrawn": ""}, "approval-canceled"),
        ("agent.note", {"kind": "already_in_force", "outcome": "x"}, "agent-note-already-in-force"),
        ("agent.note", {"kind": "proposed_again"}, "agent-note-proposed-again"),
        ("agent.note", {"outcome": "rejected"}, "agent-note-rejected"),
        ("agent.note", {"outcome": "timeout"}, "agent-note-outcome"),
        ("agent.note", {"text": "t"}, "agent-note"),
        ("approval.timeout", {"tool_name": "continue_budget"}, "approval-timeout-continue-budget"),
        ("session.completed", {"closed_by": "olga"}, "session-completed-closed-by"),
        ("timeline.appended", {"kind": "alert"}, "timeline-appended-alert"),
        ("timeline.appended", {"kind": "operator_update"}, "cockpit"),
        ("approval.args_edited", {}, "cockpit"),
        ("timeline.appended", {"kind": "scenario_switched_to"}, "cockpit"),
        # a type keeps its own line whatever its payload holds
        ("user.message", {"kind": "operator_update"}, "user-message"),
        # a finding by its kind's line, the pack's own; an old log's named type the same
        ("finding.recorded", {"kind": "risk", "level": "HIGH"}, "airport/_lines.html#risk"),
        ("risk.assessed", {"level": "HIGH"}, "airport/_lines.html#risk"),
        ("finding.recorded", {"kind": "impact"}, "airport/_lines.html#impact"),
        ("impact.analyzed", {"radius": 2}, "airport/_lines.html#impact"),
        ("no.such.type", {}, "other"),
    ],
)
def test_an_event_is_shown_by_the_first_line_that_matches_it(
    kind: str, payload: dict[str, str], line: str
) -> None:
    from diagnosis.templatetags.timeline import EVENT_LINES_TEMPLATE, event_line

    expected = line if "#" in line else f"{EVENT_LINES_TEMPLATE}#{line}"
    assert event_line(kind, payload) == expected


@pytest.mark.browser
def test_earlier_events_load_above_the_oldest_shown_until_the_first(
    builtin: None, alice: User, browser: Browser, asgi_server: str
) -> None:
    """In the browser: the page opens on the newest SESSION_PAGE_EVENTS rows; each click
    on "Earlier events" puts the page before them at the top of the list (no reload),
    until seq 1 is shown and the link is gone; the live socket still appends below."""
    session = waiting_session(alice)
    with transaction.atomic():
        for n in range(300 - session.last_seq):
            append_event(session.pk, "agent.note", {"text": f"note {n}"}, producer="test")
    page = sign_in(browser, asgi_server, alice)
    page.goto(f"{asgi_server}{reverse('diagnosis:session-detail', args=[session.pk])}")
    rows = page.locator("#timeline-list > li[data-seq]")
    expect(rows).to_have_count(SERVED_PAGE_EVENTS)
    expect(rows.first).to_have_attribute("data-seq", str(301 - SERVED_PAGE_EVENTS))
    earlier = page.locator("#timeline-earlier a")
    earlier.click()
    expect(rows).to_have_count(SERVED_PAGE_EVENTS + presenters.TIMELINE_PAGE)
    expect(rows.first).to_have_attribute(
        "data-seq", str(301 - SERVED_PAGE_EVENTS - presenters.TIMELINE_PAGE)
    )
    earlier.click()
    expect(rows).to_have_count(300)
    expect(rows.first).to_have_attribute("data-seq", "1")
    expect(earlier).to_have_count(0)
    seqs = rows.evaluate_all("rows => rows.map(row => Number(row.dataset.seq))")
    assert seqs == list(range(1, 301))
    append_event(session.pk, "agent.note", {"text": "after the pages"}, producer="test")
    expect(rows.last).to_have_attribute("data-seq", "301", timeout=15_000)
