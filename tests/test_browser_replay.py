"""An auditor in a real browser (Debian Chromium through Playwright, against daphne): finds
a finished session by flight number, steps through its replay with and without
JavaScript, and downloads the export, whose chain head is the one verify_chain computes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect

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
        # Play moves on by itself. (Pause is a link to the same step without `play`; an
        # autoplay request already in flight can still land after it: not asserted here.)
        page.goto(f"{asgi_server}/replay/{finished.pk}/?seq=1&play=8")
        expect(page.get_by_test_id("step")).not_to_have_text("Step #1")
        page.goto(f"{asgi_server}/replay/{finished.pk}/?seq=1")

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
