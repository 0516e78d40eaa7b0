"""Scenario editing in Django admin, as an admin sees it: the draft as rows, every save
validated with messages on the row concerned, publishing as a numbered immutable version,
versions compared, YAML export and import. Personas: root (superuser), vera (staff who may
only view scenarios), olga (an operator, not staff)."""

# Chinese incident reports use full-width punctuation on purpose.

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from aero.models import AuditLog
from diagnosis.actions import do_answer, do_create_session
from packs.airport.models import RiskRule, ScenarioAction
from scenarios_admin.actions import draft_status
from scenarios_admin.draft import assemble
from scenarios_admin.models import FieldValue, Scenario, ScenarioField, ScenarioVersion
from scenarios_admin.yamlio import dump_definition
from tests.admin_helpers import add_row, admin_client, form_data, row_prefix, staff_with

pytestmark = pytest.mark.services


@pytest.fixture
def root(builtin: None) -> Client:
    return admin_client(User.objects.create_superuser("root", password="pw-for-tests"))


@pytest.fixture
def vera(builtin: None) -> Client:
    return admin_client(staff_with("vera", "view_scenario", "view_scenarioversion"))


@pytest.fixture
def olga(builtin: None, make_user: Callable[..., User]) -> Client:
    return admin_client(make_user("olga", "operator"))


def scenario(slug: str = "oil_spill") -> Scenario:
    return Scenario.objects.get(slug=slug)


def change_url(slug: str = "oil_spill") -> str:
    return f"/admin/scenarios_admin/scenario/{scenario(slug).pk}/change/"


def page_data(client: Client, slug: str = "oil_spill") -> dict[str, Any]:
    response = client.get(change_url(slug))
    assert response.status_code == 200
    data = form_data(response.content.decode(), "scenario_form")
    data["_save"] = "Save"
    return data


def save(client: Client, data: dict[str, Any], slug: str = "oil_spill") -> Any:
    return client.post(change_url(slug), data)


def problems(response: Any) -> list[str]:
    """The list at the top of a refused save."""
    body = response.content.decode()
    assert response.status_code == 200, "the save was not refused"
    start = body.index('data-testid="draft-issues"')
    items = body[start : body.index("</ul>", start)].split("<li>")[1:]
    return [item.split("</li>")[0].replace("&#x27;", "'") for item in items]


def latest_definition(slug: str = "oil_spill") -> dict[str, Any]:
    version = scenario(slug).latest_version()
    assert version is not None
    return version.definition


def versions(slug: str = "oil_spill") -> list[int]:
    return list(scenario(slug).versions.order_by("number").values_list("number", flat=True))


# --- the draft as rows ---------------------------------------------------------------------


def test_the_draft_is_shown_as_rows_an_admin_can_read(root: Client) -> None:
    body = root.get(change_url()).content.decode()

    assert 'value="fluid_type=FUEL, continuous=true, engine_status=RUNNING"' in body
    assert 'value="level=HIGH, position.kind=stand"' in body
    assert "燃油, 航油, 煤油, fuel, jet fuel, jet a, kerosene" in body
    assert 'value="OS-12"' in body
    assert "The draft is the same as version 1, which new sessions use." in body
    assert 'value="FIELDS_COLLECTED"' in body  # the compliance states, one input each


def test_saving_without_changes_keeps_the_draft_equal_to_the_version(root: Client) -> None:
    for slug in ("oil_spill", "bird_strike", "tire_burst"):
        assert save(root, page_data(root, slug), slug).status_code == 302
        assert draft_status(scenario(slug))[1] is False


def test_an_edit_is_a_draft_until_published(root: Client) -> None:
    data = page_data(root)
    data[f"{row_prefix(data, 'draft_rules', 'rule_id', 'OS-08')}-score"] = "61"

    response = save(root, data)

    assert response.status_code == 302
    assert RiskRule.objects.get(scenario=scenario(), rule_id="OS-08").score == 61
    assert versions() == [1]
    assert latest_definition()["risk_rules"][7]["score"] == 60
    listing = root.get(response["Location"]).content.decode()
    assert "Draft saved. New sessions keep using version 1 until you publish." in listing
    assert "unpublished changes" in listing
    assert "The draft has changes that are not published" in root.get(change_url()).content.decode()


def test_a_new_enum_field_and_its_values_in_one_save(root: Client) -> None:
    data = page_data(root)
    add_row(
        data,
        "draft_fields",
        name="wind",
        label_zh="风",
        label_en="Wind",
        type="enum",
        priority="P2",
    )
    add_row(data, "draft_values", field="wind", value="STRONG", synonyms="大风\r\nstrong wind")
    add_row(data, "draft_values", field="wind", value="CALM", synonyms="无风, calm")
    row = row_prefix(data, "draft_rules", "rule_id", "OS-11")
    data[f"{row}-condition"] = "fluid_type=OIL, continuous=true, leak_size=LARGE OR wind=STRONG"

    assert save(root, data).status_code == 302

    definition, issues = assemble(scenario())
    assert issues == []
    assert definition["field_order"][-1] == "wind"
    assert definition["fields"]["wind"]["values"]["STRONG"]["synonyms"] == ["大风", "strong wind"]
    assert definition["risk_rules"][10]["when"] == {
        "any": [
            {"fluid_type": "OIL", "continuous": True, "leak_size": "LARGE"},
            {"wind": "STRONG"},
        ]
    }


def test_position_orders_rows_and_is_renumbered(root: Client) -> None:
    data = page_data(root)
    add_row(
        data,
        "draft_rules",
        position="15",
        rule_id="OS-01b",
        condition="fluid_type=FUEL, engine_status=RUNNING, leak_size=LARGE",
        level="HIGH",
        score="94",
    )
    assert save(root, data).status_code == 302
    rules = list(RiskRule.objects.filter(scenario=scenario()).order_by("position"))
    assert [r.rule_id for r in rules[:3]] == ["OS-01", "OS-01b", "OS-02"]
    assert [r.position for r in rules[:3]] == [10, 20, 30]


# --- every save is validated, with the row and the problem ---------------------------------


@pytest.mark.parametrize(
    ("rule", "condition", "problem"),
    [
        (
            "OS-04",
            "fluid=FUEL, leak_size=LARGE",
            "Risk rule OS-04 (row 4), condition: unknown field 'fluid'",
        ),
        (
            "OS-09",
            "fluid_type=DIESEL, engine_status=RUNNING",
            "Risk rule OS-09 (row 9), condition: 'DIESEL' is not one of FUEL, HYDRAULIC, OIL",
        ),
        (
            "OS-05",
            "fluid_type=FUEL, continuous=yes",
            "Risk rule OS-05 (row 5), condition: 'yes' is not true or false",
        ),
        (
            "OS-01",
            "fluid_type FUEL",
            "Risk rule OS-01 (row 1), condition: cannot read 'fluid_type FUEL': 'fluid_type "
            "FUEL' is not a comparison: write field=VALUE, field!=VALUE or field=A|B",
        ),
        (
            "OS-02",
            "fluid_type=FUEL, level=HIGH",
            "Risk rule OS-02 (row 2), condition: risk rules cannot depend on the level they assign",
        ),
    ],
)
def test_a_bad_rule_condition_is_refused_on_its_row(
    root: Client, rule: str, condition: str, problem: str
) -> None:
    data = page_data(root)
    data[f"{row_prefix(data, 'draft_rules', 'rule_id', rule)}-condition"] = condition

    response = save(root, data)

    assert problems(response) == [problem]
    body = response.content.decode()
    assert body.count('class="errorlist"') >= 1  # also marked under the field on the row
    assert RiskRule.objects.get(scenario=scenario(), rule_id=rule).condition != condition


def test_rules_after_an_unconditional_one_are_unreachable(root: Client) -> None:
    data = page_data(root)
    add_row(data, "draft_rules", position="5", rule_id="OS-00", level="LOW", score="1")

    found = problems(save(root, data))

    assert found[0] == "Risk rule OS-01 (row 2): unreachable: rule 'OS-00' before it always matches"
    assert len(found) == 12
    assert not RiskRule.objects.filter(rule_id="OS-00").exists()


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("risk_class", "R4", "Select a valid choice. R4 is not one of the available choices."),
        (
            "tool",
            "launch_foam_cannon",
            "Select a valid choice. launch_foam_cannon is not one of the available choices.",
        ),
    ],
)
def test_an_action_with_an_unknown_tool_or_risk_class_is_refused(
    root: Client, column: str, value: str, message: str
) -> None:
    data = page_data(root)
    data[f"{row_prefix(data, 'draft_actions', 'tool', 'request_fire_standby')}-{column}"] = value

    body = save(root, data).content.decode()

    assert message in body
    assert ScenarioAction.objects.filter(scenario=scenario(), risk_class="R1").count() == 2


def test_action_problems_name_the_action(root: Client) -> None:
    data = page_data(root)
    row = row_prefix(data, "draft_actions", "tool", "suspend_stand_operations")
    data[f"{row}-condition"] = "level=SEVERE"
    data[f"{row}-args"] = "stand={fields.positon}"

    assert problems(save(root, data)) == [
        "Action suspend_stand_operations (row 4), condition: 'SEVERE' is not a risk level "
        "(HIGH, MEDIUM, LOW)",
        "Action suspend_stand_operations (row 4), args: unknown placeholder {fields.positon}",
    ]


def test_a_report_template_that_does_not_compile(root: Client) -> None:
    data = page_data(root)
    data["report_template_en"] = "# Report\r\n{% if risk %}no end"

    found = problems(save(root, data))

    assert found == [
        "Scenario, report template (en): does not compile: Unclosed tag on line 2: 'if'. "
        "Looking for one of: elif, else, endif."
    ]
    assert scenario().report_template_en.startswith("# Apron fluid spill response report")


def test_field_and_value_problems_name_the_field(root: Client) -> None:
    data = page_data(root)
    data[f"{row_prefix(data, 'draft_fields', 'name', 'engine_status')}-ask_zh"] = ""
    value = row_prefix(data, "draft_values", "value", "STOPPED")
    data[f"{value}-synonyms"] += ", Running"

    assert problems(save(root, data)) == [
        "Field engine_status, ask prompt (zh): a P1 field needs an ask prompt",
        "Value STOPPED of field engine_status, synonyms: 'Running' is also a synonym of "
        "RUNNING: the extractor could not tell them apart",
    ]


def test_renaming_a_field_shows_everything_that_still_uses_the_old_name(root: Client) -> None:
    data = page_data(root)
    data[f"{row_prefix(data, 'draft_fields', 'name', 'engine_status')}-name"] = "engine"

    found = problems(save(root, data))

    assert (
        "Value RUNNING of field engine_status: 'engine_status' is not a field of this scenario"
        in found
    )
    assert "Risk rule OS-01 (row 1), condition: unknown field 'engine_status'" in found
    assert any(
        p.startswith("Example 1, expected fields: unknown field 'engine_status'") for p in found
    )
    assert ScenarioField.objects.filter(scenario=scenario(), name="engine_status").exists()


def test_the_compliance_state_machine_needs_six_distinct_states(root: Client) -> None:
    data = page_data(root)
    data["apron_draft-0-state_4"] = "RISK_ASSESSED"

    assert problems(save(root, data)) == [
        "Scenario, compliance states: must name exactly 6 distinct states, in order: start, "
        "all P1 fields known, risk assessed, impact analysed, actions decided, reported"
    ]


def test_the_impact_settings_are_edited_and_checked_on_their_row(root: Client) -> None:
    """The apron settings (the airport pack's row) are on the page: a start that is not a
    position field is refused and marked on its input; a good edit is the next draft's."""
    data = page_data(root)
    assert data["apron_draft-0-impact_start"] == "position"
    data["apron_draft-0-impact_start"] = "fluid_type"

    response = save(root, data)
    assert problems(response) == [
        "Scenario, impact starts at: 'fluid_type' is not a position field"
    ]
    html = response.content.decode()
    assert html.rindex("is not a position field") > html.index('id="apron_draft-group"')
    assert assemble(scenario())[0]["impact"]["start"] == "position"

    data["apron_draft-0-impact_start"] = "position"
    data["apron_draft-0-default_radius"] = "3"
    assert save(root, data).status_code == 302
    assert assemble(scenario())[0]["impact"]["default_radius"] == 3


def test_an_example_that_names_an_unknown_rule(root: Client) -> None:
    data = page_data(root)
    data[f"{row_prefix(data, 'draft_examples', 'rule', 'OS-12')}-rule"] = "OS-13"

    assert problems(save(root, data)) == [
        "Example 2, rule: 'OS-13' is not a risk rule of this scenario"
    ]


# --- publishing -------------------------------------------------------------------------------


def publish_url(slug: str = "oil_spill") -> str:
    return f"/admin/scenarios_admin/scenario/{scenario(slug).pk}/publish/"


def edit_score(client: Client, rule: str, score: int, slug: str = "oil_spill") -> None:
    data = page_data(client, slug)
    data[f"{row_prefix(data, 'draft_rules', 'rule_id', rule)}-score"] = str(score)
    assert save(client, data, slug).status_code == 302


def test_publish_shows_the_changes_then_freezes_a_numbered_version(root: Client) -> None:
    edit_score(root, "OS-08", 61)

    page = root.get(publish_url()).content.decode()
    assert "its 2 example cases pass" in page
    assert '<span class="removed">-    score: 60</span>' in page
    assert '<span class="added">+    score: 61</span>' in page
    assert 'value="Publish version 2"' in page

    response = root.post(publish_url(), {"note": "OS-08 scores 61"})

    assert response.status_code == 302
    version = ScenarioVersion.objects.get(scenario=scenario(), number=2)
    assert version.published_by is not None and version.published_by.username == "root"
    assert version.note == "OS-08 scores 61"
    assert version.definition["risk_rules"][7]["score"] == 61
    entry = AuditLog.objects.get(action="scenario.published", actor_label="root")
    assert entry.detail == {
        "slug": "oil_spill",
        "version": 2,
        "previous": 1,
        "checksum": version.checksum,
        "note": "OS-08 scores 61",
    }
    assert "Published oil_spill version 2." in root.get(response["Location"]).content.decode()
    with pytest.raises(PermissionError):
        version.save()  # immutable


def test_a_version_whose_example_cases_fail_is_never_published(root: Client) -> None:
    data = page_data(root, "tire_burst")
    data[f"{row_prefix(data, 'draft_actions', 'tool', 'tow_aircraft')}-condition"] = ""
    assert save(root, data, "tire_burst").status_code == 302  # a valid draft

    page = root.get(publish_url("tire_burst")).content.decode()
    assert "The example cases fail, so it cannot be published:" in page
    assert (
        "example 1 (CA1234 在105机位爆胎，轮胎起火冒烟，无碎片): actions: expected "
        "[notify_atc, request_fire_standby], got [notify_atc, request_fire_standby, tow_aircraft]"
    ) in page
    assert 'value="Publish version 2"' not in page

    response = root.post(publish_url("tire_burst"), {"note": "tow always"})

    assert response.status_code == 200
    assert "The scenario&#x27;s example cases fail, so it cannot be published." in (
        response.content.decode()
    )
    assert "Version 1 keeps serving." in response.content.decode()
    assert versions("tire_burst") == [1]


def test_nothing_to_publish(root: Client) -> None:
    assert "there is nothing to publish" in root.get(publish_url()).content.decode()
    response = root.post(publish_url(), {"note": ""})
    assert response.status_code == 302
    assert versions() == [1]
    assert "The draft is the same as version 1." in root.get(response["Location"]).content.decode()


def test_sessions_pin_their_version_and_new_ones_use_the_newest(
    root: Client, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    # A tire burst at a stand with no debris needs only R0 actions: the report follows the
    # last answer. The session waits for the debris question while the admin publishes.
    before = do_create_session(olga, scenario("tire_burst"), "CZ3101 在201机位爆胎，无烟")
    before.refresh_from_db()
    assert before.status == "waiting_user"

    data = page_data(root, "tire_burst")
    data[f"{row_prefix(data, 'draft_fields', 'name', 'debris')}-label_zh"] = "轮胎碎片"
    data["report_template_zh"] = data["report_template_zh"].replace(
        "爆胎应急处置报告", "爆胎处置报告（新版）"
    )
    assert save(root, data, "tire_burst").status_code == 302
    assert root.post(publish_url("tire_burst"), {"note": "new title"}).status_code == 302

    do_answer(before.pk, olga, "无碎片")
    before.refresh_from_db()
    after = do_create_session(olga, scenario("tire_burst"), "CZ3101 在201机位爆胎，无碎片，无烟")
    after.refresh_from_db()

    assert before.scenario_version.number == 1
    assert before.report.markdown.startswith("# 爆胎应急处置报告\n")
    assert "| 是否有轮胎碎片 | 无碎片 |" in before.report.markdown
    assert after.scenario_version.number == 2
    assert after.report.markdown.startswith("# 爆胎处置报告（新版）\n")
    assert "| 轮胎碎片 | 无碎片 |" in after.report.markdown


# --- comparing versions, export and import -----------------------------------------------------


def test_compare_two_versions(root: Client) -> None:
    edit_score(root, "OS-08", 61)
    root.post(publish_url(), {"note": ""})
    url = f"/admin/scenarios_admin/scenario/{scenario().pk}/diff/"

    page = root.get(url, {"a": "1", "b": "2"}).content.decode()
    assert '<span class="file">--- v1</span>' in page
    assert '<span class="removed">-    score: 60</span>' in page
    assert '<span class="added">+    score: 61</span>' in page

    assert 'data-testid="no-diff"' in root.get(url, {"a": "2", "b": "draft"}).content.decode()
    assert root.get(url, {"a": "1", "b": "9"}).status_code == 404


def test_export_action_downloads_one_file_per_scenario(root: Client) -> None:
    changelist = "/admin/scenarios_admin/scenario/"
    one = root.post(
        changelist, {"action": "export_yaml", "_selected_action": [scenario("bird_strike").pk]}
    )
    assert one["Content-Disposition"] == 'attachment; filename="bird_strike.yaml"'
    assert one.content.decode() == dump_definition(latest_definition("bird_strike"))

    both = root.post(
        changelist,
        {
            "action": "export_yaml",
            "_selected_action": [scenario("bird_strike").pk, scenario("tire_burst").pk],
        },
    )
    archive = zipfile.ZipFile(io.BytesIO(both.content))
    assert archive.namelist() == ["bird_strike.yaml", "tire_burst.yaml"]
    assert yaml.safe_load(archive.read("tire_burst.yaml")) == (latest_definition("tire_burst"))


def test_import_replaces_the_draft_and_can_publish(root: Client) -> None:
    text = dump_definition(latest_definition("bird_strike"))
    text = text.replace("score: 60", "score: 62")
    upload = SimpleUploadedFile("bird_strike.yaml", text.encode(), "application/yaml")

    response = root.post(
        "/admin/scenarios_admin/scenario/import/", {"file": upload, "publish": "on", "note": "x"}
    )

    assert response.status_code == 302
    page = root.get(response["Location"]).content.decode()
    assert "Imported bird_strike: draft replaced, published version 2." in page
    assert versions("bird_strike") == [1, 2]
    assert RiskRule.objects.get(scenario=scenario("bird_strike"), rule_id="BS-03").score == 62


def test_a_bad_import_changes_nothing_and_lists_each_error_with_its_line(root: Client) -> None:
    text = dump_definition(latest_definition("bird_strike"))
    text = text.replace("risk_class: R3", "risk_class: R9").replace(
        "bird_size: LARGE", "size: LARGE"
    )
    upload = SimpleUploadedFile("bird_strike.yaml", text.encode(), "application/yaml")
    synonyms_before = list(FieldValue.objects.values_list("synonyms", flat=True))

    response = root.post("/admin/scenarios_admin/scenario/import/", {"file": upload})

    body = response.content.decode().replace("&#x27;", "'")
    assert response.status_code == 200
    assert "The file is not a valid scenario. Nothing was changed." in body
    lines = text.splitlines()
    risk_line = next(i for i, line in enumerate(lines, 1) if "R9" in line)
    assert f"line {risk_line}: actions[3].risk_class: 'R9' is not one of R0-R3" in body
    assert "risk_rules[2].when.size: unknown field 'size'" in body
    assert list(FieldValue.objects.values_list("synonyms", flat=True)) == synonyms_before
    assert versions("bird_strike") == [1]


# --- access -----------------------------------------------------------------------------------


def test_admin_pages_need_staff_and_permissions(root: Client, vera: Client, olga: Client) -> None:
    pk = scenario().pk
    base = f"/admin/scenarios_admin/scenario/{pk}"
    pages = [
        f"{base}/change/",
        f"{base}/publish/",
        f"{base}/diff/",
        f"{base}/export/",
        "/admin/scenarios_admin/scenario/import/",
    ]
    for url in pages:
        response = olga.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/admin/login/"), url

    assert vera.get(f"{base}/publish/").status_code == 403
    assert vera.post(f"{base}/publish/", {"note": ""}).status_code == 403
    assert vera.get("/admin/scenarios_admin/scenario/import/").status_code == 403
    assert vera.get(f"{base}/diff/").status_code == 200
    assert vera.get(f"{base}/export/").status_code == 200
    assert "Publish…" not in vera.get(f"{base}/change/").content.decode()
    refused = olga.post(
        "/admin/scenarios_admin/scenario/",
        {"action": "export_yaml", "_selected_action": [pk]},
    )
    assert refused.status_code == 302 and refused["Location"].startswith("/admin/login/")
    assert versions() == [1]


def test_a_new_scenario_is_created_and_published_without_code(root: Client) -> None:
    page = root.get("/admin/scenarios_admin/scenario/add/")
    data = form_data(page.content.decode(), "scenario_form")
    data.update(
        slug="fuel_smell",
        name_zh="燃油气味",
        name_en="Fuel smell",
        kind="apron",
        report_template_zh="# 燃油气味\r\n{{ risk.rule }}\r\n",
        report_template_en="# Fuel smell\r\n{{ risk.rule }}\r\n",
        _save="Save",
    )
    # The apron settings: the airport pack's row (its one inline form).
    data.update({"apron_draft-0-impact_start": "position", "apron_draft-0-default_radius": "1"})
    for i, state in enumerate(
        ["INIT", "FIELDS_COLLECTED", "RISK_ASSESSED", "IMPACT_ANALYZED", "DECIDED", "REPORTED"]
    ):
        data[f"apron_draft-0-state_{i + 1}"] = state
    ask = {"ask_zh": "哪里？", "ask_en": "Where?"}
    add_row(
        data,
        "draft_fields",
        name="flight_no",
        label_zh="航班号",
        label_en="Flight",
        type="flight_no",
        priority="P1",
        **ask,
    )
    add_row(
        data,
        "draft_fields",
        name="position",
        label_zh="位置",
        label_en="Position",
        type="position",
        priority="P1",
        kinds=["stand"],
        **ask,
    )
    add_row(
        data,
        "draft_fields",
        name="strong",
        label_zh="气味强烈",
        label_en="Strong",
        type="bool",
        priority="P1",
        **ask,
    )
    add_row(data, "draft_values", field="strong", value="true", synonyms="强烈, strong")
    add_row(data, "draft_values", field="strong", value="false", synonyms="轻微, faint")
    add_row(
        data, "draft_rules", rule_id="FS-01", condition="strong=true", level="MEDIUM", score="50"
    )
    add_row(data, "draft_rules", rule_id="FS-02", condition="", level="LOW", score="10")
    add_row(data, "draft_radii", level="MEDIUM", hops="1")
    add_row(
        data,
        "draft_actions",
        tool="notify_atc",
        risk_class="R0",
        args="message=Fuel smell at {fields.position}",
    )
    add_row(
        data,
        "draft_actions",
        tool="dispatch_cleanup_crew",
        risk_class="R1",
        condition="level=MEDIUM",
        args="position={fields.position}",
    )
    add_row(
        data,
        "draft_examples",
        text="CA1234 105机位 燃油味强烈",
        expected_fields="flight_no=CA1234, position=105, strong=true",
        rule="FS-01",
        level="MEDIUM",
        actions="notify_atc, dispatch_cleanup_crew",
    )

    response = root.post("/admin/scenarios_admin/scenario/add/", data)

    assert response.status_code == 302, problems(response)
    new = scenario("fuel_smell")
    assert "its 1 example case passes" in root.get(publish_url("fuel_smell")).content.decode()
    assert root.post(publish_url("fuel_smell"), {"note": "first"}).status_code == 302
    definition = latest_definition("fuel_smell")
    assert definition["fields"]["position"]["kinds"] == ["stand"]
    assert definition["impact"] == {
        "start": "position",
        "radius": {"MEDIUM": 1},
        "default_radius": 1,
    }
    assert new.versions.get().published_by is not None


def test_the_row_editor_offers_the_airport_packs_field_types_and_impact_lists(
    root: Client,
) -> None:
    """The row editor's field types, node kinds and `for_each` lists are the installed
    packs' (the apron's from packs/airport), not the core's: without them an admin could
    not add a flight or position field, nor one action per closed runway."""
    page = root.get("/admin/scenarios_admin/scenario/add/").content.decode()
    assert '<option value="flight_no">flight number</option>' in page
    assert '<option value="position">position (airport node)</option>' in page
    assert '<option value="impact.runways">each of impact.runways</option>' in page
    assert 'value="taxiway"' in page  # the node kinds' checkboxes


def test_a_field_type_no_pack_declares_is_refused(root: Client) -> None:
    page = root.get(change_url())
    data = form_data(page.content.decode(), "scenario_form")
    position = row_prefix(data, "draft_fields", "name", "position")
    data[f"{position}-type"] = "gate"
    response = root.post(change_url(), data)
    assert response.status_code == 200
    assert "Select a valid choice. gate is not one of the available choices." in (
        response.content.decode()
    )
