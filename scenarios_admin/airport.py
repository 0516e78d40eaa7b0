"""The airport graph as plain data, and the deterministic BFS impact analysis."""

from __future__ import annotations

import re
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from scenarios_admin.models import Flight, NodeKind, Runway, Topology, TopologyEdge, TopologyNode

RUNWAY_DESIGNATOR = re.compile(r"^\d{2}[LCR]?/\d{2}[LCR]?$")


@dataclass(frozen=True)
class Node:
    node_id: str
    kind: str
    runway: str = ""
    x: int = 0
    y: int = 0

    @property
    def taxiway(self) -> str:
        return self.node_id.rstrip("0123456789") if self.kind == NodeKind.TAXIWAY else ""


@dataclass(frozen=True)
class FlightInfo:
    flight_no: str
    airline: str
    aircraft: str
    registration: str
    stand: str
    std: str
    destination: str
    pax: int


@dataclass
class AirportGraph:
    icao: str
    name: str
    nodes: dict[str, Node]
    adjacency: dict[str, set[str]]
    edges: list[tuple[str, str]]
    runways: dict[str, str]  # designator -> reference node id
    flights: dict[str, FlightInfo] = field(default_factory=dict)

    def resolve(self, ref: str) -> Node | None:
        """A stand/taxiway id, or a runway designator (resolves to its reference node)."""
        ref = ref.strip()
        if ref in self.nodes:
            return self.nodes[ref]
        upper = ref.upper()
        if upper in self.nodes:
            return self.nodes[upper]
        if upper in self.runways:
            return self.nodes[self.runways[upper]]
        return None

    def flights_at(self, stands: list[str]) -> list[str]:
        wanted = set(stands)
        return sorted(f.flight_no for f in self.flights.values() if f.stand in wanted)

    def bfs(self, start: str, radius: int) -> list[str]:
        """Every node within `radius` hops over undirected edges, start included, BFS order."""
        seen = {start: 0}
        order = [start]
        queue: deque[str] = deque([start])
        while queue:
            current = queue.popleft()
            if seen[current] >= radius:
                continue
            for neighbour in sorted(self.adjacency.get(current, ()), key=_natural_key):
                if neighbour not in seen:
                    seen[neighbour] = seen[current] + 1
                    order.append(neighbour)
                    queue.append(neighbour)
        return order

    def impact(self, start: str, radius: int) -> dict[str, object]:
        isolated = self.bfs(start, radius)
        nodes = [self.nodes[n] for n in isolated]
        stands = sorted((n.node_id for n in nodes if n.kind == NodeKind.STAND), key=_natural_key)
        return {
            "start": start,
            "radius": radius,
            "isolated_nodes": sorted(isolated, key=_natural_key),
            "taxiways": sorted({n.taxiway for n in nodes if n.kind == NodeKind.TAXIWAY}),
            "runways": sorted({n.runway for n in nodes if n.kind == NodeKind.RUNWAY}),
            "stands": stands,
            "flights": self.flights_at(stands),
        }


def _natural_key(value: str) -> tuple[tuple[int, int | str], ...]:
    # Digit runs compare as numbers, chunk by chunk: "A10" after "A9", "R0624-3" before
    # "R1836-1". A digit chunk sorts before a letter chunk, so stands ("101") come first.
    return tuple(
        (0, int(chunk)) if chunk.isdigit() else (1, chunk)
        for chunk in re.findall(r"\d+|\D+", value)
    )


def natural_sorted(values: list[str]) -> list[str]:
    return sorted(values, key=_natural_key)


# The active graph, built once per process and rebuilt when its stamp changes. The stamp
# (active topology id, its updated_at) costs one indexed query; every save or delete of a
# node, edge, runway or flight touches its topology's updated_at (signals below), so an
# edit in any process (admin in the web process) reaches the consumers and workers.
_graph_cache: dict[str, tuple[tuple[int, datetime], AirportGraph]] = {}
_graph_lock = threading.Lock()


def load_active_graph(stamp: tuple[Any, Any] | None = None) -> AirportGraph:
    """The active topology's graph, built once per process and stamp. `stamp`: the
    active topology's (pk, updated_at) as the caller read it (a job reads it with its
    lease); read here otherwise."""
    if stamp is None:
        stamp = Topology.objects.filter(is_active=True).values_list("pk", "updated_at").first()
    if stamp is None:
        raise LookupError("no active airport topology: load the built-in data or activate one")
    cached = _graph_cache.get("active")
    if cached is not None and cached[0] == stamp:
        return cached[1]
    with _graph_lock:
        graph = load_graph(Topology.objects.get(pk=stamp[0]))
        _graph_cache["active"] = (stamp, graph)
    return graph


def forget_cached_graph() -> None:
    _graph_cache.clear()


def touch_topology(topology_id: Any) -> None:
    """Mark the topology changed: every process rebuilds its cached graph on next use."""
    forget_cached_graph()
    Topology.objects.filter(pk=topology_id).update(updated_at=timezone.now())


def _topology_part_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    if kwargs.get("raw"):
        return  # fixture loading: the topology row arrives with its own stamp
    touch_topology(instance.topology_id)


def _topology_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    forget_cached_graph()


for _model in (TopologyNode, TopologyEdge, Runway, Flight):
    post_save.connect(_topology_part_changed, sender=_model, dispatch_uid=f"graph-{_model}")
    post_delete.connect(_topology_part_changed, sender=_model, dispatch_uid=f"graph-d-{_model}")
post_save.connect(_topology_changed, sender=Topology, dispatch_uid="graph-topology")
post_delete.connect(_topology_changed, sender=Topology, dispatch_uid="graph-d-topology")


def load_graph(topology: Topology) -> AirportGraph:
    nodes = {n.node_id: Node(n.node_id, n.kind, n.runway, n.x, n.y) for n in topology.nodes.all()}
    adjacency: dict[str, set[str]] = {node_id: set() for node_id in nodes}
    edges: list[tuple[str, str]] = []
    for source, target in topology.edges.values_list("source__node_id", "target__node_id"):
        adjacency[source].add(target)
        adjacency[target].add(source)
        edges.append((source, target))
    runways = dict(topology.runways.values_list("designator", "reference_node__node_id"))
    flights = {
        f.flight_no: FlightInfo(
            flight_no=f.flight_no,
            airline=f.airline,
            aircraft=f.aircraft,
            registration=f.registration,
            stand=f.stand.node_id if f.stand else "",
            std=f.std.strftime("%H:%M"),
            destination=f.destination,
            pax=f.pax,
        )
        for f in Flight.objects.filter(topology=topology).select_related("stand")
    }
    return AirportGraph(topology.icao, topology.name, nodes, adjacency, edges, runways, flights)
