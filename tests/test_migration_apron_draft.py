"""The apron draft's settings (where the impact analysis starts, what its spread radius
depends on, its default, the compliance states) moved from the core's Scenario columns to
the airport pack's ApronDraft row: an upgrade copies every apron scenario's values, so
the draft an admin left reads back the same, and a downgrade copies them back."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from packs.airport.models import ApronDraft
from scenarios_admin.draft import assemble
from scenarios_admin.models import Scenario

BEFORE = [("scenarios_admin", "0008_draft_rows_to_airport_pack"), ("airport", "0003_draft_rows")]
COLUMNS = ("impact_start", "radius_key", "default_radius", "compliance_states")
STATES = ["S0", "S1", "S2", "S3", "S4", "S5"]


def _migrate(targets: list[tuple[str, str]] | None = None) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(targets or executor.loader.graph.leaf_nodes())
    return executor


def _old_values(executor: MigrationExecutor) -> dict[str, dict[str, object]]:
    old_scenario = executor.loader.project_state(BEFORE).apps.get_model(
        "scenarios_admin", "Scenario"
    )
    return {row.pop("slug"): row for row in old_scenario.objects.values("slug", *COLUMNS)}


@pytest.mark.django_db(transaction=True)
def test_an_upgrade_and_a_downgrade_keep_every_apron_scenarios_settings(builtin: None) -> None:
    scenario = Scenario.objects.get(slug="bird_strike")
    apron = set(Scenario.objects.filter(kind="apron").values_list("slug", flat=True))
    executor = _migrate(BEFORE)
    try:
        old_scenario = executor.loader.project_state(BEFORE).apps.get_model(
            "scenarios_admin", "Scenario"
        )
        # An admin's edit made before the upgrade.
        old_scenario.objects.filter(pk=scenario.pk).update(
            default_radius=4, compliance_states=STATES
        )
        before = _old_values(executor)
    finally:
        _migrate()

    settings = {
        row.pop("scenario__slug"): row
        for row in ApronDraft.objects.values("scenario__slug", *COLUMNS)
    }
    assert set(settings) == apron and len(apron) == 3
    assert settings == {slug: before[slug] for slug in apron}
    definition, _issues = assemble(Scenario.objects.get(pk=scenario.pk))
    assert definition["impact"]["default_radius"] == 4
    assert definition["impact"]["start"] == before["bird_strike"]["impact_start"]
    assert definition["compliance"] == {"states": STATES}

    # Back down: the columns hold the values again (then up, for the other tests).
    ApronDraft.objects.filter(scenario=scenario).update(default_radius=5)
    executor = _migrate(BEFORE)
    try:
        after = _old_values(executor)
    finally:
        _migrate()
    assert after["bird_strike"] == {**before["bird_strike"], "default_radius": 5}
    assert {slug: after[slug] for slug in apron - {"bird_strike"}} == {
        slug: before[slug] for slug in apron - {"bird_strike"}
    }
