"""Each specialist's streamed text in its own node of the agent tree (issue 35 item 6), in
a real browser (Debian Chromium through Playwright, against daphne with the embedded LLM
runner): a hierarchical diagnosis whose four specialists each ask the simulated model
(as waits of their own child jobs), the model streaming slowly. The live page shows a
specialist's text in that specialist's node while it streams (pushed over the
WebSocket: the page is never reloaded), each specialist's final text in its own node
and in no other, and replay's run tree shows the final texts too."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect

from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.jobs import enqueue as job_enqueue
from diagnosis.models import AgentRun, Event
from packs.diagnosis.sessions import start_from_bundle
from tests.browser_helpers import sign_in
from tests.llm_helpers import fake_llm, fake_provider
from tests.test_diagnosis_model import BUNDLE, CITED, LOG_SEARCH, specialist

__all__ = ["fake_llm"]  # the fixture

pytestmark = [pytest.mark.services, pytest.mark.browser]

# What each specialist's model says last: its node's final text.
LAST_WORDS = {
    "logs": "Logs: the signatures say enough; nothing more to read.",
    "metrics": "Metrics: the metrics can wait for another day.",
    "changes_code": "Changes: the payments deploy is enough to go on.",
    "knowledge": "Knowledge: no past case adds anything here.",
}
SCRIPT = {
    # About 8 characters every 0.2 s: each specialist's words take a few seconds.
    "chunk_size": 8,
    "chunk_delay": 0.2,
    "rules": [
        specialist("logs", "log_search", content=LAST_WORDS["logs"]),
        specialist(
            "logs",
            content="Logs: the payments errors first, then the rest of them.",
            tool_calls=[{"name": "log_search", "arguments": LOG_SEARCH}],
        ),
        specialist("metrics", content=LAST_WORDS["metrics"]),
        specialist("changes_code", "deploys", content=LAST_WORDS["changes_code"]),
        specialist(
            "changes_code",
            content="Changes: the deploys around the incident first.",
            tool_calls=[{"name": "deploys"}],
        ),
        specialist("knowledge", content=LAST_WORDS["knowledge"]),
        CITED,
    ],
}


def run_ids(session_id: Any) -> dict[str, int]:
    """The specialists' runs, once the test process's job has made them (it runs the
    session inline up to the specialists' model waits)."""
    return {
        run.agent_name.removeprefix("specialist_"): run.pk
        for run in AgentRun.objects.filter(
            session_id=session_id, agent_name__startswith="specialist_"
        )
    }


def node_text(page: Page, run: int) -> Any:
    return page.locator(f'.run-text[data-run="{run}"] pre')


def test_each_specialists_streamed_text_lands_in_its_own_node(
    builtin: None,
    asgi_server_with_llm_runner: str,
    browser: Browser,
    fake_llm: FakeLLMServer,
    make_user: Callable[..., User],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.AERO_LLM_WAITS = True
    # The test process makes no model call itself: the server's runner makes them all.
    monkeypatch.setattr(job_enqueue, "run_pending_inline", lambda session_id: False)
    fake_llm.set_script(SCRIPT)
    fake_provider(fake_llm)
    chief = make_user("chief", "operator", "approver")
    page = sign_in(browser, asgi_server_with_llm_runner, chief)
    # The session's job runs here (inline) up to the specialists' waits; the server's
    # runner then streams their calls and its embedded workers carry the session on.
    session = start_from_bundle(chief, BUNDLE, {"producer": "t", "preferred_mode": "hierarchical"})
    runs = run_ids(session.pk)
    assert sorted(runs) == sorted(LAST_WORDS)
    page.goto(f"{asgi_server_with_llm_runner}/sessions/{session.pk}/")
    expect(page.locator("#live[ws-connect]")).to_be_visible()

    # While a specialist's call streams, its node shows the text so far, marked as
    # being written: pushed, never reloaded.
    writing = page.locator('.run-text[data-writing="true"]').first
    expect(writing).to_be_visible(timeout=30_000)
    seen, partial = writing.evaluate("el => [el.dataset.run, el.querySelector('pre').innerText]")
    assert int(seen) in runs.values() and partial

    # Each specialist's last words, in its own node; no node shows another's.
    for name, words in LAST_WORDS.items():
        expect(node_text(page, runs[name])).to_have_text(words, timeout=60_000)
    for name, run in runs.items():
        shown = node_text(page, run).inner_text()
        assert all(w not in shown for other, w in LAST_WORDS.items() if other != name)
    # What streamed into the node was the start of that specialist's own words.
    said = [
        e.payload["text"]
        for e in Event.objects.filter(session=session, type="llm.call", run_id=int(seen))
        if e.payload.get("text")
    ]
    assert any(text.startswith(partial) for text in said), (partial, said)

    # Replay's run tree shows each specialist's final text in its node (from the log).
    replay = sign_in(browser, asgi_server_with_llm_runner, chief, javascript=False)
    deadline = time.monotonic() + 60
    while not Event.objects.filter(session=session, type="finding.recorded").exists():
        assert time.monotonic() < deadline, "the session never concluded"
        time.sleep(0.2)
    replay.goto(f"{asgi_server_with_llm_runner}/replay/{session.pk}/")
    for name, words in LAST_WORDS.items():
        expect(replay.locator(f'.run-text[data-run="{runs[name]}"]')).to_have_text(words)
