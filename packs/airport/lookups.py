"""The airport's lookups (flight, flight plan, position), run before the agent reasons:
each answers from the airport graph the step's job holds (diagnosis.agent.tools.
lookup_world), with no query inside a step; and the one warning read from what they
found (a flight planned at another stand than the position given)."""

from __future__ import annotations

from typing import Any

from django.utils import translation
from django.utils.functional import Promise
from django.utils.translation import gettext, gettext_lazy

from aero.packs import LookupTool
from aero.text import natural_sorted
from diagnosis.agent.tools import ToolFailure, lookup_world
from packs.airport.arguments import SCHEMAS
from packs.airport.graph import AirportGraph
from packs.airport.world import load_active_graph

# Why a lookup failed, as the log keeps it (English); pages word it per reader.
FAILURES: dict[str, Promise] = {
    "no_topology": gettext_lazy("no active airport topology"),
    "no_flight": gettext_lazy("flight %(flight)s is not in the flight information system"),
    "no_flight_plan": gettext_lazy("no flight plan for %(flight)s"),
    "no_position": gettext_lazy("%(position)s is not a position of %(airport)s"),
}


def failure(code: str, **params: Any) -> str:
    """The failure `code` as the log keeps it: in English."""
    with translation.override("en"):
        return str(FAILURES[code]) % params


def _graph() -> AirportGraph:
    graph = lookup_world()
    if graph is not None:
        return graph
    try:
        return load_active_graph()
    except LookupError:
        raise ToolFailure(failure("no_topology")) from None


def lookup_aircraft_info(args: dict[str, Any]) -> dict[str, Any]:
    flight = _graph().flights.get(args["flight_no"])
    if flight is None:
        raise ToolFailure(failure("no_flight", flight=args["flight_no"]))
    return {
        "flight_no": flight.flight_no,
        "airline": flight.airline,
        "aircraft": flight.aircraft,
        "registration": flight.registration,
    }


def lookup_flight_plan(args: dict[str, Any]) -> dict[str, Any]:
    flight = _graph().flights.get(args["flight_no"])
    if flight is None:
        raise ToolFailure(failure("no_flight_plan", flight=args["flight_no"]))
    return {
        "flight_no": flight.flight_no,
        "std": flight.std,
        "destination": flight.destination,
        "pax": flight.pax,
        "stand": flight.stand,
    }


def lookup_stand_location(args: dict[str, Any]) -> dict[str, Any]:
    graph = _graph()
    ref = str(args["position"])
    # A node by its id (as the operator may type it in lower case), else a runway by its
    # designator, as written.
    node = graph.nodes.get(ref.upper())
    if node is None and ref in graph.runways:
        node = graph.nodes.get(graph.runways[ref])
    if node is None:
        raise ToolFailure(failure("no_position", position=ref, airport=graph.icao))
    # Every edge that ends at the node, as stored (one neighbour per edge).
    neighbours = [
        target if source == node.node_id else source
        for source, target in graph.edges
        if node.node_id in (source, target)
    ]
    return {
        "node_id": node.node_id,
        "kind": node.kind,
        "taxiway": node.taxiway,
        "runway": node.runway,
        "neighbours": natural_sorted(neighbours),
    }


# Where each answer lands in the enrichment (report templates use these names).
LOOKUPS: dict[str, LookupTool] = {
    name: LookupTool(name, run, key, schema=SCHEMAS[name][0], description=SCHEMAS[name][1])
    for name, run, key in (
        ("lookup_aircraft_info", lookup_aircraft_info, "aircraft"),
        ("lookup_flight_plan", lookup_flight_plan, "flight_plan"),
        ("lookup_stand_location", lookup_stand_location, "stand_location"),
    )
}


def stand_mismatch(enrichment: Any) -> dict[str, str] | None:
    """The flight plan's stand, when the position the operator gave is another stand:
    one of the two is wrong, and the impact analysis starts at the position given (a
    closure proposed for stand 106 while the aircraft stands at 105). None when they
    agree, when the position is not a stand (a taxiing aircraft is not at its stand), or
    when either lookup is missing."""
    if not isinstance(enrichment, dict):
        return None
    plan = enrichment.get("flight_plan") or {}
    where = enrichment.get("stand_location") or {}
    if not isinstance(plan, dict) or not isinstance(where, dict) or where.get("kind") != "stand":
        return None
    planned, reported = str(plan.get("stand") or ""), str(where.get("node_id") or "")
    if not planned or not reported or planned == reported:
        return None
    return {"flight_no": str(plan.get("flight_no") or ""), "planned": planned, "reported": reported}


def stand_mismatch_text(enrichment: Any) -> str:
    """The warning for a flight planned at another stand than the position given, in
    the viewer's language; "" when none."""
    found = stand_mismatch(enrichment)
    if found is None:
        return ""
    return gettext(
        "The flight plan puts %(flight)s at stand %(planned)s, not %(reported)s as reported:"
        " the impact analysis starts at %(reported)s. Check which is right and correct the"
        " position if it is wrong."
    ) % {"flight": found["flight_no"], "planned": found["planned"], "reported": found["reported"]}
