"""The agent tree on the session page in a real browser (Debian Chromium through
Playwright, against daphne): it folds and unfolds, a run's progress arrives live, and a
push keeps the tree as the viewer folded it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Browser, expect

from diagnosis.events import append_event
from diagnosis.models import AgentRun, ToolCall, ToolCallStatus
from tests.browser_helpers import ARTIFACTS, sign_in
from tests.test_agent_tree import add_specialists
from tests.web_helpers import waiting_session

pytestmark = [pytest.mark.services, pytest.mark.browser]


def test_the_agent_tree_folds_and_follows_a_run_live(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    session = waiting_session(olga)
    runs = add_specialists(session)
    specialist, orchestrator = runs["specialist_0"], runs["orchestrator"]
    page = sign_in(browser, asgi_server, olga)
    page.goto(f"{asgi_server}/sessions/{session.pk}/")

    tree = page.get_by_test_id("agent-tree")
    running = tree.locator(f'li[data-run="{specialist.pk}"]')
    expect(running).to_be_visible()
    expect(running).to_contain_text("now: query_metrics")
    # the job's run, folded by the viewer: its steps hide
    job = tree.locator(f"details#run-{runs['root'].pk}")
    job.locator("> summary").click()
    expect(running).to_be_hidden()
    job.locator("> summary").click()
    expect(running).to_be_visible()
    # the orchestrator folded: a push re-renders it unfolded (a run below it runs), and
    # the page keeps it as the viewer left it
    tree.locator(f"details#run-{orchestrator.pk} > summary").click()
    expect(running).to_be_hidden()
    AgentRun.objects.filter(pk=specialist.pk).update(agent_name="specialist_logs")
    append_event(session.pk, "agent.note", {"text": "on it"}, producer="test", run=specialist)
    # the push arrived: the run is named in words now (its code in the tooltip)
    expect(running).to_contain_text("logs specialist")
    expect(running).to_be_hidden()

    ToolCall.objects.filter(agent_run=specialist).update(status=ToolCallStatus.COMPLETED)
    AgentRun.objects.filter(pk__in=[specialist.pk, orchestrator.pk]).update(
        status="completed", ended_at=timezone.now()
    )
    append_event(session.pk, "agent.note", {"text": "done"}, producer="test", run=specialist)

    expect(tree.locator(f'li[data-run="{orchestrator.pk}"]')).to_have_attribute(
        "data-status", "completed"
    )
    expect(tree.get_by_test_id("agent-tree-count")).not_to_contain_text("running")
    expect(running).to_be_hidden()  # still as the viewer folded it
    tree.locator(f"details#run-{orchestrator.pk} > summary").click()
    expect(running).to_have_attribute("data-status", "completed")
    expect(running).not_to_contain_text("now:")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "agent-tree.png"), full_page=True)
