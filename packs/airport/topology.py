"""Airport topology as plain data: validation (duplicate ids, dangling edges, unreachable
nodes, runway reference nodes, flights at stands) and the map the admin draws."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aero.text import natural_sorted
from packs.airport.definition import NODE_KINDS
from packs.airport.graph import RUNWAY_DESIGNATOR
from packs.airport.models import Topology
from scenarios_admin.definition import Issue


@dataclass
class TopologyData:
    nodes: list[dict[str, Any]] = field(default_factory=list)  # node_id, kind, runway
    edges: list[tuple[str, str]] = field(default_factory=list)
    runways: list[tuple[str, str]] = field(default_factory=list)  # designator, reference node
    flights: list[tuple[str, str]] = field(default_factory=list)  # flight_no, stand ("": none)


def data_from_yaml(data: dict[str, Any]) -> TopologyData:
    """The built-in airport file's shape (packs/airport/data/airport.yaml)."""
    return TopologyData(
        nodes=[
            {"node_id": str(n.get("id", "")), "kind": n.get("kind"), "runway": n.get("runway", "")}
            for n in data.get("nodes", [])
        ],
        edges=[(str(a), str(b)) for a, b in data.get("edges", [])],
        runways=[
            (str(designator), str(spec.get("reference_node", "")))
            for designator, spec in (data.get("runways") or {}).items()
        ],
        flights=[(str(f["flight_no"]), str(f.get("stand", ""))) for f in data.get("flights", [])],
    )


def data_of(topology: Topology) -> TopologyData:
    return TopologyData(
        nodes=[dict(row) for row in topology.nodes.values("node_id", "kind", "runway")],
        edges=list(topology.edges.values_list("source__node_id", "target__node_id")),
        runways=list(topology.runways.values_list("designator", "reference_node__node_id")),
        flights=[
            (flight_no, stand or "")
            for flight_no, stand in topology.flights.values_list("flight_no", "stand__node_id")
        ],
    )


def topology_issues(data: TopologyData) -> list[Issue]:
    issues: list[Issue] = []
    kinds: dict[str, str] = {}
    runway_of: dict[str, str] = {}
    for i, node in enumerate(data.nodes):
        node_id, kind, runway = node["node_id"], node["kind"], node.get("runway") or ""
        path = f"nodes[{i}]"
        if not node_id:
            issues.append(Issue(path, "the node id is empty"))
            continue
        if node_id in kinds:
            issues.append(Issue(path, f"duplicate node id {node_id!r}"))
            continue
        kinds[node_id] = kind
        if kind not in NODE_KINDS:
            issues.append(Issue(path, f"{node_id}: {kind!r} is not one of {', '.join(NODE_KINDS)}"))
        if kind == "runway":
            if not RUNWAY_DESIGNATOR.match(runway):
                issues.append(
                    Issue(path, f"{node_id}: a runway node names its runway (e.g. 06/24)")
                )
            runway_of[node_id] = runway
        elif runway:
            issues.append(Issue(path, f"{node_id}: only runway nodes name a runway"))

    adjacency: dict[str, set[str]] = {node_id: set() for node_id in kinds}
    seen_edges: dict[frozenset[str], int] = {}
    for i, (a, b) in enumerate(data.edges):
        path = f"edges[{i}]"
        dangling = [end for end in (a, b) if end not in kinds]
        if dangling:
            names = " and ".join(repr(end) for end in dangling)
            issues.append(Issue(path, f"{a} – {b}: dangling edge, {names} is not a node"))
            continue
        if a == b:
            issues.append(Issue(path, f"{a} – {b}: an edge joins two different nodes"))
            continue
        key = frozenset((a, b))
        if key in seen_edges:
            issues.append(
                Issue(
                    path, f"{a} – {b}: duplicate of edges[{seen_edges[key]}] (edges are undirected)"
                )
            )
            continue
        seen_edges[key] = i
        adjacency[a].add(b)
        adjacency[b].add(a)

    if kinds:
        first = next(iter(kinds))
        reached = {first}
        queue: deque[str] = deque([first])
        while queue:
            for neighbour in adjacency[queue.popleft()]:
                if neighbour not in reached:
                    reached.add(neighbour)
                    queue.append(neighbour)
        for i, node in enumerate(data.nodes):
            node_id = node["node_id"]
            if node_id in kinds and node_id not in reached and kinds.get(node_id) is not None:
                why = "it has no edges" if not adjacency[node_id] else f"no path to {first}"
                issues.append(Issue(f"nodes[{i}]", f"{node_id} is unreachable ({why})"))
                reached.add(node_id)  # report each node once

    designators: set[str] = set()
    for i, (designator, reference) in enumerate(data.runways):
        path = f"runways[{i}]"
        if not RUNWAY_DESIGNATOR.match(designator):
            issues.append(Issue(path, f"{designator!r} is not a runway designator (e.g. 06/24)"))
        if designator in designators:
            issues.append(Issue(path, f"runway {designator} is listed twice"))
        designators.add(designator)
        if reference not in kinds:
            issues.append(Issue(path, f"{designator}: reference node {reference!r} is not a node"))
        elif runway_of.get(reference) != designator:
            issues.append(
                Issue(
                    path, f"{designator}: reference node {reference} is not a node of this runway"
                )
            )
    for designator in natural_sorted(sorted(set(runway_of.values()) - designators - {""})):
        issues.append(Issue("runways", f"runway {designator} has nodes but no reference node"))

    flight_numbers: set[str] = set()
    for i, (flight_no, stand) in enumerate(data.flights):
        path = f"flights[{i}]"
        if flight_no in flight_numbers:
            issues.append(Issue(path, f"flight {flight_no} is listed twice"))
        flight_numbers.add(flight_no)
        if stand and kinds.get(stand) != "stand":
            issues.append(Issue(path, f"{flight_no}: {stand!r} is not a stand"))
    return issues


def topology_map(topology: Topology) -> dict[str, Any]:
    """What airport/_impact_map.html draws (`map`), for the saved graph."""
    nodes = {n.node_id: n for n in topology.nodes.all()}
    return {
        "icao": topology.icao,
        "nodes": [
            {
                "id": n.node_id,
                "kind": n.kind,
                "x": n.x,
                "y": n.y,
                "isolated": False,
                "start": False,
                "closed": False,
            }
            for n in nodes.values()
        ],
        "edges": [
            {
                "x1": nodes[a].x,
                "y1": nodes[a].y,
                "x2": nodes[b].x,
                "y2": nodes[b].y,
                "isolated": False,
                "closed": False,
            }
            for a, b in topology.edges.values_list("source__node_id", "target__node_id")
        ],
    }
