"""An auditor in a real browser (Debian Chromium through Playwright, against daphne): finds
a finished session by flight number, steps through its replay with and without
JavaScript, and downloads the export, whose chain head is the one verify_chain computes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, Request, Route, expect
from playwright.sync_api import Error as PlaywrightError

from diagnosis.chain import verify_chain
from diagnosis.models import Session
from tests.browser_helpers import ARTIFACTS, sign_in
from tests.web_helpers import TAXIWAY_FUEL_LEAK, approve_everything, make_session

pytestmark = [pytest.mark.services, pytest.mark.browser]


def find_and_open_replay(page: Page, base: str, session: Session) -> None:
    page.goto(base + "/sessions/")
    page.click("text=History & replay")
    page.fill("#id_flight", "CA1234")
    page.locator(".history-filters button[type=submit]").click()
    rows = page.locator("table.history tbody tr[data-session]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-session", str(session.pk))
    rows.first.get_by_test_id("replay-link").click()
    expect(page.get_by_test_id("step")).to_have_text("Step #1")


def pause_beats_autoplay_in_flight(page: Page, base: str, session: Session) -> None:
    """Pause while an autoplay request is on the wire: the network holds that request
    until Pause has been answered, then lets it through. Its late answer must not undo
    the pause (it did: the address bar moved on to the next step with play=8, so Reload
    or Back played on; had it landed before Pause's answer, the page itself would)."""
    held: list[Route] = []
    ended: list[Request] = []

    def hold_autoplay(route: Route) -> None:
        if route.request.headers.get("hx-trigger") == "autoplay" and not held:
            held.append(route)
        else:
            route.continue_()

    def end(request: Request) -> None:
        ended.append(request)

    page.on("requestfinished", end)
    page.on("requestfailed", end)
    page.route("**/replay/**", hold_autoplay)
    try:
        with page.expect_request(lambda r: r.headers.get("hx-trigger") == "autoplay"):
            page.locator("a.play-link", has_text="8").click()
        expect(page.get_by_test_id("step")).to_have_text("Step #1")  # the next is held
        page.get_by_test_id("pause").click()
        expect(page.get_by_test_id("pause")).to_have_count(0)
        expect(page).to_have_url(f"{base}/replay/{session.pk}/?seq=1")
        with contextlib.suppress(PlaywrightError):  # the browser gave it up: the fix
            held[0].continue_()
        autoplay = held[0].request
        for _ in range(100):  # until the held request has ended one way or the other
            if autoplay in ended:
                break
            page.wait_for_timeout(50)
        assert autoplay in ended
        # No event says "nothing was swapped in": give a late answer the time to land.
        page.wait_for_timeout(300)
        expect(page.get_by_test_id("step")).to_have_text("Step #1")
        expect(page.get_by_test_id("autoplay")).to_have_count(0)
        expect(page.locator(".player-play")).not_to_contain_text("Playing")
        expect(page).to_have_url(f"{base}/replay/{session.pk}/?seq=1")
    finally:
        page.unroute("**/replay/**", hold_autoplay)
        page.remove_listener("requestfinished", end)
        page.remove_listener("requestfailed", end)


def test_an_auditor_finds_replays_and_exports_a_session(
    builtin: None,
    asgi_server: str,
    browser: Browser,
    make_user: Callable[..., User],
    tmp_path: Path,
) -> None:
    finished = make_session(make_user("olga", "operator"))
    approve_everything(finished, make_user("abel", "approver"))
    assert finished.status == "completed"
    make_session(make_user("otto", "operator"), TAXIWAY_FUEL_LEAK)  # another flight
    auditor = make_user("carol", "auditor")

    page = sign_in(browser, asgi_server, auditor)
    plain = sign_in(browser, asgi_server, auditor, javascript=False)
    try:
        # With JavaScript: htmx swaps the player in place, the URL follows.
        find_and_open_replay(page, asgi_server, finished)
        page.get_by_test_id("next").click()
        expect(page.get_by_test_id("step")).to_have_text("Step #2")
        expect(page).to_have_url(f"{asgi_server}/replay/{finished.pk}/?seq=2")
        page.get_by_test_id("jump-seq").fill(str(finished.last_seq))
        page.get_by_test_id("jump-seq").press("Enter")
        expect(page.get_by_test_id("replay-status")).to_have_text("Completed")
        expect(page.locator("#replay-actions")).to_contain_text("approved by abel")
        page.get_by_test_id("previous").click()
        expect(page.get_by_test_id("step")).to_have_text(f"Step #{finished.last_seq - 1}")
        # Play moves on by itself.
        page.goto(f"{asgi_server}/replay/{finished.pk}/?seq=1&play=8")
        expect(page.get_by_test_id("step")).not_to_have_text("Step #1")
        page.goto(f"{asgi_server}/replay/{finished.pk}/?seq=1")
        pause_beats_autoplay_in_flight(page, asgi_server, finished)

        head = verify_chain(finished.pk).head
        expect(page.get_by_test_id("chain-head")).to_have_text(head)
        with page.expect_download() as download_info:
            page.get_by_test_id("export").click()
        target = tmp_path / "export.md"
        download_info.value.save_as(target)
        text = target.read_text(encoding="utf-8")
        assert f"Chain head: `{head}`" in text
        assert "Verified when exported" in text

        # Without JavaScript: every control is a link or a plain form.
        find_and_open_replay(plain, asgi_server, finished)
        with plain.expect_navigation():
            plain.get_by_test_id("next").click()
        expect(plain.get_by_test_id("step")).to_have_text("Step #2")
        plain.get_by_test_id("jump-seq").fill("10")
        with plain.expect_navigation():
            plain.get_by_test_id("jump-seq").press("Enter")
        expect(plain.get_by_test_id("step")).to_have_text("Step #10")
        with plain.expect_navigation():
            plain.locator("a[rel=last]").click()
        expect(plain.get_by_test_id("replay-status")).to_have_text("Completed")
        expect(plain.get_by_test_id("chain-head")).to_have_text(head)
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "replay-js.png"), full_page=True)
        plain.screenshot(path=str(ARTIFACTS / "replay-nojs.png"), full_page=True)
        raise
    finally:
        page.context.close()
        plain.context.close()
