"""The demo airport shipped with the pack (data/airport.yaml), loaded by load_builtin."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import yaml

from packs.airport.models import Flight, Runway, Topology, TopologyEdge, TopologyNode
from packs.airport.topology import data_from_yaml, topology_issues
from packs.airport.world import touch_topology
from scenarios_admin.builtin import BuiltinDataError

AIRPORT_FILE = Path(__file__).resolve().parent / "data" / "airport.yaml"


def seed_world() -> list[str]:
    """The demo airport, unless a topology exists (an admin's is never replaced)."""
    if Topology.objects.exists():
        return []
    with AIRPORT_FILE.open(encoding="utf-8") as handle:
        topology = load_topology(yaml.safe_load(handle))
    return [f"airport {topology.icao}: loaded"]


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
