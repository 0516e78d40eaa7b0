"""Issue 34, item 4: every main page fits 400, 1366 and 1920 px wide, in English and in
Chinese. A real browser (Debian Chromium) opens each page at each width, saves a
screenshot (test-artifacts/layout/) and checks the element boxes: the document does not
scroll sideways, no text is clipped by a container that hides its overflow, no word is
broken inside (a short word, or a label of a few Chinese characters, rendered on two
lines), and the icons (⏮ ⏭ ▶ ✓ …) have a glyph in the fonts the machine ships instead of
the missing-glyph box."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import reverse
from playwright.sync_api import Browser, Page

from diagnosis.models import Session
from scenarios_admin.models import Scenario
from tests.browser_helpers import ARTIFACTS, sign_in
from tests.web_helpers import STAND_FUEL_LEAK, login, waiting_session

pytestmark = [pytest.mark.services, pytest.mark.browser]

WIDTHS = (400, 1366, 1920)

# Measured in the page: a list of what is wrong, each with the element it is about.
CHECK = r"""
() => {
  const problems = [];
  const name = (el) => {
    let s = el.tagName.toLowerCase();
    if (el.id) s += '#' + el.id;
    if (typeof el.className === 'string' && el.className.trim())
      s += '.' + el.className.trim().split(/\s+/).join('.');
    const test = el.closest('[data-testid]');
    return test ? `${s} in [data-testid=${test.dataset.testid}]` : s;
  };
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth + 1) {
    const wide = [...document.body.querySelectorAll('*')].filter((el) => {
      const r = el.getBoundingClientRect();
      return r.width > 0 && r.right > doc.clientWidth + 1 && el.children.length === 0;
    }).slice(0, 3).map(name);
    problems.push(`the page scrolls sideways (${doc.scrollWidth} > ${doc.clientWidth}): ${wide}`);
  }
  // Not shown (screen-reader texts: Django admin's .visually-hidden) or not text.
  const skipped = 'script,style,noscript,template,textarea,select,option,svg,[hidden],' +
    '.sr-only,.visually-hidden,.model-stream';
  const cuts = (v) => v === 'hidden' || v === 'clip';
  const hides = (s) => cuts(s.overflowX) || cuts(s.overflowY);
  const lines = (range) => new Set([...range.getClientRects()]
    .filter((r) => r.width > 0.5).map((r) => Math.round(r.top))).size;
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const seen = new Set();
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.nodeValue;
    const el = node.parentElement;
    if (!text.trim() || !el || el.closest(skipped)) continue;
    const box = el.getBoundingClientRect();
    const style = getComputedStyle(el);
    if (box.width < 2 || box.height < 2 || style.visibility === 'hidden') continue;
    // Inside a closed <details> (not its summary): not shown.
    const details = el.closest('details');
    if (details && !details.open && !el.closest('summary')) continue;
    // A word broken inside: each Latin word or number (2..24 characters: longer ones,
    // hashes and ids, may wrap; a line may end after a hyphen, as in "2026-11-" / "29"),
    // and a whole text of at most 6 Chinese characters.
    const words = /[A-Za-z0-9][A-Za-z0-9_.'\u2019:]*[A-Za-z0-9]/g;
    for (const m of text.matchAll(words)) {
      if (m[0].length > 24) continue;
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      if (lines(range) > 1) problems.push(`"${m[0]}" is broken inside, in ${name(el)}`);
    }
    const label = text.trim();
    if (/^[\u3400-\u9fff]{2,6}$/.test(label)) {
      const range = document.createRange();
      range.selectNodeContents(node);
      if (lines(range) > 1) problems.push(`"${label}" is broken inside, in ${name(el)}`);
    }
    // Clipped: the text's box runs out of an ancestor that hides its overflow.
    const range = document.createRange();
    range.selectNodeContents(node);
    const rects = [...range.getClientRects()].filter((r) => r.width > 0.5);
    for (let up = el; up && up !== document.body; up = up.parentElement) {
      const s = getComputedStyle(up);
      if (!hides(s)) continue;
      const outer = up.getBoundingClientRect();
      const out = rects.some((r) => r.right > outer.right + 1 || r.left < outer.left - 1 ||
        (s.overflowY !== 'visible' && (r.bottom > outer.bottom + 1 || r.top < outer.top - 1)));
      // A scrolling box shows the rest when scrolled: only hidden/clip cuts text off.
      if (out) {
        const key = name(up) + label.slice(0, 20);
        if (!seen.has(key)) {
          seen.add(key);
          problems.push(`"${label.slice(0, 40)}" is clipped by ${name(up)}`);
        }
      }
      break;
    }
  }
  // Icons: a glyph drawn differently from the missing-glyph box of the same font.
  const canvas = document.createElement('canvas');
  canvas.width = canvas.height = 40;
  const ctx = canvas.getContext('2d', { willReadFrequently: true });
  const draw = (font, ch) => {
    ctx.clearRect(0, 0, 40, 40);
    ctx.font = font;
    ctx.fillText(ch, 4, 30);
    return ctx.getImageData(0, 0, 40, 40).data.join(',');
  };
  const icons = /[\u2190-\u21ff\u2300-\u23ff\u25a0-\u25ff\u2600-\u27bf]/g;
  const checked = new Set();
  for (const el of document.body.querySelectorAll('*')) {
    if (el.closest(skipped)) continue;
    for (const child of el.childNodes) {
      if (child.nodeType !== Node.TEXT_NODE) continue;
      for (const m of child.nodeValue.matchAll(icons)) {
        const s = getComputedStyle(el);
        const font = `${s.fontSize} ${s.fontFamily}`;
        if (checked.has(m[0] + font)) continue;
        checked.add(m[0] + font);
        if (draw(font, m[0]) === draw(font, '\uffff'))
          problems.push(`icon ${m[0]} has no glyph in ${font} (${name(el)})`);
      }
    }
  }
  return problems;
}
"""


def layout_problems(page: Page, shot: str) -> list[str]:
    page.wait_for_load_state("load")
    page.evaluate("document.fonts.ready")
    ARTIFACTS.joinpath("layout").mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "layout" / f"{shot}.png"), full_page=True)
    problems: list[str] = page.evaluate(CHECK)
    return problems


@pytest.fixture
def sessions(builtin: None, alice: User, bob: User) -> dict[str, Session]:
    """A running apron session (actions wait for approvers), a concluded one (every
    action decided, its report written) and a concluded IT diagnosis."""
    running = waiting_session(alice)
    call_command(
        "incident",
        "run",
        "--scenario",
        "oil_spill",
        "--message",
        STAND_FUEL_LEAK,
        "--decide",
        "approve",
        "--json",
    )
    concluded = Session.objects.filter(status="completed", scenario__slug="oil_spill").get()
    login(alice).post(reverse("diagnosis_pack:new"), {"demo": "ex-pool-inventory"})
    diagnosis = Session.objects.filter(scenario__kind="diagnosis").get()
    return {"running": running, "concluded": concluded, "diagnosis": diagnosis}


def pages(sessions: dict[str, Session]) -> list[tuple[str, str, str]]:
    """(name, who, path) for every main page."""
    scenario = Scenario.objects.get(slug="oil_spill")
    concluded = sessions["concluded"].pk
    return [
        ("sessions", "operator", reverse("diagnosis:session-list")),
        (
            "session-running",
            "operator",
            reverse("diagnosis:session-detail", args=[sessions["running"].pk]),
        ),
        ("session-concluded", "operator", reverse("diagnosis:session-detail", args=[concluded])),
        (
            "session-diagnosis",
            "operator",
            reverse("diagnosis:session-detail", args=[sessions["diagnosis"].pk]),
        ),
        ("approvals", "approver", reverse("approvals:queue")),
        ("airport", "operator", reverse("airport:board")),
        ("history", "auditor", reverse("replay:history")),
        ("replay", "auditor", reverse("replay:replay-step", args=[concluded])),
        ("admin-scenarios", "admin", reverse("admin:scenarios_admin_scenario_changelist")),
        (
            "admin-scenario",
            "admin",
            reverse("admin:scenarios_admin_scenario_change", args=[scenario.pk]),
        ),
    ]


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_every_main_page_fits_every_width(
    sessions: dict[str, Session],
    asgi_server: str,
    browser: Browser,
    make_user: Callable[..., User],
    language: str,
) -> None:
    people: dict[str, Any] = {
        "operator": make_user("olga", "operator"),
        "approver": make_user("abel", "approver"),
        "auditor": make_user("aude", "auditor"),
        "admin": User.objects.create_superuser("adam", password="pw-for-tests"),
    }
    found: list[str] = []
    for who, user in people.items():
        page = sign_in(browser, asgi_server, user, language=language)
        try:
            for name, viewer, path in pages(sessions):
                if viewer != who:
                    continue
                for width in WIDTHS:
                    page.set_viewport_size({"width": width, "height": 900})
                    page.goto(asgi_server + path)
                    for problem in layout_problems(page, f"{name}-{width}-{language}"):
                        found.append(f"{name} at {width} px: {problem}")
        finally:
            page.context.close()

    assert found == [], "\n".join(found)
