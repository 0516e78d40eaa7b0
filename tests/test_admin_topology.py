"""The airport topology in Django admin: nodes, edges, runway reference nodes and flights
edited on one page, validated as a graph before anything is saved, and drawn as an SVG.
Personas: root (superuser), tom (staff without topology permissions), olga (operator)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from packs.airport.graph import load_active_graph
from packs.airport.models import Flight, Runway, Topology, TopologyEdge, TopologyNode
from packs.airport.seed import AIRPORT_FILE
from packs.airport.topology import data_from_yaml, topology_issues
from scenarios_admin.builtin import read_yaml
from tests.admin_helpers import add_row, admin_client, form_data, row_prefix, staff_with

# --- the validator on plain data ---------------------------------------------------------


def airport() -> dict[str, Any]:
    return copy.deepcopy(read_yaml(AIRPORT_FILE))


def issues(data: dict[str, Any]) -> list[str]:
    return [str(i) for i in topology_issues(data_from_yaml(data))]


def test_the_shipped_airport_is_valid() -> None:
    assert issues(airport()) == []


def test_duplicate_ids_dangling_edges_and_unreachable_nodes() -> None:
    data = airport()
    data["nodes"].append({"id": "A1", "kind": "taxiway"})
    data["nodes"].append({"id": "Z1", "kind": "stand"})
    data["nodes"].append({"id": "Z2", "kind": "stand"})
    data["nodes"].append({"id": "Z3", "kind": "taxiway"})
    data["edges"] += [["A1", "Z9"], ["A2", "A1"], ["B1", "B1"], ["Z2", "Z3"]]

    assert issues(data) == [
        "nodes[28]: duplicate node id 'A1'",
        "edges[29]: A1 – Z9: dangling edge, 'Z9' is not a node",
        "edges[30]: A2 – A1: duplicate of edges[10] (edges are undirected)",
        "edges[31]: B1 – B1: an edge joins two different nodes",
        "nodes[29]: Z1 is unreachable (it has no edges)",
        "nodes[30]: Z2 is unreachable (no path to 101)",
        "nodes[31]: Z3 is unreachable (no path to 101)",
    ]


def test_runways_and_flights() -> None:
    data = airport()
    data["runways"]["06/24"]["reference_node"] = "A1"
    del data["runways"]["18/36"]
    data["flights"][0]["stand"] = "A3"
    data["nodes"][24]["runway"] = ""  # R0624-2 without its runway

    assert issues(data) == [
        "nodes[24]: R0624-2: a runway node names its runway (e.g. 06/24)",
        "runways[0]: 06/24: reference node A1 is not a node of this runway",
        "runways: runway 18/36 has nodes but no reference node",
        "flights[0]: CA1234: 'A3' is not a stand",
    ]


# --- the admin page ----------------------------------------------------------------------------


@pytest.fixture
def root(builtin: None) -> Client:
    return admin_client(User.objects.create_superuser("root", password="pw-for-tests"))


def url() -> str:
    return f"/admin/airport/topology/{Topology.objects.get().pk}/change/"


def page_data(client: Client) -> dict[str, Any]:
    response = client.get(url())
    assert response.status_code == 200
    data = form_data(response.content.decode(), "topology_form")
    data["_save"] = "Save"
    return data


def problems(response: Any) -> list[str]:
    body = response.content.decode()
    assert response.status_code == 200, "the save was not refused"
    start = body.index('data-testid="graph-issues"')
    items = body[start : body.index("</ul>", start)].split("<li>")[1:]
    return [item.split("</li>")[0].replace("&#x27;", "'") for item in items]


def edges() -> set[frozenset[str]]:
    return {
        frozenset(pair)
        for pair in TopologyEdge.objects.values_list("source__node_id", "target__node_id")
    }


@pytest.mark.services
def test_the_graph_is_drawn_as_an_svg(root: Client) -> None:
    body = root.get(url()).content.decode()

    start = body.index('<svg viewBox="0 0 980 480"')
    svg = body[start : body.index("</svg>", start)]
    assert svg.count('<g class="node ') == 28
    assert svg.count("<line ") == 29
    assert 'data-node="R0624-2"' in svg
    assert '<rect x="394" y="38"' in svg  # stand 105 at (410, 50)


@pytest.mark.services
def test_saving_unchanged_keeps_the_graph(root: Client) -> None:
    before = edges()
    assert root.post(url(), page_data(root)).status_code == 302
    assert edges() == before
    assert Runway.objects.get(designator="06/24").reference_node.node_id == "R0624-2"


@pytest.mark.services
def test_a_new_node_and_its_edge_in_one_save_change_the_impact_analysis(root: Client) -> None:
    assert load_active_graph().resolve("107") is None
    data = page_data(root)
    add_row(data, "nodes", node_id="107", kind="stand", x="560", y="50")
    add_row(data, "edges", source_id="107", target_id="A4")
    add_row(
        data,
        "flights",
        flight_no="HO1234",
        airline="Juneyao",
        aircraft="A321",
        registration="B-1000",
        stand_id="107",
        std="15:00",
        destination="ZSPD",
        pax="190",
    )

    assert root.post(url(), data).status_code == 302

    graph = load_active_graph()
    assert graph.impact("107", 1)["isolated_nodes"] == ["107", "A4"]
    assert graph.impact("A4", 1)["flights"] == ["HO1234"]
    assert 'data-node="107"' in root.get(url()).content.decode()


@pytest.mark.services
def test_a_dangling_edge_is_refused(root: Client) -> None:
    data = page_data(root)
    add_row(data, "edges", source_id="A1", target_id="Z9")

    assert problems(root.post(url(), data)) == [
        "Edge row 30: A1 – Z9: dangling edge, 'Z9' is not a node"
    ]
    assert TopologyEdge.objects.count() == 29


@pytest.mark.services
def test_an_unreachable_node_is_refused(root: Client) -> None:
    data = page_data(root)
    add_row(data, "nodes", node_id="Z1", kind="stand", x="5", y="5")
    add_row(data, "nodes", node_id="Z2", kind="taxiway", x="5", y="9")
    add_row(data, "edges", source_id="Z1", target_id="Z2")

    assert problems(root.post(url(), data)) == [
        "Node row 29: Z1 is unreachable (no path to 101)",
        "Node row 30: Z2 is unreachable (no path to 101)",
    ]
    assert not TopologyNode.objects.filter(node_id__startswith="Z").exists()


@pytest.mark.services
def test_a_duplicate_node_id_is_refused(root: Client) -> None:
    data = page_data(root)
    data[f"{row_prefix(data, 'nodes', 'node_id', 'A2')}-node_id"] = "A1"

    body = root.post(url(), data).content.decode()

    assert "Topology node with this Topology and Node id already exists." in body
    assert TopologyNode.objects.filter(node_id="A2").exists()


@pytest.mark.services
def test_a_renamed_node_keeps_its_edges_runway_and_flights(root: Client) -> None:
    data = page_data(root)
    data[f"{row_prefix(data, 'nodes', 'node_id', 'R0624-2')}-node_id"] = "R0624-M"
    data[f"{row_prefix(data, 'nodes', 'node_id', '105')}-node_id"] = "105A"

    assert root.post(url(), data).status_code == 302

    assert Runway.objects.get(designator="06/24").reference_node.node_id == "R0624-M"
    assert frozenset(("R0624-1", "R0624-M")) in edges()
    assert Flight.objects.get(flight_no="CA1234").stand.node_id == "105A"  # type: ignore[union-attr]
    assert load_active_graph().resolve("06/24").node_id == "R0624-M"  # type: ignore[union-attr]


@pytest.mark.services
def test_a_runway_reference_node_is_replaced_before_it_is_deleted(root: Client) -> None:
    def delete_r1836_2(data: dict[str, Any]) -> None:
        data[f"{row_prefix(data, 'nodes', 'node_id', 'R1836-2')}-DELETE"] = "on"
        for source in ("R1836-1", "R1836-2"):  # R1836-1 – R1836-2, R1836-2 – R0624-3
            data[f"{row_prefix(data, 'edges', 'source_id', source)}-DELETE"] = "on"

    data = page_data(root)
    data[f"{row_prefix(data, 'runways', 'designator', '18/36')}-reference_id"] = "R1836-1"
    delete_r1836_2(data)
    body = root.post(url(), data).content.decode()
    assert (
        "Deleting topology node R1836-2 would require deleting the following protected "
        "related objects: runway 18/36"
    ) in body

    data = page_data(root)
    data[f"{row_prefix(data, 'runways', 'designator', '18/36')}-reference_id"] = "R1836-1"
    assert root.post(url(), data).status_code == 302
    data = page_data(root)
    delete_r1836_2(data)
    data[f"{row_prefix(data, 'edges', 'source_id', 'D2')}-target_id"] = "R1836-1"
    add_row(data, "edges", source_id="R1836-1", target_id="R0624-3")
    assert root.post(url(), data).status_code == 302

    assert not TopologyNode.objects.filter(node_id="R1836-2").exists()
    assert Runway.objects.get(designator="18/36").reference_node.node_id == "R1836-1"
    assert load_active_graph().impact("R1836-1", 1)["isolated_nodes"] == [
        "D2",
        "R0624-3",
        "R1836-1",
    ]


@pytest.mark.services
def test_deleting_a_node_that_edges_still_use_is_refused(root: Client) -> None:
    data = page_data(root)
    data[f"{row_prefix(data, 'nodes', 'node_id', 'C1')}-DELETE"] = "on"

    assert problems(root.post(url(), data)) == [
        "Edge row 19: A1 – C1: dangling edge, 'C1' is not a node",
        "Edge row 20: C1 – R0624-1: dangling edge, 'C1' is not a node",
    ]
    assert TopologyNode.objects.filter(node_id="C1").exists()


@pytest.mark.services
def test_runway_reference_and_flight_stand_are_checked(root: Client) -> None:
    data = page_data(root)
    data[f"{row_prefix(data, 'runways', 'designator', '06/24')}-reference_id"] = "A1"
    data[f"{row_prefix(data, 'flights', 'flight_no', 'CA1234')}-stand_id"] = "A3"

    assert problems(root.post(url(), data)) == [
        "Runway row 1: 06/24: reference node A1 is not a node of this runway",
        "Flight row 1: CA1234: 'A3' is not a stand",
    ]


@pytest.mark.services
def test_only_one_topology_is_active(root: Client) -> None:
    response = root.post(
        "/admin/airport/topology/add/",
        {
            "icao": "ZZBB",
            "name": "Second",
            "is_active": "on",
            "_save": "Save",
            **{
                f"{prefix}-{key}": value
                for prefix in ("nodes", "edges", "runways", "flights")
                for key, value in (("TOTAL_FORMS", "0"), ("INITIAL_FORMS", "0"))
            },
        },
    )
    assert (
        "Only one topology is active (the agent&#x27;s impact analysis uses it): deactivate "
        "ZZAE first." in response.content.decode()
    )
    assert Topology.objects.count() == 1


@pytest.mark.services
def test_topology_pages_need_staff_and_permission(
    root: Client, make_user: Callable[..., User]
) -> None:
    olga = admin_client(make_user("olga", "operator"))
    response = olga.get(url())
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    tom = admin_client(staff_with("tom"))
    assert tom.get(url()).status_code == 403
    assert tom.post(url(), {"icao": "X"}).status_code == 403
    assert Topology.objects.get().icao == "ZZAE"
