"""What the apron's pages show of the airport: the impact map of a session's facts, the
consequences of its actions on the board, and the board page (/airport/: the runways,
taxiways and stands with the restrictions in force and the lifts waiting)."""

from __future__ import annotations

from typing import Any

from aero.roles import LIFT_RESTRICTIONS
from aero.text import natural_sorted
from diagnosis.models import ToolCall, ToolCallStatus
from packs.airport.board import Board
from packs.airport.graph import AirportGraph
from packs.airport.models import Restriction
from packs.airport.world import active_stamp, load_active_graph
from scenarios_admin.definition import LIFT_TOOL

MAP_TEMPLATE = "airport/_impact_map.html"


class ApronWorld:
    """The airport graph with the restrictions in force, read once for many sessions'
    panels (diagnosis.presenters.PageWorld)."""

    def __init__(
        self, graph: AirportGraph, in_force: list[Restriction], stamp: tuple[Any, Any]
    ) -> None:
        self.graph = graph
        self.in_force = in_force
        self.stamp = stamp

    def key(self) -> tuple[Any, ...]:
        """Everything the panels word with it: the topology's stamp (its graph) and
        every restriction in force, whole (diagnosis.page_panels keys on it)."""
        fields = Restriction._meta.concrete_fields
        return (
            tuple(self.stamp),
            tuple(tuple(getattr(r, f.attname) for f in fields) for r in self.in_force),
        )

    def board(self) -> Board:
        return Board(self.graph, self.in_force)

    def map(
        self, impact: dict[str, Any] | None, in_force: list[Any] | None = None
    ) -> dict[str, Any]:
        return impact_map(self.graph, impact, self.in_force if in_force is None else in_force)


def page_world(stamp: tuple[Any, Any] | None, in_force: list[Any]) -> ApronWorld:
    """The pages' world: the active graph (as `stamp` names it, or as it is now) with
    `in_force`; LookupError where no airport is loaded."""
    stamp = stamp or active_stamp()
    if stamp is None:
        raise LookupError("no active airport topology: load the built-in data or activate one")
    return ApronWorld(load_active_graph(stamp), in_force, stamp)


def impact_map(
    graph: AirportGraph, impact: dict[str, Any] | None, restrictions: list[Restriction]
) -> dict[str, Any]:
    """What airport/_impact_map.html draws: every node and edge, the isolated zone, the
    incident's position and what is closed or suspended (`template`: the core's pages
    include it by that name)."""
    isolated = set((impact or {}).get("isolated_nodes", []))
    start = (impact or {}).get("start")
    closed_taxiways = {r.target for r in restrictions if r.kind == Restriction.Kind.TAXIWAY}
    closed_runways = {r.target for r in restrictions if r.kind == Restriction.Kind.RUNWAY}
    closed_stands = {r.target for r in restrictions if r.kind == Restriction.Kind.STAND}

    def closed(node_id: str) -> bool:
        node = graph.nodes[node_id]
        return (
            node.taxiway in closed_taxiways
            or node.runway in closed_runways
            or node.node_id in closed_stands
        )

    nodes = [
        {
            "id": n.node_id,
            "kind": n.kind,
            "x": n.x,
            "y": n.y,
            "isolated": n.node_id in isolated,
            "start": n.node_id == start,
            "closed": closed(n.node_id),
        }
        for n in graph.nodes.values()
    ]
    edges = []
    for a, b in graph.edges:
        na, nb = graph.nodes[a], graph.nodes[b]
        edges.append(
            {
                "x1": na.x,
                "y1": na.y,
                "x2": nb.x,
                "y2": nb.y,
                "isolated": a in isolated and b in isolated,
                "closed": closed(a) and closed(b),
            }
        )
    return {"nodes": nodes, "edges": edges, "icao": graph.icao, "template": MAP_TEMPLATE}


def airport_board(
    graph: AirportGraph,
    active: list[Restriction],
    pending: dict[int, dict[str, Any]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Every runway, taxiway and stand with the restrictions in force on it, each with
    its lift request waiting for an approver (if any)."""
    by_target: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for restriction in active:
        by_target.setdefault((restriction.kind, restriction.target), []).append(
            {"r": restriction, "pending_lift": (pending or {}).get(restriction.pk)}
        )
    taxiways = sorted({n.taxiway for n in graph.nodes.values() if n.taxiway})
    stands = natural_sorted([n.node_id for n in graph.nodes.values() if n.kind == "stand"])
    flights_by_stand = {f.stand: f.flight_no for f in graph.flights.values()}

    def rows(kind: str, targets: list[str]) -> list[dict[str, Any]]:
        return [
            {
                "target": t,
                "restrictions": by_target.get((kind, t), []),
                "flight": flights_by_stand.get(t, "") if kind == "stand" else "",
            }
            for t in targets
        ]

    return {
        "runways": rows(Restriction.Kind.RUNWAY, sorted(graph.runways)),
        "taxiways": rows(Restriction.Kind.TAXIWAY, taxiways),
        "stands": rows(Restriction.Kind.STAND, stands),
    }


def board_page(roles: frozenset[str]) -> dict[str, Any]:
    """The board page for a role set (the page and the live consumer render the same)."""
    graph = load_active_graph()
    active = list(Restriction.objects.filter(lifted_at__isnull=True).select_related("session"))
    lifted = (
        Restriction.objects.filter(lifted_at__isnull=False)
        .select_related("session", "lifted_by")
        .order_by("-lifted_at")[:20]
    )
    return {
        "board": airport_board(graph, active, pending_lifts()),
        "map": impact_map(graph, None, active),
        "recently_lifted": lifted,
        "can_lift_restrictions": bool(roles & set(LIFT_RESTRICTIONS)),
    }


def pending_lifts() -> dict[int, dict[str, Any]]:
    """Lift requests not done yet, by restriction id: waiting for an approver, or
    approved and being sent to the airport operations system ("sending": a background
    job sends it and retries; the board changes when it answers)."""
    calls = ToolCall.objects.filter(
        tool_name=LIFT_TOOL,
        status__in=[ToolCallStatus.AWAITING_APPROVAL, ToolCallStatus.EXECUTING],
    )
    return {
        call.request_payload["restriction"]: {
            **call.request_payload,
            "sending": call.status == ToolCallStatus.EXECUTING,
        }
        for call in calls.only("request_payload", "status")
    }
