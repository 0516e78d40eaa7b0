"""The pack's built-in data: the IT diagnosis scenario (its definition with the playbook
of data/playbook.yaml), published as version 1 by `load_builtin`, and a new version when
the shipped files change and no admin published one since."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from django.db import transaction

from aero.models import audit
from packs.diagnosis.knowledge import seed_knowledge
from packs.diagnosis.system import demo_shop
from scenarios_admin.models import Scenario, ScenarioVersion
from scenarios_admin.schema import validate_definition

DATA = Path(__file__).resolve().parent / "data"
LOADER = "builtin-loader"
NOTE = "built-in scenario.yaml + playbook.yaml"


def builtin_definition() -> dict[str, Any]:
    definition: dict[str, Any] = yaml.safe_load((DATA / "scenario.yaml").read_text("utf-8"))
    definition["playbook"] = yaml.safe_load((DATA / "playbook.yaml").read_text("utf-8"))
    return definition


class SeedError(Exception):
    pass


@transaction.atomic
def seed(update: bool = False) -> list[str]:
    """The built-in scenario (`seed_scenario`) and the demo shop's knowledge items that
    are not there yet."""
    return seed_scenario(update) + seed_knowledge(demo_shop())


def seed_scenario(update: bool = False) -> list[str]:
    """Create the built-in diagnosis scenario and its version 1; with `update`, publish
    the shipped files again when they changed, unless an admin published since."""
    definition = builtin_definition()
    errors = validate_definition(definition)
    if errors:
        raise SeedError("packs/diagnosis/data/scenario.yaml: " + "; ".join(errors))
    slug = definition["slug"]
    scenario = Scenario.objects.select_for_update().filter(slug=slug).first()
    if scenario is None:
        scenario = Scenario.objects.create(
            slug=slug,
            name_zh=definition["name"]["zh"],
            name_en=definition["name"]["en"],
            kind=definition["kind"],
        )
    latest = scenario.latest_version()
    if latest is not None and not update:
        return []
    if latest is not None and latest.checksum == ScenarioVersion.checksum_of(definition):
        return []
    if latest is not None and (latest.published_by_id is not None or latest.note != NOTE):
        return [f"scenario {slug}: kept v{latest.number} (published by an admin)"]
    version = ScenarioVersion.objects.create(
        scenario=scenario,
        number=(latest.number + 1) if latest else 1,
        definition=definition,
        note=NOTE,
    )
    audit(
        "scenario.published",
        obj=version,
        actor_label=LOADER,
        detail={
            "slug": slug,
            "version": version.number,
            "previous": latest.number if latest else None,
            "checksum": version.checksum,
            "note": version.note,
        },
    )
    return [f"scenario {slug}: published v{version.number}"]
