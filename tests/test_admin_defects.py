"""Admin defects an operator hit (issue 12, "Other pages"): a save without changes logs
no change, a provider missing its URL or model says which field, and the scenario kind
list offers only kinds that work."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.test import Client

from scenarios_admin.models import ProviderConfig, Scenario
from tests.admin_helpers import admin_client, form_data

pytestmark = pytest.mark.services
PROVIDERS = "/admin/scenarios_admin/providerconfig/"


@pytest.fixture
def root(builtin: None) -> Client:
    return admin_client(User.objects.create_superuser("root", password="pw-for-tests"))


def change_url(scenario: Scenario) -> str:
    return f"/admin/scenarios_admin/scenario/{scenario.pk}/change/"


def history(scenario: Scenario) -> list[str]:
    return [
        entry.get_change_message()
        for entry in LogEntry.objects.filter(object_id=str(scenario.pk)).order_by("pk")
    ]


def test_a_save_without_changes_logs_no_changed_field(root: Client) -> None:
    scenario = Scenario.objects.get(slug="oil_spill")
    data = form_data(root.get(change_url(scenario)).content.decode(), "scenario_form")
    data["_save"] = "Save"
    assert root.post(change_url(scenario), data).status_code == 302
    assert history(scenario) == ["No fields changed."]
    page = root.get(f"{change_url(scenario).removesuffix('change/')}history/").content.decode()
    assert "System prompt" not in page and "Report template" not in page

    # A real edit still names exactly what changed.
    data["system_prompt"] = data["system_prompt"] + "\r\nOne more line."
    assert root.post(change_url(scenario), data).status_code == 302
    assert history(scenario)[-1] == "Changed System prompt."


def provider(**values: str) -> dict[str, str]:
    return {
        "name": "gateway",
        "kind": "openai",
        "base_url": "http://127.0.0.1:9/v1",
        "model": "gpt-4o-mini",
        "api_key": "",
        "price_input_per_1k": "0",
        "price_output_per_1k": "0",
        "timeout_seconds": "30",
        "retries": "3",
        "priority": "1",
        "enabled": "on",
        "_save": "Save",
        **values,
    }


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ({"base_url": ""}, "An OpenAI-compatible provider needs the base URL of its API"),
        ({"model": ""}, "An OpenAI-compatible provider needs a model name"),
    ],
)
def test_a_provider_without_url_or_model_is_refused_on_that_field(
    root: Client, missing: dict[str, str], message: str
) -> None:
    response = root.post(f"{PROVIDERS}add/", provider(**missing))
    html = response.content.decode()
    assert response.status_code == 200 and not ProviderConfig.objects.exists()
    assert "Constraint" not in html and "provider_openai_needs_url_and_model" not in html
    (field,) = missing
    # The message sits on the field's own row, and what was typed is kept.
    row = html[html.index(f'class="form-row field-{field}') :]
    assert message in row[: row.index('<div class="form-row')]
    assert form_data(html, "providerconfig_form")["name"] == "gateway"


def test_an_offline_provider_needs_neither_and_a_full_one_saves(root: Client) -> None:
    offline = provider(name="local", kind="offline", base_url="", model="")
    assert root.post(f"{PROVIDERS}add/", offline).status_code == 302
    assert root.post(f"{PROVIDERS}add/", provider()).status_code == 302
    assert set(ProviderConfig.objects.values_list("name", flat=True)) == {"local", "gateway"}


def test_the_kind_list_offers_only_kinds_that_work(
    root: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kind whose pack is not installed (here: the diagnosis pack taken out of the
    registry, as a deployment without it) is neither offered nor accepted."""
    from aero import packs

    offered = root.get("/admin/scenarios_admin/scenario/add/").content.decode()
    # The kind's option, not the pack's admin section (its app has the same name); a kind
    # written as YAML is offered as its own add page, not as an option of the row editor.
    option = '<option value="diagnosis">IT problem diagnosis</option>'
    link = 'href="?kind=diagnosis" data-kind="diagnosis"'
    assert link in offered and option not in offered  # installed: offered
    assert option in root.get(change_url(Scenario.objects.get(slug="oil_spill"))).content.decode()
    monkeypatch.setattr(
        packs, "_PACKS", {k: v for k, v in packs._PACKS.items() if k != "diagnosis"}
    )
    scenario = Scenario.objects.get(slug="oil_spill")
    html = root.get(change_url(scenario)).content.decode()
    assert 'value="diagnosis"' not in html
    assert '<option value="apron" selected>Apron emergency</option>' in html
    added = root.get("/admin/scenarios_admin/scenario/add/").content.decode()
    assert option not in added and link not in added
    assert (
        'name="definition_yaml"'
        not in root.get("/admin/scenarios_admin/scenario/add/?kind=diagnosis").content.decode()
    )
    # Posted anyway (an old form, a crafted request): refused on the field.
    data = form_data(html, "scenario_form")
    response = root.post(change_url(scenario), {**data, "_save": "Save", "kind": "diagnosis"})
    assert response.status_code == 200
    assert "Select a valid choice. diagnosis is not one of the available choices." in (
        response.content.decode()
    )
    scenario.refresh_from_db()
    assert scenario.kind == "apron"
