"""Nothing unsafe renders (issue 7, item 1) and every text has a limit (item 2): report
Markdown escaped and sanitised, a Content Security Policy on every page, hostile strings
through every text input and every page and export that shows them, YAML bombs refused."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from aero.text import BIDI_CONTROLS
from approvals.actions import sweep_expired_approvals
from approvals.models import Approval, ManualTodo
from diagnosis.live_render import render_updates
from diagnosis.models import Event, Report, Session
from diagnosis.reporting import markdown_to_html, md_cell, md_escape, sanitize_html
from packs.airport.models import Restriction
from scenarios_admin.models import Scenario
from scenarios_admin.yamlio import load_yaml
from tests import hostile
from tests.test_views_airport import approve_lift
from tests.web_helpers import (
    NO_POSITION,
    STAND_FUEL_LEAK,
    approve_everything,
    login,
    make_session,
    waiting_session,
)

# Every hostile string at once: one text per input keeps the test short (about 700
# characters, under every limit but the lift note's).
HOSTILE = "\n".join(hostile.INERT.values())
# The lift note column holds 300 characters: the most dangerous ones.
HOSTILE_SHORT = " ".join(
    hostile.INERT[k] for k in ("script", "event", "md_js_link", "html_js_link", "rtl")
)


def assert_all_shown(html: str, values: list[str], *, where: str) -> None:
    missing = [v for v in values if not hostile.shown(v, html)]
    assert missing == [], f"{where}: lost {missing}"


# --- Markdown: escaping and sanitising -------------------------------------------------


def test_md_cell_keeps_user_text_inside_its_table_cell() -> None:
    table = "| tool | reason |\n|---|---|\n| close_stand | " + md_cell("a | b\n# c") + " |\n"
    html = markdown_to_html(table)
    assert html.count("<td>") == 2  # the | and the newline did not make cells or rows
    assert "<h1>" not in html
    assert "a | b # c" in html


@pytest.mark.parametrize(
    ("text", "forbidden"),
    [
        ("[link](javascript:alert(3))", "<a"),
        ("![x](javascript:alert(3))", "<img"),
        ("<script>alert(1)</script>", "<script"),
        ("<http://evil.example/>", "<a"),
        ("**bold** _em_ `code`", "<strong"),
        ("1. not a list", "<ol"),
        ("2) not a list", "<ol"),
        ("- not a list", "<ul"),
        ("+ not a list", "<ul"),
        ("---", "<hr"),
        ("> not a quote", "<blockquote"),
    ],
)
def test_md_escape_shows_markdown_as_typed(text: str, forbidden: str) -> None:
    for escape in (md_escape, md_cell):
        html = markdown_to_html(escape(text))
        assert forbidden not in html
        # What the reader sees is exactly what was typed.
        assert hostile.page_text(html) == text


def test_md_escape_leaves_plain_identifiers_readable() -> None:
    assert md_escape("lookup_flight_plan CA1234 105") == "lookup_flight_plan CA1234 105"
    assert md_cell("invoice\u202egnp.exe") == "invoice\\[U+202E\\]gnp.exe"
    assert md_escape("a\nb") == "a\nb"
    assert md_cell("a\r\nb") == "a b"
    # Digits then a hyphen start no list: dates and ids in the export read as typed.
    assert md_cell("2026-11-25 10:40") == "2026-11-25 10:40"
    assert md_cell("85533151-3817-4d0d") == "85533151-3817-4d0d"


@pytest.mark.parametrize(
    "markdown",
    [
        "[a](javascript:alert(1))",
        "[a](JaVaScRiPt:alert(1))",
        "[a](data:text/html,<script>alert(1)</script>)",
        "[a](vbscript:msgbox(1))",
        '<a href="javascript:alert(1)">a</a>',
        '<img src=x onerror="alert(1)">',
        '<svg onload="alert(1)"></svg>',
        "<style>body{background:url(javascript:x)}</style>",
        '<p style="width:expression(alert(1))">x</p>',
        "<iframe src=https://example.org></iframe>",
    ],
)
def test_markdown_to_html_removes_everything_that_runs(markdown: str) -> None:
    # Even Markdown that did not go through md_escape (a scenario's own report template).
    html = markdown_to_html(markdown)
    assert hostile.inert_problems(html) == []
    assert "<a href" not in html and "<svg" not in html and "<iframe" not in html


def test_markdown_to_html_keeps_safe_links_and_tables() -> None:
    html = markdown_to_html("[docs](https://example.org/x) and a table\n\n| a |\n|---|\n| 1 |\n")
    assert '<a href="https://example.org/x" rel="noopener noreferrer nofollow">docs</a>' in html
    assert "<table>" in html and "<td>1</td>" in html


@pytest.mark.parametrize(
    "href", ["//evil.example/x", " //evil.example", "\\\\evil.example", "/\\evil.example"]
)
def test_the_sanitiser_refuses_links_to_another_host_without_a_scheme(href: str) -> None:
    assert "evil.example" not in sanitize_html(f'<a href="{href}">x</a>')
    assert "evil.example" not in markdown_to_html("[x](//evil.example/x)")
    # Links within the site stay.
    assert 'href="/sessions/"' in sanitize_html('<a href="/sessions/">here</a>')


# --- Content Security Policy ----------------------------------------------------------


@pytest.mark.services
def test_every_page_has_a_strict_content_security_policy(
    builtin: None, alice: User, make_user: Callable[..., User]
) -> None:
    root = User.objects.create_superuser("root", password="pw-for-tests")
    session = make_session(alice)
    pages = {
        None: ["/accounts/login/"],
        alice: [
            "/sessions/",
            f"/sessions/{session.pk}/",
            f"/sessions/{session.pk}/events/",
            "/airport/",
            "/approvals/todos/",
        ],
        root: ["/admin/", "/admin/scenarios_admin/scenario/", "/approvals/"],
    }
    for user, urls in pages.items():
        client = login(user)
        for url in urls:
            response = client.get(url)
            assert response.status_code == 200, url
            policy = response.headers["Content-Security-Policy"]
            directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
            assert directives["default-src"] == "'self'", url
            assert directives["object-src"] == "'none'" and directives["base-uri"] == "'none'"
            assert directives["frame-ancestors"] == "'none'"
            for name in ("script-src", "style-src"):
                assert "unsafe-inline" not in directives[name], url
                assert "unsafe-eval" not in directives[name], url
            html = response.content.decode()
            assert " onchange=" not in html and " onsubmit=" not in html and " onclick=" not in html
            if "htmx-config" in html:
                assert '"allowEval": false' in html and '"includeIndicatorStyles": false' in html


# --- hostile strings through every input ----------------------------------------------


@pytest.mark.services
def test_hostile_message_and_answer_render_inert_everywhere(builtin: None, alice: User) -> None:
    client = login(alice)
    oil_spill = Scenario.objects.get(slug="oil_spill")
    response = client.post(
        "/sessions/new/", {"scenario": oil_spill.pk, "message": NO_POSITION + "\n" + HOSTILE}
    )
    assert response.status_code == 302
    session = Session.objects.get()
    answer = client.post(f"/sessions/{session.pk}/answer/", {"message": HOSTILE})
    assert answer.status_code == 302
    assert Event.objects.filter(session=session, type="user.message").count() == 2

    values = list(hostile.INERT.values())
    for url in (f"/sessions/{session.pk}/", f"/sessions/{session.pk}/events/", "/sessions/"):
        html = client.get(url).content.decode()
        assert hostile.inert_problems(html) == [], url
        if url != "/sessions/":  # the list shows the title: the message's first line
            assert_all_shown(html, values, where=url)


# Every bidirectional control: embeddings and overrides, isolates, the marks.
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f"


@pytest.mark.services
def test_bidi_controls_never_reach_a_page_raw(builtin: None, alice: User, carol: User) -> None:
    """A title and a chat message holding every bidirectional control: each page, live
    fragment and the history show them as code points, never as the characters that
    would reorder what surrounds them ("invoice\u202egnp.exe" reading "invoiceexe.png")."""
    client = login(alice)
    oil_spill = Scenario.objects.get(slug="oil_spill")
    title = f"CA1234 105 invoice\u202egnp.exe {BIDI}"
    assert (
        client.post("/sessions/new/", {"scenario": oil_spill.pk, "message": title}).status_code
        == 302
    )
    session = Session.objects.get()
    update = client.post(f"/sessions/{session.pk}/update/", {"text": f"chat \u2067exe.gnp {BIDI}"})
    assert update.status_code == 302
    assert Session.objects.get().title.startswith("CA1234 105 invoice\u202e")  # stored as typed
    logged = json.dumps(
        [e.payload for e in Event.objects.filter(session=session)], ensure_ascii=False
    )
    assert "chat \u2067exe.gnp" in logged  # the log keeps what was typed

    pages = {
        url: login(user).get(url).content.decode()
        for user in (alice, carol)
        for url in (
            f"/sessions/{session.pk}/",
            f"/sessions/{session.pk}/events/",
            "/sessions/",
            "/history/",
            "/history/?q=invoice",
        )
    }
    update_frames = render_updates(frozenset({"auditor"}), session.pk, 0, composer_key="")
    assert update_frames is not None
    pages["live fragments"] = update_frames.html
    raw = [url for url, html in pages.items() if BIDI_CONTROLS.search(html)]
    assert raw == []
    session_page = pages[f"/sessions/{session.pk}/"]
    assert "invoice[U+202E]gnp.exe" in session_page  # the title, readable as typed
    assert "chat [U+2067]exe.gnp" in session_page  # the chat message
    assert "invoice[U+202E]gnp.exe" in pages["/history/"]


@pytest.mark.services
def test_hostile_decision_reasons_render_inert_on_the_page_and_in_the_report(
    builtin: None, alice: User, bob: User
) -> None:
    session = waiting_session(alice, STAND_FUEL_LEAK)
    client = login(bob)
    approvals = list(Approval.objects.filter(session=session).order_by("pk"))
    rejected = approvals[0]
    response = client.post(
        f"/approvals/{rejected.pk}/decide/",
        {"decision": "reject", "reason": HOSTILE, "digest": rejected.digest},
    )
    assert response.status_code == 302
    for approval in approvals[1:]:
        while True:
            approval.refresh_from_db()
            if not approval.is_open:
                break
            step = "confirm" if approval.status == "confirming" else "approve"
            client.post(
                f"/approvals/{approval.pk}/decide/",
                {"decision": step, "reason": HOSTILE, "digest": approval.digest},
            )
    session.refresh_from_db()
    assert session.status == "completed"
    report = Report.objects.get(session=session)

    values = list(hostile.INERT.values())
    page = client.get(f"/sessions/{session.pk}/").content.decode()
    assert hostile.inert_problems(page) == []
    assert_all_shown(page, values, where="session page")
    # The report section: a link, a heading or a broken table would show here.
    report_html = markdown_to_html(report.markdown)
    assert hostile.inert_problems(report_html) == []
    assert "<a" not in report_html and "<h1>" not in report_html.split("</h1>", 1)[1]
    # The action rows (named by their words now): those with a risk class needing approval.
    rows = [r for r in report_html.split("<tr>") if "<td" in r and ("R1" in r or "R2" in r)]
    assert rows and all(r.count("<td") == 5 for r in rows)  # tool, args, class, decision, status
    in_report = [v for k, v in hostile.INERT.items() if k != "rtl"]
    assert_all_shown(report_html, in_report, where="report")
    assert hostile.shown("invoice[U+202E]gnp.exe", report_html)  # visible, not reordering
    # The exported Markdown: the same text, escaped so no viewer makes a link of it (in
    # the session's language when asked for it: as logged).
    export = client.get(f"/sessions/{session.pk}/report.md?lang=zh").content.decode()
    assert export == report.markdown
    assert re.search(r"(?<!\\)\]\(", export) is None  # every "](" is escaped: no link
    assert "\\[click me\\](javascript:" in export


@pytest.mark.services
def test_hostile_cancel_lift_and_todo_notes_render_inert(
    builtin: None, bob: User, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    client = login(olga)
    values = list(hostile.INERT.values())

    canceled = make_session(olga)
    client.post(f"/sessions/{canceled.pk}/cancel/", {"reason": HOSTILE})
    canceled.refresh_from_db()
    assert canceled.status == "canceled"
    page = client.get(f"/sessions/{canceled.pk}/").content.decode()
    assert hostile.inert_problems(page) == []
    assert_all_shown(page, values, where="canceled session")

    session = waiting_session(olga)
    crew = Approval.objects.get(session=session, action_name="dispatch_cleanup_crew")
    Approval.objects.filter(pk=crew.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    sweep_expired_approvals()
    todo = ManualTodo.objects.get()
    client.post(f"/approvals/todos/{todo.pk}/resolve/", {"note": HOSTILE})
    todo.refresh_from_db()
    assert todo.note == HOSTILE.strip()
    for url in ("/approvals/todos/", f"/sessions/{session.pk}/"):
        html = client.get(url).content.decode()
        assert hostile.inert_problems(html) == [], url
        assert_all_shown(html, values, where=url)

    approve_everything(session, bob)
    restriction = Restriction.objects.filter(session=session).first()
    assert restriction is not None
    client.post(f"/airport/restrictions/{restriction.pk}/lift/", {"note": HOSTILE_SHORT})
    # Lifting is an R2 action: the note shows once an approver has decided it.
    approve_lift(restriction, bob)
    restriction.refresh_from_db()
    assert restriction.lift_note == HOSTILE_SHORT
    short = HOSTILE_SHORT.split(" ")
    for url in ("/airport/", f"/sessions/{session.pk}/"):
        html = client.get(url).content.decode()
        assert hostile.inert_problems(html) == [], url
        assert hostile.shown(HOSTILE_SHORT, html), (url, short)


@pytest.mark.services
def test_invalid_utf8_in_a_form_post_is_shown_as_replacement_characters(
    builtin: None, alice: User
) -> None:
    client = login(alice)
    oil_spill = Scenario.objects.get(slug="oil_spill")
    body = f"scenario={oil_spill.pk}&message=CA1234+105%E6%9C%BA%E4%BD%8D+%FF%FE+leak".encode()
    response = client.post("/sessions/new/", body, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 302
    message = Event.objects.get(type="user.message").payload["text"]
    assert message == "CA1234 105机位 \ufffd\ufffd leak"


# --- limits: refused with a clear message, nothing cut, nothing stored ------------------


@pytest.mark.services
@pytest.mark.parametrize(
    ("text", "message"),
    [
        (hostile.ONE_MB, "too long: 1048576 characters, at most"),
        ("x" * 4001, "too long: 4001 characters, at most 4000 characters"),
        (hostile.NUL, "Null characters are not allowed"),
    ],
)
def test_a_message_or_answer_over_the_limit_is_refused_and_kept_in_the_form(
    builtin: None, alice: User, text: str, message: str
) -> None:
    client = login(alice)
    oil_spill = Scenario.objects.get(slug="oil_spill")
    response = client.post("/sessions/new/", {"scenario": oil_spill.pk, "message": text})
    assert response.status_code == 400
    html = response.content.decode()
    assert message in html
    assert not Session.objects.exists()
    assert 'maxlength="' not in html  # a browser would cut a long paste without a word
    if len(text) < 10_000:
        assert text.replace("\x00", "") in html.replace("\x00", "")  # kept to be edited

    asking = make_session(alice, NO_POSITION)
    before = Event.objects.filter(session=asking).count()
    answer = client.post(
        f"/sessions/{asking.pk}/answer/", {"message": text}, headers={"HX-Request": "true"}
    )
    assert answer.status_code == 400 and message in answer.content.decode()
    assert Event.objects.filter(session=asking).count() == before


@pytest.mark.services
@pytest.mark.parametrize(
    ("text", "message"),
    [
        (hostile.ONE_MB, "The reason is too long: 1048576 characters, at most 2000 characters"),
        (hostile.NUL, "The reason contains a NUL character"),
    ],
)
def test_a_decision_or_cancel_reason_over_the_limit_is_refused(
    builtin: None, alice: User, bob: User, text: str, message: str
) -> None:
    session = waiting_session(alice)
    approval = Approval.objects.filter(session=session).order_by("pk").first()
    assert approval is not None
    events = Event.objects.filter(session=session).count()
    response = login(bob).post(
        f"/approvals/{approval.pk}/decide/",
        {"decision": "reject", "reason": text, "digest": approval.digest},
        follow=True,
    )
    assert message in response.content.decode()
    approval.refresh_from_db()
    assert approval.is_open
    response = login(alice).post(f"/sessions/{session.pk}/cancel/", {"reason": text}, follow=True)
    assert message in response.content.decode()
    session.refresh_from_db()
    assert session.status == "waiting_user"
    assert Event.objects.filter(session=session).count() == events


@pytest.mark.services
def test_notes_over_their_limit_are_refused_not_cut(
    builtin: None, bob: User, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    session = waiting_session(olga)
    client = login(olga)
    crew = Approval.objects.get(session=session, action_name="dispatch_cleanup_crew")
    Approval.objects.filter(pk=crew.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    sweep_expired_approvals()
    approve_everything(session, bob)
    restriction = Restriction.objects.filter(session=session).first()
    assert restriction is not None
    response = client.post(
        f"/airport/restrictions/{restriction.pk}/lift/", {"note": "y" * 301}, follow=True
    )
    assert "The note is too long: 301 characters, at most 300 characters" in (
        response.content.decode()
    )
    restriction.refresh_from_db()
    assert restriction.lifted_at is None and restriction.lift_note == ""

    todo = ManualTodo.objects.get()
    response = client.post(
        f"/approvals/todos/{todo.pk}/resolve/", {"note": hostile.ONE_MB}, follow=True
    )
    assert "The note is too long: 1048576 characters, at most 2000 characters" in (
        response.content.decode()
    )
    todo.refresh_from_db()
    assert todo.is_open and todo.note == ""


@pytest.mark.services
def test_no_event_can_outgrow_the_websocket_frame(builtin: None, alice: User, bob: User) -> None:
    # Every input at its limit, in the widest characters: the events stay far below
    # daphne's 1 MB frame (a 1 MB reason used to break every catch-up with 1011).
    from aero.text import MAX_EVENT_BYTES, MAX_MESSAGE, MAX_REASON

    session = waiting_session(alice, STAND_FUEL_LEAK + "。" * (MAX_MESSAGE - 40))
    approval = Approval.objects.filter(session=session).order_by("pk").first()
    assert approval is not None
    login(bob).post(
        f"/approvals/{approval.pk}/decide/",
        {"decision": "reject", "reason": "😀" * MAX_REASON, "digest": approval.digest},
    )
    rejected = Event.objects.get(session=session, type="approval.rejected")
    assert rejected.payload["reason"] == "😀" * MAX_REASON
    sizes = [
        len(json.dumps(e.payload, ensure_ascii=False).encode())
        for e in Event.objects.filter(session=session)
    ]
    assert max(sizes) <= MAX_EVENT_BYTES < 1024 * 1024


# --- YAML: anchors, aliases and bombs -------------------------------------------------


@pytest.mark.parametrize("text", [hostile.YAML_ANCHOR, hostile.YAML_BOMB])
def test_yaml_anchors_and_aliases_are_refused_with_their_line(text: str) -> None:
    data, problems = load_yaml(text)
    assert data is None
    assert len(problems) == 1 and problems[0].line == 1
    assert "are not allowed in scenario files" in problems[0].message


def test_yaml_nesting_bombs_and_huge_files_are_refused() -> None:
    assert "nested too deeply" in load_yaml("[" * 50_000)[1][0].message
    assert "too large" in load_yaml("a: " + "x" * 600_000)[1][0].message
    assert "NUL" in load_yaml("a: b\nc: \x00")[1][0].message


@pytest.mark.services
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (hostile.YAML_BOMB.encode(), "YAML anchors (&amp;name, *name) are not allowed"),
        (b"slug: \xff\xfe oil", "The file is not UTF-8 text. Nothing was changed."),
        (hostile.YAML_ANCHOR.encode(), "line 1: (file): not valid YAML"),
    ],
)
def test_admin_yaml_import_refuses_hostile_files_with_a_clear_message(
    builtin: None, content: bytes, message: str
) -> None:
    root = login(User.objects.create_superuser("root", password="pw-for-tests"))
    draft_before = Scenario.objects.get(slug="oil_spill").name_zh
    upload = SimpleUploadedFile("evil.yaml", content, "application/yaml")
    response = root.post("/admin/scenarios_admin/scenario/import/", {"file": upload})
    assert response.status_code == 200
    html = response.content.decode()
    assert message in html
    assert "<script>x" not in html
    assert Scenario.objects.get(slug="oil_spill").name_zh == draft_before


@pytest.mark.services
def test_admin_scenario_text_fields_have_a_limit(builtin: None) -> None:
    from scenarios_admin.admin_forms import MAX_DRAFT_TEXT, ScenarioForm

    scenario = Scenario.objects.get(slug="oil_spill")
    form = ScenarioForm(instance=scenario)
    data = {name: form.initial.get(name) for name in form.fields}
    data = {k: v for k, v in data.items() if v is not None}
    data["report_template_en"] = "x" * (MAX_DRAFT_TEXT + 1)
    bound = ScenarioForm(data=data, instance=scenario)
    assert not bound.is_valid()
    assert f"Too long ({MAX_DRAFT_TEXT + 1:,} characters" in str(bound.errors)


def test_the_inert_check_catches_what_it_names() -> None:
    # The check the tests above rely on would see a script, a handler or a bad link.
    assert hostile.inert_problems("<p>ok</p><script>x</script>") == [
        "an inline <script>",
        "script content",
    ]
    assert hostile.inert_problems('<a href=" javascript:x">a</a>') != []
    assert hostile.inert_problems('<b onclick="x">a</b>') != []
