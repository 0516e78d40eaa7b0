"""The apron draft's own rows (rules, spread radius, actions, examples) moved from the
core (scenarios_admin) to the airport pack as a state-only migration: an upgrade keeps
every row, so the draft an admin left reads back the same, and the permissions keep
pointing at them (the content types moved with the models)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from packs.airport.models import RiskRule, ScenarioAction, ScenarioExample, SpreadRadius
from scenarios_admin.draft import assemble
from scenarios_admin.models import Scenario

BEFORE = [("scenarios_admin", "0007_field_type_from_packs"), ("airport", "0002_restriction")]
MODELS: dict[str, Any] = {
    "riskrule": RiskRule,
    "spreadradius": SpreadRadius,
    "scenarioaction": ScenarioAction,
    "scenarioexample": ScenarioExample,
}


def _migrate(targets: list[tuple[str, str]] | None = None) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(targets or executor.loader.graph.leaf_nodes())
    ContentType.objects.clear_cache()
    return executor


@pytest.mark.django_db(transaction=True)
def test_an_upgrade_keeps_every_draft_row_and_its_permissions(builtin: None) -> None:
    scenario = Scenario.objects.get(slug="bird_strike")
    executor = _migrate(BEFORE)
    try:
        old_apps = executor.loader.project_state(BEFORE).apps
        old_rule = old_apps.get_model("scenarios_admin", "RiskRule")
        # An admin's edit made before the upgrade: a rule slotted in first.
        old_rule.objects.create(
            scenario_id=scenario.pk, position=5, rule_id="BS-00", level="HIGH", score=99
        )
        old_rows = {
            name: sorted(
                old_apps.get_model("scenarios_admin", name)
                .objects.filter(scenario_id=scenario.pk)
                .values_list("pk", flat=True)
            )
            for name in MODELS
        }
        old_types = {
            name: ContentType.objects.get(app_label="scenarios_admin", model=name).pk
            for name in MODELS
        }
    finally:
        _migrate()

    for name, model in MODELS.items():
        rows = sorted(model.objects.filter(scenario=scenario).values_list("pk", flat=True))
        assert rows == old_rows[name] and rows, name
        moved = ContentType.objects.get_for_model(model)
        assert (moved.pk, moved.app_label) == (old_types[name], "airport")
        assert Permission.objects.filter(content_type=moved, codename=f"change_{name}").exists()
    assert not ContentType.objects.filter(app_label="scenarios_admin", model__in=MODELS).exists()
    definition, _issues = assemble(Scenario.objects.get(pk=scenario.pk))
    assert definition["risk_rules"][0] == {"id": "BS-00", "when": {}, "level": "HIGH", "score": 99}
    assert definition["actions"] and definition["examples"] and definition["impact"]["radius"]
