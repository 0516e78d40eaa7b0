"""Hostile strings through every scenario draft text input and every provider field in
admin (issue 7, item 1): each is either kept exactly and shown as text wherever it
appears (admin pages, the publish diff, session pages, the report and its Markdown, the
replay export), or refused with a message on its field, the typed value kept in the form
and nothing saved."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from aero.text import neutralise_bidi
from diagnosis.models import Report, Session
from packs.airport.models import ScenarioExample
from scenarios_admin.models import FieldValue, ProviderConfig, Scenario, ScenarioField
from scenarios_admin.probe import NO_ANSWER
from tests import hostile
from tests.admin_helpers import admin_client, form_data, row_prefix
from tests.web_helpers import login, make_session

pytestmark = pytest.mark.services
VALUES = list(hostile.INERT.values())
HOSTILE = "\n".join(VALUES)
# Draft inputs that take free text of any length (up to MAX_DRAFT_TEXT): the whole
# corpus at once. Row inputs are named by (inline prefix, key column, key, column).
LONG_INPUTS: list[str | tuple[str, str, str, str]] = [
    "system_prompt",
    "report_template_zh",
    "report_template_en",
    ("draft_fields", "name", "flight_no", "ask_zh"),
    ("draft_fields", "name", "flight_no", "ask_en"),
    ("draft_values", "value", "FUEL", "synonyms"),
    ("draft_values", "value", "FUEL", "fallback"),
    ("draft_examples", "#", "0", "text"),
]
# Short single-line inputs people read (names and labels, at most 120 characters): one
# hostile string each per save, rotated until each string has been in each input.
SHORT_INPUTS: list[str | tuple[str, str, str, str]] = [
    "name_zh",
    "name_en",
    *[("draft_fields", "name", f, "label_zh") for f in ("flight_no", "position", "fluid_type")],
    ("draft_fields", "name", "flight_no", "label_en"),
    ("draft_values", "value", "FUEL", "label_zh"),
    ("draft_values", "value", "FUEL", "label_en"),
]


@pytest.fixture
def root(builtin: None) -> Client:
    return admin_client(User.objects.create_superuser("root", password="pw-for-tests"))


def oil_spill() -> Scenario:
    return Scenario.objects.get(slug="oil_spill")


def change_url() -> str:
    return f"/admin/scenarios_admin/scenario/{oil_spill().pk}/change/"


def page_data(client: Client) -> dict[str, Any]:
    data = form_data(client.get(change_url()).content.decode(), "scenario_form")
    data["_save"] = "Save"
    return data


def input_name(data: dict[str, Any], spec: str | tuple[str, str, str, str]) -> str:
    if isinstance(spec, str):
        return spec
    prefix, key_column, key, column = spec
    if key_column == "#":  # the row at this index
        return f"{prefix}-{key}-{column}"
    return f"{row_prefix(data, prefix, key_column, key)}-{column}"


def stored(spec: str | tuple[str, str, str, str]) -> str:
    """What the draft holds for an input, read from the database."""
    scenario = oil_spill()
    if isinstance(spec, str):
        return str(getattr(scenario, spec))
    prefix, _, key, column = spec
    if prefix == "draft_fields":
        return str(getattr(ScenarioField.objects.get(scenario=scenario, name=key), column))
    if prefix == "draft_values":
        return str(getattr(FieldValue.objects.get(scenario=scenario, value=key), column))
    example = ScenarioExample.objects.filter(scenario=scenario).order_by("position")[int(key)]
    return str(getattr(example, column))


# Django admin's own icons (booleans, calendar): the only images an admin page has.
ADMIN_ICON = re.compile(r'<img src="/static/admin/img/[\w-]+\.svg"[^>]*>')


def problems(html: str) -> list[str]:
    return hostile.inert_problems(ADMIN_ICON.sub("", html))


def assert_inert_and_shown(html: str, values: list[str], where: str) -> None:
    assert problems(html) == [], where
    missing = [v for v in values if not hostile.shown(v, html)]
    assert missing == [], f"{where}: lost {missing}"


def admin_pages(client: Client) -> dict[str, str]:
    scenario = oil_spill()
    base = f"/admin/scenarios_admin/scenario/{scenario.pk}"
    return {
        url: client.get(url).content.decode()
        for url in (
            f"{base}/change/",
            "/admin/scenarios_admin/scenario/",
            f"{base}/history/",
            f"{base}/publish/",
        )
    }


def test_long_draft_text_inputs_keep_the_hostile_corpus_and_show_it_inert(root: Client) -> None:
    data = page_data(root)
    for spec in LONG_INPUTS:
        data[input_name(data, spec)] = HOSTILE.replace("\n", "\r\n")  # as a browser sends
    response = root.post(change_url(), data)
    assert response.status_code == 302, re.findall(
        r"errorlist[^>]*>(.*?)</ul>", response.content.decode(), re.S
    )
    for spec in LONG_INPUTS:
        assert stored(spec) == HOSTILE, spec  # exactly as typed (line breaks as LF)
    for url, html in admin_pages(root).items():
        if url.endswith(("/history/", "/scenario/")):  # field names and the name only
            assert problems(html) == [], url
            continue
        assert_inert_and_shown(html, VALUES, url)


def test_short_draft_inputs_take_every_hostile_string_in_turn(root: Client) -> None:
    html = root.get(change_url()).content.decode()
    for turn in range(len(VALUES)):
        # The form as the page after the last save shows it (what an admin edits next).
        data = {**form_data(html, "scenario_form"), "_save": "Save"}
        placed = {
            input_name(data, spec): VALUES[(turn + i) % len(VALUES)]
            for i, spec in enumerate(SHORT_INPUTS)
        }
        data.update(placed)
        response = root.post(change_url(), data)
        assert response.status_code == 302, (turn, response.content.decode()[-3000:])
        for i, spec in enumerate(SHORT_INPUTS):
            assert stored(spec) == VALUES[(turn + i) % len(VALUES)].strip(), (turn, spec)
        html = root.get(change_url()).content.decode()
        assert_inert_and_shown(html, list(placed.values()), f"turn {turn}")
        listing = root.get("/admin/scenarios_admin/scenario/").content.decode()
        assert problems(listing) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (hostile.ONE_MB, "Too long (1,048,576 characters, at most 20,000); nothing was saved."),
        (hostile.NUL, "Null characters are not allowed."),
    ],
)
def test_a_draft_text_over_its_limit_or_with_nul_is_refused_on_its_field(
    root: Client, text: str, message: str
) -> None:
    before = {spec: stored(spec) for spec in LONG_INPUTS}
    # As many inputs per save as a request holds: 2.5 MB of form data (Django's limit).
    per_save = 2 if text == hostile.ONE_MB else len(LONG_INPUTS)
    for start in range(0, len(LONG_INPUTS), per_save):
        specs = LONG_INPUTS[start : start + per_save]
        data = page_data(root)
        for spec in specs:
            data[input_name(data, spec)] = text
        response = root.post(change_url(), data)
        assert response.status_code == 200, specs  # the form again, not a redirect
        html = response.content.decode()
        errors = re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', html, re.S)
        # Each input says so on its own.
        assert sum(message in e for e in errors) == len(specs), (specs, errors)
        assert problems(html) == []
        if text == hostile.ONE_MB:  # back in the form, to be shortened
            assert html.count(hostile.ONE_MB) == len(specs)
    assert {spec: stored(spec) for spec in LONG_INPUTS} == before  # nothing saved


def test_hostile_scenario_texts_are_inert_on_session_pages_the_report_and_exports(
    root: Client, make_user: Callable[..., User], bob: User
) -> None:
    """A published version whose name, labels, question and report template hold the
    corpus: everything that shows scenario text to operators and auditors."""
    data = page_data(root)
    data["name_zh"] = hostile.INERT["script"]
    data["name_en"] = hostile.INERT["event"]
    labels = [v for k, v in hostile.INERT.items() if k not in ("script", "event")]
    fields = ["flight_no", "position", "fluid_type", "engine_status", "continuous", "leak_size"]
    for field, label in zip(fields, labels, strict=False):
        data[input_name(data, ("draft_fields", "name", field, "label_zh"))] = label
    data[input_name(data, ("draft_values", "value", "FUEL", "label_zh"))] = labels[-1]
    data[input_name(data, ("draft_fields", "name", "flight_no", "ask_zh"))] = HOSTILE
    template = oil_spill().report_template_zh
    data["report_template_zh"] = template + "\n\n## 附注\n\n" + HOSTILE + "\n"
    assert root.post(change_url(), data).status_code == 302
    published = root.post(
        f"/admin/scenarios_admin/scenario/{oil_spill().pk}/publish/", {"note": ""}
    )
    assert published.status_code == 302
    assert oil_spill().latest_version().number == 2  # type: ignore[union-attr]

    olga = make_user("olga", "operator")
    # No flight number: the agent asks for it with the hostile question.
    session = make_session(olga, "在105机位燃油泄漏，发动机仍在运转，还在持续漏")
    assert session.scenario_version.number == 2
    client = login(olga)
    shown_here = {
        f"/sessions/{session.pk}/": [hostile.INERT["script"], *VALUES],  # name, question
        f"/sessions/{session.pk}/events/": VALUES,
        "/sessions/": [hostile.INERT["script"]],
    }
    for url, values in shown_here.items():
        assert_inert_and_shown(client.get(url).content.decode(), values, url)

    from diagnosis.actions import do_answer
    from tests.web_helpers import approve_everything

    do_answer(session.pk, olga, "CA1234")
    approve_everything(session, bob)
    session.refresh_from_db()
    report = Report.objects.get(session=session)
    # Read in Chinese: the report is worded in the reader's language, and the hostile
    # labels and template are the Chinese ones.
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "zh-hans"
    page = client.get(f"/sessions/{session.pk}/").content.decode()
    report_html = page[page.index('data-testid="report"') :]
    report_html = report_html[: report_html.index("</article>")]
    assert problems(page) == []
    # The labels and the name went in as escaped values: shown as typed. The template's
    # own text is the author's Markdown: sanitised, so nothing of it runs.
    in_report = [hostile.INERT["script"], *[v for v in labels[:6] if "\u202e" not in v]]
    assert_inert_and_shown(report_html, in_report, "report")
    export = client.get(f"/sessions/{session.pk}/report.md").content.decode()
    assert export == report.markdown
    auditor = login(make_user("audrey", "auditor"))
    replay_export = auditor.post(f"/replay/{session.pk}/export/")
    assert replay_export.status_code == 200
    for url in (f"/replay/{session.pk}/", "/history/"):
        html = auditor.get(url).content.decode()
        assert problems(html) == [], url
    assert Session.objects.filter(pk=session.pk, status="completed").exists()


# --- provider fields ------------------------------------------------------------------

PROVIDERS = "/admin/scenarios_admin/providerconfig/"


def provider_form(name: str, model: str, base_url: str, api_key: str) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "openai",
        "base_url": base_url,
        "model": model,
        "api_key": api_key,
        "price_input_per_1k": "0",
        "price_output_per_1k": "0",
        "timeout_seconds": "1",
        "retries": "0",
        "priority": "1",
        "enabled": "",
        "_save": "Save",
    }


KEY_REFUSED = "An API key is printable ASCII"


@pytest.mark.parametrize("key", list(hostile.INERT))
def test_hostile_provider_fields_are_kept_and_shown_inert_or_refused(
    root: Client, key: str
) -> None:
    value = hostile.INERT[key]
    # A URL with the string in its query, when it can be one (no spaces or line breaks).
    url_ok = not re.search(r"\s", value)
    url = f"http://127.0.0.1:9/v1?x={value}" if url_ok else value
    key_ok = value.isascii() and value.isprintable()  # a key goes in an HTTP header
    response = root.post(f"{PROVIDERS}add/", provider_form(value, value, url, value))
    config = ProviderConfig.objects.filter(name=value.strip()).first()
    if url_ok and key_ok:
        assert response.status_code == 302
        assert config is not None
        assert config.model == value.strip() and config.base_url == url
        assert config.api_key() == value  # the key as typed, never shown
        pages = {
            PROVIDERS: root.get(PROVIDERS).content.decode(),
            "change": root.get(f"{PROVIDERS}{config.pk}/change/").content.decode(),
            "/audit/": root.get("/audit/").content.decode(),
        }
        for where, html in pages.items():
            assert_inert_and_shown(html, [value], where)
        # "Test connection" names the provider in its message: shown as text too.
        tested = root.post(
            PROVIDERS,
            {"action": "test_connection", "_selected_action": [config.pk]},
            follow=True,
        ).content.decode()
        assert_inert_and_shown(tested, [value], "test connection")
        assert f"failed: {NO_ANSWER}" in tested
        return
    html = response.content.decode()
    assert response.status_code == 200 and config is None
    assert ("Enter a valid URL." in html) is not url_ok  # the field that refuses it, named
    assert (KEY_REFUSED in html) is not key_ok
    assert problems(html) == []
    kept = form_data(html, "providerconfig_form")
    # Back in the form, to be corrected (bidirectional controls as their code points).
    typed = neutralise_bidi(value.strip())
    assert kept["name"] == typed and kept["model"] == typed
    assert kept["base_url"] == neutralise_bidi(url.strip())
    assert "api_key" in kept and kept["api_key"] == ""  # a key is never sent back


def test_a_stored_key_no_header_can_carry_fails_the_probe_with_a_message(
    root: Client,
) -> None:
    """Keys stored before the form refused them: "Test connection" says so, no 500."""
    config = ProviderConfig(
        name="legacy", kind="openai", base_url="http://127.0.0.1:9/v1", model="m"
    )
    config.set_api_key("invoice\u202egnp.exe")
    config.save()
    response = root.post(
        PROVIDERS, {"action": "test_connection", "_selected_action": [config.pk]}, follow=True
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "Legacy: failed: the stored API key has characters no HTTP header can carry" in (html), (
        re.findall(r'<ul class="messagelist">(.*?)</ul>', html, re.S)
    )
