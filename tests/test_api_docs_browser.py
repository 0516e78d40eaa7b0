"""The browsable API docs render in a real browser under the site's CSP, from our own
static files (no request leaves the server)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from playwright.sync_api import Browser, expect

pytestmark = [pytest.mark.services, pytest.mark.browser]


def test_swagger_ui_renders_every_operation(
    transactional_db: None, browser: Browser, asgi_server: str
) -> None:
    context = browser.new_context()
    page = context.new_page()
    outside: list[str] = []
    violations: list[str] = []
    page.on(
        "request",
        lambda request: (
            None if request.url.startswith(asgi_server) else outside.append(request.url)
        ),
    )
    page.on(
        "console",
        lambda message: (
            violations.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    with urllib.request.urlopen(f"{asgi_server}/api/v1/openapi.json", timeout=30) as answer:
        paths = json.load(answer)["paths"]
    methods = {"get", "post", "put", "patch", "delete"}
    operations = sum(len(methods & set(item)) for item in paths.values())
    assert operations >= 17  # the airport's and the diagnosis pack's
    page.goto(f"{asgi_server}/api/v1/docs")

    expect(page.locator(".opblock")).to_have_count(operations)
    expect(page.locator(".opblock-summary-path").first).to_contain_text("/api/v1/")
    expect(page.get_by_text("AERO API").first).to_be_visible()
    assert outside == []
    assert [v for v in violations if "script" in v] == []
    context.close()
