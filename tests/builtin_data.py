"""The built-in oil_spill definition and demo airport, straight from the product's data
files and without a database, for the pure (extraction and policy) tests."""

from __future__ import annotations

from functools import cache
from typing import Any

from packs.airport.graph import AirportGraph, FlightInfo, Node
from packs.airport.seed import AIRPORT_FILE
from scenarios_admin.builtin import DATA_DIR, read_yaml


@cache
def _oil_spill() -> dict[str, Any]:
    return read_yaml(DATA_DIR / "scenarios" / "oil_spill.yaml")


def oil_spill() -> dict[str, Any]:
    """The oil_spill definition as shipped (a fresh copy per call is not needed: the code
    under test never mutates a definition; tests must not either)."""
    return _oil_spill()


@cache
def _builtin(slug: str) -> dict[str, Any]:
    return read_yaml(DATA_DIR / "scenarios" / f"{slug}.yaml")


def builtin_definition(slug: str) -> dict[str, Any]:
    """A built-in scenario's definition as shipped (shared: never mutate it)."""
    return _builtin(slug)


BUILTIN_SLUGS = tuple(sorted(p.stem for p in (DATA_DIR / "scenarios").glob("*.yaml")))


@cache
def demo_graph() -> AirportGraph:
    """The demo airport as the product seeds it (packs/airport/data/airport.yaml)."""
    data = read_yaml(AIRPORT_FILE)
    nodes = {
        str(n["id"]): Node(
            str(n["id"]), n["kind"], str(n.get("runway", "")), n.get("x", 0), n.get("y", 0)
        )
        for n in data["nodes"]
    }
    adjacency: dict[str, set[str]] = {node_id: set() for node_id in nodes}
    edges = [(str(a), str(b)) for a, b in data["edges"]]
    for a, b in edges:
        adjacency[a].add(b)
        adjacency[b].add(a)
    runways = {
        designator: str(spec["reference_node"]) for designator, spec in data["runways"].items()
    }
    flights = {
        f["flight_no"]: FlightInfo(
            flight_no=f["flight_no"],
            airline=f["airline"],
            aircraft=f["aircraft"],
            registration=f["registration"],
            stand=str(f.get("stand", "")),
            std=f["std"],
            destination=f["destination"],
            pax=f["pax"],
        )
        for f in data["flights"]
    }
    return AirportGraph(
        data["airport"]["icao"], data["airport"]["name"], nodes, adjacency, edges, runways, flights
    )
