"""Browser tests drive Debian's Chromium (never a downloaded build) through Playwright."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import Browser, Page, expect

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def sign_in(
    browser: Browser, base: str, user: User, *, javascript: bool = True, language: str = "en"
) -> Page:
    """A browser context with the user's session cookie (the login form has its own tests;
    the server process hashes passwords differently from the test process). The server
    runs the product's settings (zh-hans by default): the behaviour tests read English,
    chosen with the language cookie as the switch would (tests/test_i18n.py covers zh)."""
    client = Client()
    client.force_login(user)
    context = browser.new_context(
        viewport={"width": 1400, "height": 1000}, java_script_enabled=javascript
    )
    cookies = [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": base}]
    if language:
        cookies.append({"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "url": base})
    context.add_cookies(cookies)  # type: ignore[arg-type]
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(base + "/sessions/")
    expect(page.locator(".who")).to_contain_text(user.get_username())
    return page


def reload_until(page: Page, done: Callable[[], bool], attempts: int = 40) -> None:
    """Without JavaScript nothing is pushed: a person reloads until the page shows it."""
    for _ in range(attempts):
        if done():
            return
        page.wait_for_timeout(250)
        page.reload()
    raise AssertionError(f"{page.url} never showed what was expected")
