"""The model's reasoning streams onto the live session page (issue 11 item 7), in
a real browser (Debian Chromium through Playwright, against daphne): the simulated model
streams slowly, the page shows part of the text while the call is still running, the
whole text when it ended, and a reload without JavaScript shows it too."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, expect

from diagnosis.actions import do_create_session
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.jobs import enqueue as job_enqueue
from diagnosis.models import LLMRequest
from scenarios_admin.models import Scenario
from tests.browser_helpers import sign_in
from tests.llm_helpers import fake_llm, fake_provider
from tests.test_llm_runner import ANSWER, EXAMPLE_ONE

__all__ = ["fake_llm"]  # the fixture

EXPECTED_TEXT = json.dumps(ANSWER["json"], ensure_ascii=False)

pytestmark = [pytest.mark.services, pytest.mark.browser]


def test_the_models_text_streams_onto_the_page(
    builtin: None,
    asgi_server_with_llm_runner: str,
    browser: Browser,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.AERO_LLM_WAITS = True
    settings.AERO_LLM_REACT = False
    # The test process makes no call itself (its jobs run inline).
    monkeypatch.setattr(job_enqueue, "run_pending_inline", lambda session_id: False)
    # About 40 pieces of 6 characters, one every 0.15 s: a call of ~6 s.
    # The server's agent reasons with the model too (ReAct is on there): those calls are
    # refused at once, so the session goes on offline and the test ends quickly.
    fake_llm.set_script(
        {
            "chunk_size": 6,
            "chunk_delay": 0.15,
            "rules": [{"match": {"has_tools": True}, "status": 400}, ANSWER],
        }
    )
    fake_provider(fake_llm)
    olga = make_user("olga", "operator")
    session = do_create_session(olga, Scenario.objects.get(slug="oil_spill"), EXAMPLE_ONE)
    asgi_server = asgi_server_with_llm_runner
    page = sign_in(browser, asgi_server, olga)
    page.goto(f"{asgi_server}/sessions/{session.pk}/")
    expect(page.locator("#live[ws-connect]")).to_be_visible()
    time.sleep(0.5)  # the socket opens after the page: it must see every delta

    # The call is made by the LLM runner inside the web process (embedded job
    # backend), which also resumes the session: nothing here but the page.
    stream = page.get_by_test_id("model-stream")
    expect(stream).to_contain_text('"flight_no"', timeout=15_000)
    partial = stream.inner_text()
    first = LLMRequest.objects.filter(session=session).order_by("id").first()
    still_running = first is not None and first.status == "pending"
    # The call's final text stays on the timeline (the panel moves on to the next call).
    final = page.locator(".ev-llmcall .model-text").first
    expect(final).to_have_text(EXPECTED_TEXT, timeout=30_000)

    assert still_running, "the text must be on the page before the call ends"
    reply = LLMRequest.objects.filter(session=session).order_by("id").first()
    assert reply is not None and reply.status == "done" and reply.text == EXPECTED_TEXT
    assert partial and len(partial) < len(reply.text) and reply.text.startswith(partial)
    # The resumed input parser used the model's reading.
    expect(page.locator("td[data-field=engine_status]")).to_contain_text("Running")
    # Without JavaScript, a reload shows the same text. The session goes on offline
    # meanwhile, and the page shows its newest 50 events: the call may be older than
    # those, and then the "Earlier events" link is how a reader reaches it.
    static = sign_in(browser, asgi_server, olga, javascript=False)
    static.goto(f"{asgi_server}/sessions/{session.pk}/")
    earlier = static.get_by_role("link", name="Earlier events")
    if not static.locator(".ev-llmcall .model-text").count() and earlier.count():
        earlier.click()
    expect(static.locator(".ev-llmcall .model-text").first).to_have_text(EXPECTED_TEXT)
