"""A scenario definition is validated by one pydantic model: a discriminated union on
`kind` over the definition models of the installed domain packs, whose JSON Schema the
admin serves to editors."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from django.contrib.auth.models import User
from django.test import Client

from aero import packs
from aero.packs import DomainPack, pack_for
from packs.airport.definition import ApronDefinition
from scenarios_admin.schema import (
    DefinitionBase,
    FieldSpec,
    definition_json_schema,
    validate_definition,
)
from scenarios_admin.validation import Part
from tests.admin_helpers import admin_client, staff_with
from tests.builtin_data import BUILTIN_SLUGS, builtin_definition, oil_spill


def test_the_airport_pack_brings_the_apron_definition_model() -> None:
    assert pack_for("apron").definition_model is ApronDefinition


def test_a_kind_no_installed_pack_serves_is_refused_by_name() -> None:
    # A kind without a pack is refused, not read as another kind.
    assert validate_definition({**oil_spill(), "kind": "maritime"}) == [
        "kind: 'maritime' is not one of apron, diagnosis: no installed domain pack serves that kind"
    ]


def test_a_definition_without_a_kind() -> None:
    definition = copy.deepcopy(oil_spill())
    del definition["kind"]
    assert validate_definition(definition) == ["kind: required"]


class _Check(Part):
    name: str


class _TestFieldSpec(FieldSpec):
    """The core's field types only: no airport positions or flights."""


class _TestDefinition(DefinitionBase[_TestFieldSpec]):
    kind: Literal["test"]
    checks: list[_Check]


@pytest.fixture
def test_pack(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(
        packs._PACKS,
        "test",
        DomainPack(
            kind="test",
            app_label="tests",
            label={"zh": "测试", "en": "Test"},
            definition_model=_TestDefinition,
        ),
    )
    yield


def _test_definition() -> dict[str, Any]:
    return {
        "slug": "probe",
        "name": {"zh": "探测", "en": "Probe"},
        "kind": "test",
        "field_order": ["service"],
        "fields": {
            "service": {
                "label": {"zh": "服务", "en": "Service"},
                "type": "text",
                "priority": "P1",
                "ask": {"zh": "哪个服务？", "en": "Which service?"},
            }
        },
        "report_template": {"zh": "# 报告\n", "en": "# Report\n"},
        "checks": [{"name": "ping"}],
    }


def test_the_union_holds_every_installed_pack(test_pack: None) -> None:
    assert validate_definition(_test_definition()) == []
    assert validate_definition(builtin_definition("oil_spill")) == []

    wrong = _test_definition()
    wrong["fields"]["service"]["type"] = "position"  # the airport's, not the core's
    wrong["checks"] = [{"name": 7}]
    wrong["risk_rules"] = []  # an apron part
    assert validate_definition(wrong) == [
        "fields.service.type: 'position' is not one of enum, bool, text, number",
        "checks[0].name: must be text",
        "risk_rules: unknown key (allowed: slug, name, kind, system_prompt, field_order, "
        "fields, report_template, budget, checks)",
    ]
    assert validate_definition({**_test_definition(), "kind": "tests"}) == [
        "kind: 'tests' is not one of apron, diagnosis, test: no installed domain pack serves"
        " that kind"
    ]


def test_the_json_schema_describes_each_kind_and_its_parts(test_pack: None) -> None:
    schema = definition_json_schema()
    defs = schema["$defs"]

    assert schema["discriminator"]["propertyName"] == "kind"
    assert set(schema["discriminator"]["mapping"]) == {"apron", "diagnosis", "test"}
    apron = defs["ApronDefinition"]
    assert apron["properties"]["kind"]["const"] == "apron"
    assert apron["additionalProperties"] is False  # an editor flags a misspelt key
    assert set(apron["required"]) == {
        "slug",
        "name",
        "kind",
        "field_order",
        "fields",
        "report_template",
        "risk_rules",
        "impact",
        "actions",
        "compliance",
    }
    # Followed by reference: two packs' models named Action get qualified names.
    action = defs[apron["properties"]["actions"]["items"]["$ref"].rsplit("/", 1)[1]]
    assert action["properties"]["risk_class"]["enum"] == ["R0", "R1", "R2", "R3"]
    assert "close_runway" in action["properties"]["tool"]["enum"]
    assert defs["ApronFieldSpec"]["properties"]["type"]["enum"] == [
        "flight_no",
        "position",
        "enum",
        "bool",
        "text",
        "number",
    ]
    assert defs["_TestFieldSpec"]["properties"]["type"]["enum"] == [
        "enum",
        "bool",
        "text",
        "number",
    ]


@pytest.mark.parametrize("slug", BUILTIN_SLUGS)
def test_every_key_of_a_shipped_scenario_is_in_the_schema(slug: str) -> None:
    """The schema an editor reads knows every key the shipped files use (so it never
    marks a valid file), and the parts it names are the ones validation uses."""
    defs = definition_json_schema()["$defs"]

    def walk(node: Any, model: str) -> None:
        properties = defs[model]["properties"]
        for key, value in node.items():
            assert key in properties, (model, key)
            for option in [properties[key], *properties[key].get("anyOf", [])]:
                if "$ref" in option:
                    walk(value, _name(option))
                elif "$ref" in option.get("items", {}):
                    for item in value:
                        walk(item, _name(option["items"]))
                elif isinstance(extra := option.get("additionalProperties"), dict):
                    for item in value.values():
                        if "$ref" in extra:
                            walk(item, _name(extra))

    walk(builtin_definition(slug), "ApronDefinition")


def _name(reference: dict[str, Any]) -> str:
    return str(reference["$ref"]).rsplit("/", 1)[-1]


# --- the admin serves it ---------------------------------------------------------------------


@pytest.mark.services
def test_the_admin_serves_the_schema_to_staff_who_may_see_scenarios(builtin: None) -> None:
    url = "/admin/scenarios_admin/scenario/schema.json"
    vera = admin_client(staff_with("vera", "view_scenario"))

    response = vera.get(url)

    assert response.status_code == 200
    assert response["Content-Type"] == "application/schema+json"
    assert response.json() == definition_json_schema()
    assert admin_client(staff_with("nina")).get(url).status_code == 403
    assert Client().get(url).status_code == 302  # to the sign-in page


@pytest.mark.services
def test_the_import_page_tells_editors_where_the_schema_is(builtin: None) -> None:
    root = admin_client(User.objects.create_superuser("root", password="pw-for-tests"))

    html = root.get("/admin/scenarios_admin/scenario/import/").content.decode()

    assert (
        "# yaml-language-server: $schema=http://testserver/admin/scenarios_admin/scenario/"
        "schema.json" in html
    )
