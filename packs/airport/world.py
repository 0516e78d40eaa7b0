"""The airport world read from its models: the active topology's graph, built once per
process and stamp, and the signals that keep every process's copy current."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from aero.compiled import Compiled
from packs.airport.graph import AirportGraph, FlightInfo, Node
from packs.airport.models import Flight, Runway, Topology, TopologyEdge, TopologyNode

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
        stamp = active_stamp()
    if stamp is None:
        raise LookupError("no active airport topology: load the built-in data or activate one")
    cached = _graph_cache.get("active")
    if cached is not None and cached[0] == stamp:
        return cached[1]
    with _graph_lock:
        graph = load_graph(Topology.objects.get(pk=stamp[0]))
        _graph_cache["active"] = (stamp, graph)
    return graph


# Read for every session page (its panels' key): compiled once per connection.
_stamp = Compiled(
    Topology,
    lambda: (
        Topology.objects.filter(is_active=True).order_by("pk").values_list("pk", "updated_at")[:1]
    ),
)


def active_stamp() -> tuple[Any, Any] | None:
    """The active topology's (pk, updated_at): what names its graph (None: no airport)."""
    found: tuple[Any, Any] | None = _stamp.first()
    return found


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


def connect_signals() -> None:
    """Called from the pack's ready(): an edit anywhere reaches every cached graph."""
    for model in (TopologyNode, TopologyEdge, Runway, Flight):
        post_save.connect(_topology_part_changed, sender=model, dispatch_uid=f"graph-{model}")
        post_delete.connect(_topology_part_changed, sender=model, dispatch_uid=f"graph-d-{model}")
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
