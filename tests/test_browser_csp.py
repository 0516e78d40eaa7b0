"""Every page in Chromium under the Content Security Policy (issue 7, item 1): as each
role, with hostile strings in what the pages show, no page may trip the policy, raise a
script error or run anything a user typed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import RequestFactory
from django.urls import reverse
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from approvals.actions import do_decide, sweep_expired_approvals
from approvals.models import Approval, ManualTodo
from diagnosis.lifts import do_request_lift
from diagnosis.models import Session
from packs.airport.models import Flight, Restriction, Topology
from scenarios_admin.models import ProviderConfig, Scenario
from tests.browser_helpers import ARTIFACTS, sign_in
from tests.hostile import INERT
from tests.test_views_airport import approve_lift
from tests.web_helpers import NO_POSITION, approve_everything, make_session, waiting_session
from tools.models import McpServer, McpTool

pytestmark = [pytest.mark.services, pytest.mark.browser]

HOSTILE = " ".join(INERT.values())
# Recorded before any page script runs (Playwright's init scripts are outside the CSP).
WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " at " +
                    e.sourceFile + ":" + e.lineNumber);
});
"""


class Watcher:
    """Script errors and policy reports of one browser page."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        page.context.add_init_script(WATCH)
        page.on("pageerror", lambda exc: self.errors.append(f"script error: {exc}"))
        page.on("console", self._console)

    def _console(self, message: Any) -> None:
        where = (message.location or {}).get("url", "")
        if message.type == "error" and not where.endswith("/favicon.ico"):
            self.errors.append(f"console: {message.text} ({where})")

    def visit(self, url: str) -> list[str]:
        self.errors.clear()
        response = self.page.goto(url, wait_until="load")
        assert response is not None, url
        problems = [f"HTTP {response.status}"] if response.status >= 400 else []
        policy = response.headers.get("content-security-policy", "")
        if "default-src 'self'" not in policy:
            problems.append(f"no Content Security Policy ({policy!r})")
        # Give deferred scripts, htmx's start-up and the WebSocket a moment to run.
        self.page.wait_for_timeout(150)
        problems += self.page.evaluate("window.__csp || []")
        problems += self.errors
        if self.page.evaluate("typeof window.__xss") != "undefined":
            problems.append("a hostile string ran")
        return problems


def hostile_data(olga: User, abel: User) -> dict[str, Any]:
    """A waiting session (approvals in the queue), a completed one whose decisions and
    report carry hostile strings, an open and a resolved to-do, a lifted closure."""
    waiting = waiting_session(olga)
    asking = make_session(olga, NO_POSITION + " " + HOSTILE)
    done = waiting_session(olga, "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏 " + HOSTILE)
    crew = Approval.objects.get(session=done, action_name="dispatch_cleanup_crew")
    Approval.objects.filter(pk=crew.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    sweep_expired_approvals()
    first = Approval.objects.filter(session=done, status="pending").order_by("pk").first()
    assert first is not None
    do_decide(first.pk, abel, "reject", HOSTILE, digest=first.digest)
    approve_everything(done, abel)
    restriction = Restriction.objects.filter(session=done, lifted_at__isnull=True).first()
    assert restriction is not None
    do_request_lift(restriction.pk, olga, INERT["script"] + INERT["md_js_link"])
    approve_lift(restriction, abel, INERT["event"])
    done.refresh_from_db()
    assert done.status == "completed"
    # Provider fields as an admin could type them (shown on the provider admin pages).
    ProviderConfig.objects.create(
        name=INERT["event"][:80], kind="offline", model=INERT["script"], enabled=False
    )
    # An MCP server and a tool it listed, with texts a server could send (its change page
    # shows the tool's description and schemas).
    server = McpServer.objects.create(
        name="hostile", command="{python}", description=INERT["script"], args=[INERT["event"]]
    )
    McpTool.objects.create(
        server=server,
        name=INERT["event"],
        description=INERT["script"],
        input_schema={"description": INERT["script"] + INERT["event"]},
        discovered_at=timezone.now(),
    )
    return {"waiting": waiting, "asking": asking, "done": done}


# The add pages with forms of our own (the others are Django's stock forms).
ADD_PAGES = (Scenario, Topology, ProviderConfig, Flight, User, McpServer)


def admin_pages(user: User) -> list[str]:
    """Every admin list, the first object's change page, every add page the user may
    use, and the scenario pages of our own (import, diff, publish)."""
    request = RequestFactory().get("/admin/")
    request.user = user
    urls = ["/admin/"]
    for model, model_admin in admin.site._registry.items():
        meta = model._meta
        if not meta.managed:  # django_rq's dashboard entry: no table, its own pages
            continue
        base = f"admin:{meta.app_label}_{meta.model_name}"
        urls.append(reverse(f"{base}_changelist"))
        first = model._default_manager.order_by("pk").first()
        if first is not None:
            urls.append(reverse(f"{base}_change", args=[first.pk]))
        if model in ADD_PAGES and model_admin.has_add_permission(request):
            urls.append(reverse(f"{base}_add"))
    scenario = Scenario.objects.get(slug="oil_spill")
    urls += [
        reverse("admin:scenarios_admin_scenario_import"),
        reverse("admin:scenarios_admin_scenario_diff", args=[scenario.pk]),
        reverse("admin:scenarios_admin_scenario_publish", args=[scenario.pk]),
    ]
    return urls


def test_no_page_violates_the_content_security_policy(
    builtin: None,
    asgi_server: str,
    browser: Browser,
    make_user: Callable[..., User],
) -> None:
    olga = make_user("olga", "operator")
    abel = make_user("abel", "approver")
    cora = make_user("cora", "auditor")
    root = User.objects.create_superuser("root", password="pw-for-tests")
    data = hostile_data(olga, abel)
    done, asking, waiting = data["done"], data["asking"], data["waiting"]
    # Each page once at least, as a role that sees the most of it.
    pages = {
        olga: ["/sessions/", "/airport/", "/approvals/todos/", f"/sessions/{asking.pk}/"],
        abel: ["/approvals/", f"/sessions/{waiting.pk}/"],
        cora: [
            f"/sessions/{done.pk}/",
            f"/sessions/{done.pk}/events/",
            f"/replay/{done.pk}/",
            f"/replay/{done.pk}/?seq=5",
            "/history/",
            "/audit/",
        ],
        root: admin_pages(root),
    }
    failures: dict[str, list[str]] = {}

    anonymous = browser.new_context().new_page()
    watcher = Watcher(anonymous)
    if problems := watcher.visit(asgi_server + "/accounts/login/"):
        failures["anonymous /accounts/login/"] = problems
    anonymous.context.close()

    for user, urls in pages.items():
        page = sign_in(browser, asgi_server, user)
        watcher = Watcher(page)
        try:
            for url in urls:
                if problems := watcher.visit(asgi_server + url):
                    failures[f"{user.get_username()} {url}"] = problems
        except Exception:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"csp-{user.get_username()}.png"))
            raise
        finally:
            page.context.close()
    assert not failures, "\n".join(f"{page}: {problems}" for page, problems in failures.items())


def test_former_inline_handlers_still_work_under_the_policy(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    session = waiting_session(olga)
    page = sign_in(browser, asgi_server, olga)
    watcher = Watcher(page)
    try:
        assert watcher.visit(asgi_server + "/sessions/") == []
        # The status filter submits itself on change (was onchange="this.form.submit()").
        page.select_option("select[name=status]", "waiting_user")
        page.wait_for_url("**/sessions/?status=waiting_user")
        # Cancelling asks first (was onsubmit="return confirm(...)"): dismissed, nothing.
        assert watcher.visit(f"{asgi_server}/sessions/{session.pk}/") == []
        asked: list[str] = []

        def dismiss(dialog: Any) -> None:
            asked.append(dialog.message)
            dialog.dismiss()

        page.once("dialog", dismiss)
        page.click("text=Cancel session")
        page.wait_for_timeout(300)
        assert asked == ["Cancel this session?"]
        session.refresh_from_db()
        assert session.status == "waiting_user"
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("text=Cancel session")
        expect(page.get_by_test_id("session-status")).to_have_text("Canceled")
        assert Session.objects.get(pk=session.pk).status == "canceled"
        assert watcher.errors == [] and page.evaluate("window.__csp") == []
        assert ManualTodo.objects.count() == 0
    finally:
        page.context.close()
