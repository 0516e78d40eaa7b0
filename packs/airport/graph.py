"""The airport graph as plain data, and the deterministic BFS impact analysis, built
from the pack's models by packs/airport/world.py."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aero.packs import active_world
from aero.text import natural_key as _natural_key

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
        return self.node_id.rstrip("0123456789") if self.kind == "taxiway" else ""


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
        stands = sorted((n.node_id for n in nodes if n.kind == "stand"), key=_natural_key)
        return {
            "start": start,
            "radius": radius,
            "isolated_nodes": sorted(isolated, key=_natural_key),
            "taxiways": sorted({n.taxiway for n in nodes if n.kind == "taxiway"}),
            "runways": sorted({n.runway for n in nodes if n.kind == "runway"}),
            "stands": stands,
            "flights": self.flights_at(stands),
        }


def load_active_graph(stamp: tuple[Any, Any] | None = None) -> AirportGraph:
    """The active airport graph, built once per process and stamp (packs/airport/world.py);
    `stamp` as a job's lease read it."""
    graph: AirportGraph = active_world(stamp)
    return graph
