"""Issue 12 in a real browser (Debian Chromium through Playwright, against daphne): the
scenario mismatch and the switch, correcting a fact, editing an action's arguments before
approving, the queue filter surviving a push, the airport board updating live, and a
400 px wide screen without sideways scrolling."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect

from approvals.actions import do_resolve_todo, do_timeout
from approvals.models import ManualTodo
from diagnosis.models import Event, Session
from tests.browser_helpers import ARTIFACTS, sign_in
from tests.web_helpers import STAND_FUEL_LEAK, approval_for, make_session, waiting_session

pytestmark = [pytest.mark.services, pytest.mark.browser]

TIRE_SMOKE = "MU5678 在跑道06/24起飞滑跑时爆胎，跑道上有轮胎碎片，有烟"


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"cockpit-{name}.png"), full_page=True)


def test_a_mismatched_scenario_is_flagged_and_switched_with_the_text(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    page = sign_in(browser, asgi_server, make_user("olga", "operator"))

    page.select_option("#id_scenario", label="Bird strike / 鸟击")
    page.fill("#id_message", TIRE_SMOKE)
    page.click("text=Open session")
    expect(page.get_by_test_id("scenario-suggestion")).to_contain_text("Tire burst")
    expect(page.locator("#id_message")).to_have_value(TIRE_SMOKE)  # nothing lost
    shot(page, "mismatch")
    page.get_by_test_id("switch-scenario").click()

    expect(page.locator("h1")).to_contain_text("MU5678")
    expect(page.locator("td[data-field=fire_or_smoke]")).to_contain_text("Fire or smoke")
    session = Session.objects.get()
    assert session.scenario.slug == "tire_burst"


def test_correcting_a_fact(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    session = make_session(olga, "CA1234 燃油泄漏，发动机运转，持续泄漏")
    page = sign_in(browser, asgi_server, olga)
    page.goto(f"{asgi_server}/sessions/{session.pk}/")
    # Facts are corrected while the agent collects them: wait until it asks.
    expect(page.get_by_test_id("question")).to_be_visible()

    correct = page.get_by_test_id("correct-fluid_type")
    correct.locator("summary").click()
    correct.locator("select[name=value]").select_option("HYDRAULIC")
    correct.locator("button").click()

    # The correction runs as a job on the server; the page it redirects to may be rendered
    # while the job writes, and must still get the corrected fact (by push if the page
    # predates it: tests/test_live_timeline.py, the race this test once lost).
    expect(page.locator("td[data-field=fluid_type]")).to_contain_text("Hydraulic fluid")
    # The timeline words the value in the page's language (English here).
    expect(page.locator("#timeline-list")).to_contain_text("Hydraulic fluid")
    # The agent asks in the session's language (the message was Chinese).
    expect(page.get_by_test_id("question")).not_to_contain_text("未能识别")


def test_editing_an_actions_arguments_before_approving(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    session = waiting_session(make_user("olga", "operator"), STAND_FUEL_LEAK)
    closure = approval_for(session, "close_taxiway", taxiway="A")
    page = sign_in(browser, asgi_server, make_user("abel", "approver"))
    page.goto(f"{asgi_server}/approvals/")

    card = page.locator(f"#approval-{closure.pk}")
    card.get_by_test_id("edit-args").locator("summary").click()
    card.locator("input[name=arg-taxiway]").fill("C")
    card.locator("input[name=edit_reason]").fill("A is the stand's only way out")
    card.locator("form.edit-args-form button").click()

    card = page.locator(f"#approval-{closure.pk}")
    expect(card).to_contain_text("taxiway=C")
    expect(card.get_by_test_id("plain-action")).to_have_text("Close taxiway C")
    card.locator("button[value=approve]").click()
    expect(page.locator(f"#approval-{closure.pk} button[value=confirm]")).to_be_visible()


def test_a_push_never_costs_an_approver_their_open_edit(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    session = waiting_session(olga, STAND_FUEL_LEAK)
    closure = approval_for(session, "close_taxiway", taxiway="A")
    page = sign_in(browser, asgi_server, make_user("abel", "approver"))
    page.goto(f"{asgi_server}/approvals/")
    items = page.locator("#approval-queue article.queue-item")
    expect(items).to_have_count(5)

    card = page.locator(f"#approval-{closure.pk}")
    card.get_by_test_id("edit-args").locator("summary").click()
    card.locator("input[name=arg-taxiway]").fill("C")
    card.locator("input[name=edit_reason]").fill("A is the stand's only way out")
    card.locator("input[name=reason]").fill("half-typed")
    waiting_session(olga, STAND_FUEL_LEAK)  # a push re-renders the whole queue

    expect(items).to_have_count(10)
    card = page.locator(f"#approval-{closure.pk}")
    expect(card.get_by_test_id("edit-args")).to_have_attribute("open", "")
    expect(card.locator("input[name=arg-taxiway]")).to_have_value("C")
    expect(card.locator("input[name=edit_reason]")).to_have_value("A is the stand's only way out")
    expect(card.locator("input[name=reason]")).to_have_value("half-typed")


def test_a_decision_pressed_as_a_push_arrives_is_taken(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    """A push that re-rendered the queue between the press and the release of "Approve"
    replaced the button, and the click reached nothing (seen in CI: the decision was not
    taken, the approver had to notice and click again). The push waits for the release."""
    olga = make_user("olga", "operator")
    abel = make_user("abel", "approver")
    session = waiting_session(olga, STAND_FUEL_LEAK)
    closure = approval_for(session, "close_taxiway", taxiway="A")
    page = sign_in(browser, asgi_server, abel)
    page.goto(f"{asgi_server}/approvals/")
    items = page.locator("#approval-queue article.queue-item")
    expect(items).to_have_count(5)
    card = page.locator(f"#approval-{closure.pk}")
    card.locator("input[name=reason]").fill("crew on scene confirms")
    button = card.locator("button[value=approve]")
    expect(button).to_be_visible()
    # A push may re-render the queue right now (none is held before the press): the
    # button is then away for a moment.
    box = None
    for _ in range(50):
        box = button.bounding_box()
        if box is not None:
            break
        page.wait_for_timeout(100)
    assert box is not None

    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    waiting_session(olga, STAND_FUEL_LEAK)  # a push re-renders the whole queue
    page.wait_for_selector("body[data-live-held]", state="attached")
    expect(items).to_have_count(5)  # held while the button is pressed
    page.mouse.up()

    # The press was a click: the first approval is recorded, with the typed reason.
    expect(page.locator(f"#approval-{closure.pk} button[value=confirm]")).to_be_visible()
    closure.refresh_from_db()
    assert (closure.status, closure.first_approved_by) == ("confirming", abel)
    first = Event.objects.get(session=session, type="approval.first_approved")
    assert first.payload["reason"] == "crew on scene confirms"
    # And the push that waited is on the page.
    expect(items).to_have_count(10)
    expect(page.locator("body[data-live-held]")).to_have_count(0)


def test_the_queue_filter_survives_a_push(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    waiting_session(olga, STAND_FUEL_LEAK)
    page = sign_in(browser, asgi_server, make_user("abel", "approver"))
    page.goto(f"{asgi_server}/approvals/")

    page.select_option("select[name=risk]", "R2")
    items = page.locator("#approval-queue article.queue-item")
    expect(items).to_have_count(3)  # suspend stand 105, close taxiways A and B
    waiting_session(olga, STAND_FUEL_LEAK)  # a push: three more R2 and two R1 are open

    expect(items).to_have_count(6)
    expect(page.locator("#approval-queue article[data-risk=R1]")).to_have_count(0)
    expect(page.locator("select[name=risk]")).to_have_value("R2")


def test_the_board_updates_live(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    from datetime import timedelta
    from unittest import mock

    from django.utils import timezone

    olga = make_user("olga", "operator")
    session = waiting_session(olga, STAND_FUEL_LEAK)
    closure = approval_for(session, "close_taxiway", taxiway="A")
    with mock.patch("django.utils.timezone.now", return_value=timezone.now() + timedelta(hours=1)):
        do_timeout(closure.pk)
    page = sign_in(browser, asgi_server, olga)
    page.goto(f"{asgi_server}/airport/")
    row = page.locator("#board-taxiways tr[data-target=A]")
    expect(row).to_contain_text("open")

    do_resolve_todo(ManualTodo.objects.get().pk, olga, "closed by phone", in_force=True)

    expect(row).to_contain_text("Taxiway closed")  # pushed, no reload


@pytest.mark.parametrize(
    "path", ["/sessions/", "session", "/approvals/", "/airport/", "/approvals/todos/"]
)
def test_a_400px_screen_never_scrolls_sideways(
    builtin: None,
    asgi_server: str,
    browser: Browser,
    make_user: Callable[..., User],
    path: str,
) -> None:
    olga = make_user("olga", "operator")
    session = waiting_session(olga, STAND_FUEL_LEAK)
    page = sign_in(browser, asgi_server, make_user("root", "admin"))
    page.set_viewport_size({"width": 400, "height": 900})
    page.goto(asgi_server + (f"/sessions/{session.pk}/" if path == "session" else path))

    width = page.evaluate("document.documentElement.scrollWidth")
    shot(page, "400px-" + path.strip("/").replace("/", "-"))
    assert width <= 400, f"{path} is {width} px wide at a 400 px viewport"


def test_time_left_counts_down_in_seconds_and_turns_red_in_the_last_minute(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from approvals.models import Approval

    session = waiting_session(make_user("olga", "operator"), STAND_FUEL_LEAK)
    crew = approval_for(session, "dispatch_cleanup_crew")
    Approval.objects.filter(pk=crew.pk).update(deadline=timezone.now() + timedelta(seconds=75))
    page = sign_in(browser, asgi_server, make_user("abel", "approver"))
    page.goto(f"{asgi_server}/approvals/")

    deadline = page.locator(f"#approval-{crew.pk} .deadline")
    expect(deadline).to_have_text(re.compile(r"times out in (6\d|7\d) s"))
    expect(deadline).not_to_have_class(re.compile("deadline-urgent"))
    expect(deadline).to_have_class(re.compile("deadline-urgent"), timeout=30_000)  # ticking
    expect(page).to_have_title(re.compile(r"^\(\d+\) "))


# Stand-ins that record what the page asks of the browser: notifications, sounds, and
# when its live socket is open (a push sent before that would not reach this page).
RECORDING = """
window.__notes = []; window.__sounds = []; window.__wsOpen = false;
class RecordedNotification {
  constructor(title, options) { window.__notes.push(title); }
}
RecordedNotification.permission = "granted";
RecordedNotification.requestPermission = () => Promise.resolve("granted");
window.Notification = RecordedNotification;
HTMLMediaElement.prototype.play = function () {
  window.__sounds.push(this.src); return Promise.resolve();
};
const RealSocket = window.WebSocket;
window.WebSocket = function (url, protocols) {
  const socket = new RealSocket(url, protocols);
  socket.addEventListener("open", () => { window.__wsOpen = true; });
  return socket;
};
window.WebSocket.prototype = RealSocket.prototype;
Object.assign(window.WebSocket, {CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3});
"""


def test_a_new_r2_request_raises_a_notification_and_a_sound(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    from aero.models import UserPreference

    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    page = sign_in(browser, asgi_server, abel)
    page.context.grant_permissions(["notifications"], origin=asgi_server)
    page.context.add_init_script(RECORDING)
    page.goto(f"{asgi_server}/approvals/")

    page.locator("[data-notify-enable]").click()  # opt in: stored on the preference
    expect(page.locator("[data-notify-on]")).to_be_visible()
    assert UserPreference.objects.get(user=abel).notify_risky
    page.wait_for_function("() => window.__wsOpen === true")
    waiting_session(olga, STAND_FUEL_LEAK)  # pushed: R1 and R2 requests

    page.wait_for_function("() => window.__notes.length > 0")
    notes = page.evaluate("window.__notes")
    assert notes and all(title.startswith("R2 · ") for title in notes), notes
    assert page.evaluate("window.__sounds")[0].endswith("/static/aero/notify.wav")


def test_notifications_stay_off_until_asked_and_the_choice_follows_the_user(
    builtin: None, asgi_server: str, browser: Browser, make_user: Callable[..., User]
) -> None:
    from aero.models import UserPreference

    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    page = sign_in(browser, asgi_server, abel)
    page.context.add_init_script(RECORDING)
    page.goto(f"{asgi_server}/approvals/")
    page.wait_for_function("() => window.__wsOpen === true")

    waiting_session(olga, STAND_FUEL_LEAK)
    expect(page.locator("#approval-queue article[data-risk=R2]").first).to_be_visible()
    assert page.evaluate("window.__notes") == []  # off: nothing raised

    UserPreference.objects.update_or_create(user=abel, defaults={"notify_risky": True})
    other = sign_in(browser, asgi_server, abel)  # another workstation: a new sign-in
    other.goto(f"{asgi_server}/approvals/")
    expect(other.locator("[data-notify-on]")).to_be_visible()
