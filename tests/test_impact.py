"""Impact analysis on the demo airport as the product loads it (database topology)."""

from __future__ import annotations

import pytest

from aero.text import natural_sorted
from packs.airport.graph import AirportGraph, load_active_graph
from scenarios_admin.builtin import load_builtin_data
from tests.builtin_data import demo_graph


@pytest.fixture
def airport(db: None) -> AirportGraph:
    load_builtin_data()
    return load_active_graph()


def test_worked_example_one_fuel_high_at_stand_105(airport: AirportGraph) -> None:
    impact = airport.impact("105", 3)
    assert impact == {
        "start": "105",
        "radius": 3,
        "isolated_nodes": ["103", "104", "105", "106", "A1", "A2", "A3", "A4", "A5", "B1"],
        "taxiways": ["A", "B"],
        "runways": [],
        "stands": ["103", "104", "105", "106"],
        "flights": ["3U8888", "CA1234", "HU7601", "ZH9527"],
    }


def test_worked_example_two_hydraulic_low_at_stand_101(airport: AirportGraph) -> None:
    assert airport.impact("101", 1) == {
        "start": "101",
        "radius": 1,
        "isolated_nodes": ["101", "A1"],
        "taxiways": ["A"],
        "runways": [],
        "stands": ["101"],
        "flights": ["MU5678"],
    }


def test_radius_zero_isolates_the_start_only(airport: AirportGraph) -> None:
    impact = airport.impact("B2", 0)
    assert impact["isolated_nodes"] == ["B2"]
    assert impact["taxiways"] == ["B"]
    assert impact["stands"] == []
    assert impact["flights"] == []


def test_a_runway_designator_resolves_to_its_reference_node(airport: AirportGraph) -> None:
    node = airport.resolve("06/24")
    assert node is not None
    assert (node.node_id, node.kind, node.runway) == ("R0624-2", "runway", "06/24")
    reference = airport.resolve("18/36")
    assert reference is not None
    assert reference.node_id == "R1836-2"
    assert airport.resolve("09/27") is None


def test_runway_impact_starts_at_the_reference_node(airport: AirportGraph) -> None:
    node = airport.resolve("06/24")
    assert node is not None
    impact = airport.impact(node.node_id, 1)
    assert impact["isolated_nodes"] == ["R0624-1", "R0624-2", "R0624-3"]
    assert impact["runways"] == ["06/24"]
    assert impact["taxiways"] == []


def test_taxiway_c1_one_hop_reaches_runway_06_24(airport: AirportGraph) -> None:
    impact = airport.impact("C1", 1)
    assert impact["isolated_nodes"] == ["A1", "C1", "R0624-1"]
    assert impact["taxiways"] == ["A", "C"]
    assert impact["runways"] == ["06/24"]
    assert impact["stands"] == []


def test_edges_are_undirected(airport: AirportGraph) -> None:
    # The data lists ["105", A3], [A2, A3] and [A3, A4]: A3 reaches all three, and
    # each of them reaches A3, whichever end the edge was written from.
    assert sorted(airport.bfs("A3", 1)) == ["105", "106", "A2", "A3", "A4"]
    for node in ("105", "A2", "A4"):
        assert "A3" in airport.bfs(node, 1)


def test_the_seed_file_graph_used_by_the_pure_tests_is_the_loaded_graph(
    airport: AirportGraph,
) -> None:
    from_file = demo_graph()
    assert from_file.nodes == airport.nodes
    assert from_file.adjacency == airport.adjacency
    assert from_file.runways == airport.runways
    assert from_file.flights == airport.flights


def test_node_lists_read_in_natural_order() -> None:
    # Stands (plain numbers) first, then letters; digit runs compare as numbers.
    nodes = ["R1836-1", "A10", "R0624-3", "B1", "A9", "1010", "102", "R0624-10"]
    assert natural_sorted(nodes) == [
        "102",
        "1010",
        "A9",
        "A10",
        "B1",
        "R0624-3",
        "R0624-10",
        "R1836-1",
    ]
