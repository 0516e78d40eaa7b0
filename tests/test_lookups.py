"""The enrichment lookups (flight, flight plan, stand) answer from the job's airport graph:
what the topology tables hold, for every position and flight of the built-in
airport, and no query inside a step."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext

from diagnosis.agent import tools
from packs.airport import lookups
from packs.airport.graph import load_active_graph
from packs.airport.models import Flight, Topology, TopologyNode

pytestmark = pytest.mark.services


def stand_from_tables(topology: Topology, ref: str) -> dict[str, Any] | str:
    """What the stand lookup answered when it read the tables."""
    node: TopologyNode | None = topology.nodes.filter(node_id=ref.upper()).first()
    if node is None:
        runway = topology.runways.filter(designator=ref).select_related("reference_node").first()
        node = runway.reference_node if runway else None
    if node is None:
        return f"{ref} is not a position of {topology.icao}"
    ends = topology.edges.filter(Q(source=node) | Q(target=node)).values_list(
        "source__node_id", "target__node_id"
    )
    neighbours = [target if source == node.node_id else source for source, target in ends]
    return {
        "node_id": node.node_id,
        "kind": node.kind,
        "taxiway": node.taxiway,
        "runway": node.runway,
        "neighbours": lookups.natural_sorted(neighbours),
    }


def answer(source: Any, args: dict[str, Any]) -> dict[str, Any] | str:
    try:
        return dict(source(args))
    except tools.ToolFailure as exc:
        return str(exc)


def test_the_lookups_answer_what_the_topology_tables_hold(builtin: None) -> None:
    topology = Topology.objects.get(is_active=True)
    nodes = list(topology.nodes.values_list("node_id", flat=True))
    refs = [*nodes, *(n.lower() for n in nodes)]
    refs += list(topology.runways.values_list("designator", flat=True))
    refs += ["6/24", "Z99", ""]
    assert len(refs) > 40
    for ref in refs:
        assert answer(lookups.lookup_stand_location, {"position": ref}) == stand_from_tables(
            topology, ref
        ), ref

    flights = list(Flight.objects.filter(topology=topology).select_related("stand"))
    assert flights
    for flight in flights:
        assert answer(lookups.lookup_aircraft_info, {"flight_no": flight.flight_no}) == {
            "flight_no": flight.flight_no,
            "airline": flight.airline,
            "aircraft": flight.aircraft,
            "registration": flight.registration,
        }
        assert answer(lookups.lookup_flight_plan, {"flight_no": flight.flight_no}) == {
            "flight_no": flight.flight_no,
            "std": flight.std.strftime("%H:%M"),
            "destination": flight.destination,
            "pax": flight.pax,
            "stand": flight.stand.node_id if flight.stand else "",
        }
    assert answer(lookups.lookup_aircraft_info, {"flight_no": "XX9999"}) == (
        "flight XX9999 is not in the flight information system"
    )
    assert (
        answer(lookups.lookup_flight_plan, {"flight_no": "XX9999"}) == "no flight plan for XX9999"
    )


def test_inside_a_step_the_lookups_read_no_table(builtin: None) -> None:
    graph = load_active_graph()
    token = tools._lookup_world.set(graph)
    try:
        with CaptureQueriesContext(connection) as queries:
            lookups.lookup_aircraft_info({"flight_no": "CA1234"})
            lookups.lookup_flight_plan({"flight_no": "CA1234"})
            lookups.lookup_stand_location({"position": "105"})
    finally:
        tools._lookup_world.reset(token)
    assert len(queries) == 0
