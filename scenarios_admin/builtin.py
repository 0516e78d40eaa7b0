"""Built-in data shipped with AERO: the scenario definitions, and each pack's own (its
world first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from django.db import transaction

from aero.packs import installed_packs
from scenarios_admin.actions import ScenarioError, do_publish
from scenarios_admin.draft import (
    assemble,
    draft_from_definition,
    normalize,
    save_draft,
)
from scenarios_admin.models import Scenario, ScenarioVersion
from scenarios_admin.schema import validate_definition

DATA_DIR = Path(__file__).resolve().parent / "data"
LOADER = "builtin-loader"
NOTE_PREFIX = "built-in "


class BuiltinDataError(Exception):
    pass


def scenario_files() -> list[Path]:
    return sorted((DATA_DIR / "scenarios").glob("*.yaml"))


def read_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@transaction.atomic
def load_builtin_data(*, update: bool = False) -> list[str]:
    """Create what is missing: each pack's world, and each built-in scenario (its draft and
    version 1). A scenario that exists but has no draft yet gets one from its newest
    version. With update=True a built-in scenario whose file changed gets a new version,
    unless an admin has edited it (an unpublished draft, or a version an admin published):
    an admin's edits are never overwritten. Returns what it did."""
    done: list[str] = []
    packs = installed_packs()
    for pack in packs:
        if pack.seed_world is not None:  # the world the examples run against, first
            done.extend(pack.seed_world())
    for path in scenario_files():
        definition = read_yaml(path)
        errors = validate_definition(definition)
        if errors:
            raise BuiltinDataError(f"{path.name}: " + "; ".join(errors))
        done.extend(_load_scenario(path.name, normalize(definition), update=update))
    for pack in packs:
        if pack.seed is not None:  # a pack's own built-in scenarios
            done.extend(pack.seed(update))
    return done


def _load_scenario(filename: str, definition: dict[str, Any], *, update: bool) -> list[str]:
    slug = definition["slug"]
    scenario = Scenario.objects.filter(slug=slug).first()
    if scenario is None:
        scenario = Scenario.objects.create(
            slug=slug,
            name_zh=definition["name"]["zh"],
            name_en=definition["name"]["en"],
            kind=definition["kind"],
        )
        save_draft(scenario, draft_from_definition(definition))
        version = _publish(scenario, filename)
        return [f"scenario {slug}: published v{version.number}"]
    done = []
    latest = scenario.latest_version()
    if not scenario.has_draft():
        # Scenarios published before drafts existed: the newest version is the draft.
        source = latest.definition if latest else definition
        save_draft(scenario, draft_from_definition(source))
        done.append(f"scenario {slug}: draft filled from v{latest.number if latest else 0}")
    if not update or latest is None:
        return done
    if latest.checksum == ScenarioVersion.checksum_of(definition):
        return done
    if latest.published_by_id is not None or not latest.note.startswith(NOTE_PREFIX):
        return [*done, f"scenario {slug}: kept v{latest.number} (published by an admin)"]
    current, _ = assemble(scenario)
    if ScenarioVersion.checksum_of(current) != latest.checksum:
        return [*done, f"scenario {slug}: kept (the draft has unpublished admin edits)"]
    save_draft(scenario, draft_from_definition(definition))
    version = _publish(scenario, filename)
    return [*done, f"scenario {slug}: published v{version.number}"]


def _publish(scenario: Scenario, filename: str) -> ScenarioVersion:
    try:
        return do_publish(scenario, actor_label=LOADER, note=f"{NOTE_PREFIX}{filename}")
    except ScenarioError as exc:
        raise BuiltinDataError(f"{filename}: {exc.message} " + "; ".join(exc.problems)) from exc
