"""The main flow in a real browser (Debian Chromium through Playwright) against daphne:
an operator opens an incident and answers the agent; an approver decides every action;
the operator's page shows the decisions and the report without a reload."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from approvals.models import Approval
from diagnosis.models import Session
from packs.airport.models import Restriction
from tests.browser_helpers import ARTIFACTS, reload_until, sign_in

pytestmark = [pytest.mark.services, pytest.mark.browser]


def test_create_answer_approve_and_read_the_report(
    builtin: None,
    asgi_server: str,
    browser: Browser,
    make_user: Callable[..., User],
    request: pytest.FixtureRequest,
) -> None:
    olga = make_user("olga", "operator")
    abel = make_user("abel", "approver")
    operator = sign_in(browser, asgi_server, olga)
    approver: Page | None = None
    try:
        operator.select_option("#id_scenario", label="Apron fluid spill / 机坪漏油")
        operator.fill("#id_message", "105机位燃油泄漏")
        operator.click("text=Open session")
        question = operator.get_by_test_id("question")
        expect(question).to_contain_text("航班号")
        operator.fill("#answer-input", "CA1234")
        operator.click("text=Answer")
        expect(question).to_contain_text("发动机")  # arrived over the WebSocket
        operator.fill("#answer-input", "发动机运转")
        operator.click("text=Answer")
        expect(question).to_contain_text("持续")
        operator.fill("#answer-input", "还在持续漏")
        operator.click("text=Answer")
        # the rule in words, its id in the tooltip
        expect(operator.get_by_test_id("risk")).to_contain_text("score 95")
        expect(operator.get_by_test_id("risk").locator('[title="rule OS-01"]')).to_be_attached()
        expect(operator.locator("#session-actions tbody tr")).to_have_count(6)
        expect(operator.get_by_test_id("session-status")).to_have_text("Waiting for people")
        # The operator sees the pending actions but cannot decide them.
        expect(operator.locator("#session-actions form.decide")).to_have_count(0)

        approver = sign_in(browser, asgi_server, abel)
        approver.goto(operator.url)
        decide = approver.locator("#session-actions form.decide")
        expect(decide).to_have_count(5)
        for _ in range(8):  # 2 x R1 once, 3 x R2 twice (approve, then confirm)
            if decide.count() == 0:
                break
            approval_id = str(decide.first.get_attribute("data-approval"))
            # This approval's form, whatever a live update does to the list's order.
            form = approver.locator(f'#session-actions form.decide[data-approval="{approval_id}"]')
            button = form.locator("button.primary")
            label = button.inner_text()
            status = Approval.objects.get(pk=approval_id).status
            # Recorded: the form is gone or asks for the next step.
            stepped = (
                "([id, label]) => { const b = document.querySelector("
                '`form[data-approval="${id}"] button.primary`);'
                " return !b || b.innerText !== label; }"
            )
            for _attempt in range(3):
                form.locator("input[name=reason]").fill("crew on scene confirms")
                button.click()
                try:
                    approver.wait_for_function(stepped, arg=[approval_id, label], timeout=8000)
                    break
                except PlaywrightTimeout:
                    # Still as it was on the server too: a live update moved the form after
                    # Playwright found the button and before it pressed (a push between the
                    # press and the release waits: aero.js). An approver clicks again.
                    # Otherwise the decision was taken and the page is only late.
                    if Approval.objects.get(pk=approval_id).status != status:
                        break
            approver.wait_for_function(stepped, arg=[approval_id, label])
        expect(decide).to_have_count(0)

        # No reload on the operator's side: decisions and the report were pushed.
        expect(operator.get_by_test_id("session-status")).to_have_text("Completed")
        report = operator.get_by_test_id("report")
        expect(report).to_contain_text("OS-01")
        expect(report).to_contain_text("HU7601")
        expect(operator.locator("#timeline-list")).to_contain_text("abel approved")
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        operator.screenshot(
            path=str(ARTIFACTS / f"{request.node.name}-operator.png"), full_page=True
        )
        if approver is not None:
            approver.screenshot(
                path=str(ARTIFACTS / f"{request.node.name}-approver.png"), full_page=True
            )
        raise

    session = Session.objects.get()
    assert session.status == "completed"
    closed = sorted(Restriction.objects.values_list("kind", "target"))
    assert closed == [("stand", "105"), ("taxiway", "A"), ("taxiway", "B")]


def test_approver_queue_updates_live_and_operator_sees_decisions(
    builtin: None,
    asgi_server: str,
    browser: Browser,
    make_user: Callable[..., User],
    request: pytest.FixtureRequest,
) -> None:
    olga = make_user("olga", "operator")
    abel = make_user("abel", "approver")
    approver = sign_in(browser, asgi_server, abel)
    operator = sign_in(browser, asgi_server, olga)
    try:
        approver.goto(asgi_server + "/approvals/")
        expect(approver.get_by_test_id("queue-empty")).to_be_visible()

        operator.select_option("#id_scenario", label="Apron fluid spill / 机坪漏油")
        operator.fill(
            "#id_message",
            "MU5678 stand 101 hydraulic leak, engines off, no longer leaking, about 2 m2",
        )
        operator.click("text=Open session")
        expect(operator.get_by_test_id("session-status")).to_have_text("Waiting for people")

        items = approver.locator("#approval-queue article.queue-item")
        expect(items).to_have_count(2)  # arrived without a reload: R2 taxiway A, R1 crew
        expect(items.first).to_have_attribute("data-risk", "R2")
        expect(items.first).to_contain_text("taxiway=A")

        # R2 first: approve, then confirm the exact action.
        items.first.locator("button[value=approve]").click()
        expect(items.first.locator("button[value=confirm]")).to_be_visible()
        items.first.locator("button[value=confirm]").click()
        expect(items).to_have_count(1)
        items.first.locator("input[name=reason]").fill("no crew free, airline handles it")
        items.first.locator("button[value=reject]").click()
        expect(approver.get_by_test_id("queue-empty")).to_be_visible()

        timeline = operator.locator("#timeline-list")
        expect(timeline).to_contain_text("abel approved Close taxiway")
        expect(timeline).to_contain_text("abel rejected Dispatch the cleanup crew")
        expect(timeline).to_contain_text("no crew free")
        expect(operator.get_by_test_id("session-status")).to_have_text("Completed")
        expect(operator.get_by_test_id("report")).to_contain_text("rejected")
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        operator.screenshot(
            path=str(ARTIFACTS / f"{request.node.name}-operator.png"), full_page=True
        )
        approver.screenshot(
            path=str(ARTIFACTS / f"{request.node.name}-approver.png"), full_page=True
        )
        raise


def test_a_typed_reason_survives_a_pushed_update(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    from approvals.actions import APPROVE, do_decide
    from tests.web_helpers import approval_for as approval
    from tests.web_helpers import waiting_session

    session = waiting_session(make_user("olga", "operator"))
    abel, bea = make_user("abel", "approver"), make_user("bea", "approver")
    page = sign_in(browser, asgi_server, abel)
    page.goto(f"{asgi_server}/sessions/{session.pk}/")
    closure = approval(session, "close_taxiway", taxiway="B")
    reason = page.locator(f'form[data-approval="{closure.pk}"] input[name=reason]')
    reason.fill("taxiway B is upwind and dry")

    crew = approval(session, "dispatch_cleanup_crew")
    do_decide(
        crew.pk, bea, APPROVE, digest=crew.digest
    )  # another approver: the actions panel is pushed again

    expect(page.locator("#timeline-list")).to_contain_text("bea approved Dispatch the cleanup crew")
    expect(page.locator(f"#action-{crew.tool_call_id}")).to_contain_text("Completed")
    expect(reason).to_have_value("taxiway B is upwind and dry")


def test_the_main_flow_works_without_javascript(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    """Plain forms and reloads: create, answer, decide every action, read the report."""
    operator = sign_in(browser, asgi_server, make_user("olga", "operator"), javascript=False)
    approver = sign_in(browser, asgi_server, make_user("abel", "approver"), javascript=False)

    operator.select_option("#id_scenario", label="Apron fluid spill / 机坪漏油")
    operator.fill("#id_message", "MU5678 stand 101 hydraulic leak, engines off")
    with operator.expect_navigation():
        operator.click("text=Open session")
    question = operator.get_by_test_id("question")
    reload_until(operator, lambda: question.count() == 1)
    expect(question).to_contain_text("leaking")
    operator.fill("#answer-input", "no")
    with operator.expect_navigation():
        operator.click("text=Answer")

    waiting = operator.locator("#session-actions tr.action-awaiting_approval")
    status = operator.get_by_test_id("session-status")
    reload_until(
        operator,
        lambda: status.inner_text().strip() == "Waiting for people" and waiting.count() == 2,
    )

    approver.goto(operator.url)
    forms = approver.locator("#session-actions form.decide")
    for _ in range(4):  # R2 taxiway A: approve, then confirm; R1 crew: approve
        if forms.count() == 0:
            break
        forms.first.locator("input[name=reason]").fill("crew on scene confirms")
        with approver.expect_navigation():  # a plain POST, redirected back to the page
            forms.first.locator("button.primary").click()
    expect(forms).to_have_count(0)
    expect(approver.locator("#timeline-list")).to_contain_text("abel approved Close taxiway")

    reload_until(operator, lambda: status.inner_text().strip() == "Completed")
    expect(operator.get_by_test_id("report")).to_contain_text("MU5678")
    operator.goto(asgi_server + "/airport/")
    taxiway_a = operator.locator('#board-taxiways tr[data-target="A"]')
    expect(taxiway_a).to_have_class("closed")
    taxiway_a.locator("input[name=note]").fill("spill cleaned, taxiway inspected")
    with operator.expect_navigation():
        taxiway_a.locator("text=Request lift").click()
    # Lifting is an R2 action of its own: requested here, decided in the approval queue.
    expect(taxiway_a).to_have_class("closed")
    expect(taxiway_a.get_by_test_id("lift-pending")).to_contain_text("Lift requested by olga")

    approver.goto(asgi_server + "/approvals/")
    lift = approver.locator('article[data-tool="lift_restriction"]')
    for label in ("Approve (1 of 2)", "Confirm (2 of 2)"):
        with approver.expect_navigation():
            lift.get_by_role("button", name=label).click()
    expect(approver.get_by_test_id("queue-empty")).to_be_visible()

    # The approved lift is sent by a thread of the server after the decision's response;
    # without JavaScript nothing is pushed, so a person reloads until it is done (one
    # reload right after the decision raced that thread and failed on a loaded machine).
    reload_until(operator, lambda: taxiway_a.get_attribute("class") == "open")
    expect(taxiway_a).to_have_class("open")
    expect(operator.locator("body")).to_contain_text("spill cleaned, taxiway inspected")


def test_an_answer_after_the_sign_in_ran_out_stays_typed_and_says_why(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    """The sign-in runs out while the operator types: the answer is not sent, the box
    keeps it, the page says why and offers the sign-in (not the sign-in page in the box)."""
    from diagnosis.models import Event
    from tests.web_helpers import NO_POSITION, make_session

    olga = make_user("olga", "operator")
    session = make_session(olga, NO_POSITION)
    events = Event.objects.filter(session=session).count()
    page = sign_in(browser, asgi_server, olga)
    page.goto(f"{asgi_server}/sessions/{session.pk}/")
    page.context.clear_cookies(name="sessionid")  # what the idle sign-out leaves
    page.fill("#answer-input", "105机位")
    page.click("#session-composer button[type=submit]")

    note = page.get_by_test_id("signed-out")
    expect(note).to_contain_text("You were signed out: this was not sent")
    expect(note.locator("a")).to_have_attribute(
        "href", f"/accounts/login/?next=/sessions/{session.pk}/"
    )
    expect(page.locator("#answer-input")).to_have_value("105机位")
    expect(page.locator("#session-composer input[name=username]")).to_have_count(0)
    assert Event.objects.filter(session=session).count() == events
