"""Built-in data shipped with AERO: the demo airport and the scenario definitions."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import yaml
from django.db import transaction

from aero.packs import installed_packs
from scenarios_admin.actions import ScenarioError, do_publish
from scenarios_admin.airport import touch_topology
from scenarios_admin.draft import (
    assemble,
    draft_from_definition,
    normalize,
    save_draft,
)
from scenarios_admin.models import (
    Flight,
    Runway,
    Scenario,
    ScenarioVersion,
    Topology,
    TopologyEdge,
    TopologyNode,
)
from scenarios_admin.schema import validate_definition
from scenarios_admin.topology import data_from_yaml, topology_issues

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
    """Create what is missing: the airport, and each built-in scenario (its draft and
    version 1). A scenario that exists but has no draft yet gets one from its newest
    version. With update=True a built-in scenario whose file changed gets a new version,
    unless an admin has edited it (an unpublished draft, or a version an admin published):
    an admin's edits are never overwritten. Returns what it did."""
    done: list[str] = []
    if not Topology.objects.exists():
        topology = load_topology(read_yaml(DATA_DIR / "airport.yaml"))
        done.append(f"airport {topology.icao}: loaded")
    for path in scenario_files():
        definition = read_yaml(path)
        errors = validate_definition(definition)
        if errors:
            raise BuiltinDataError(f"{path.name}: " + "; ".join(errors))
        done.extend(_load_scenario(path.name, normalize(definition), update=update))
    for pack in installed_packs():
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


def load_topology(data: dict[str, Any]) -> Topology:
    issues = topology_issues(data_from_yaml(data))
    if issues:
        raise BuiltinDataError("airport.yaml: " + "; ".join(str(i) for i in issues))
    airport = data["airport"]
    topology = Topology.objects.create(
        icao=airport["icao"],
        name=airport["name"],
        is_active=not Topology.objects.filter(is_active=True).exists(),
    )
    nodes = {
        str(n["id"]): TopologyNode.objects.create(
            topology=topology,
            node_id=str(n["id"]),
            kind=n["kind"],
            runway=str(n.get("runway", "")),
            x=n.get("x", 0),
            y=n.get("y", 0),
        )
        for n in data["nodes"]
    }
    TopologyEdge.objects.bulk_create(
        TopologyEdge(topology=topology, source=nodes[str(a)], target=nodes[str(b)])
        for a, b in data["edges"]
    )
    for designator, spec in data["runways"].items():
        Runway.objects.create(
            topology=topology,
            designator=designator,
            reference_node=nodes[str(spec["reference_node"])],
        )
    Flight.objects.bulk_create(
        Flight(
            topology=topology,
            flight_no=f["flight_no"],
            airline=f["airline"],
            aircraft=f["aircraft"],
            registration=f["registration"],
            stand=nodes.get(str(f.get("stand", ""))),
            std=dt.time.fromisoformat(f["std"]),
            destination=f["destination"],
            pax=f["pax"],
        )
        for f in data["flights"]
    )
    # bulk_create sends no signals: stamp the topology so cached graphs are rebuilt.
    touch_topology(topology.pk)
    return topology
