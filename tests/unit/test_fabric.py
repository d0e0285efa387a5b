"""The fabric model: locations from a fabric file and from node labels, distances, bad files,
and what gang schedulers get."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.adapters.config.fabric import fabric_from_document
from rdmaplane.core import fabric as fab
from rdmaplane.core.fabric_export import ExportError, kueue_topology, volcano_hypernodes
from tests.fabrics import leaf_spine, rail_optimised

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_four_leaves_of_sixteen_nodes() -> None:
    fabric = fabric_from_document(leaf_spine(4, 16))
    where = fabric.locations()
    assert len(where) == 64
    assert where["gpu-000"].tiers == ("leaf-0", "spine-0", "core")
    assert where["gpu-063"].tiers == ("leaf-3", "spine-1", "core")
    assert fab.hops(where["gpu-000"], where["gpu-015"]) == 1  # one leaf
    assert fab.hops(where["gpu-000"], where["gpu-016"]) == 3  # leaves 0 and 1 share spine-0
    assert fab.hops(where["gpu-000"], where["gpu-063"]) == 5  # through the core
    assert fab.closeness(where["gpu-000"], where["gpu-016"]) == 0.5
    shape = fab.tree(where)
    assert shape.depth == 3 and not shape.problems
    assert shape.ids(0) == [f"leaf-{i}" for i in range(4)]
    assert shape.children(2, "core") == ["spine-0", "spine-1"]


def test_rail_optimised_eight_rails() -> None:
    fabric = fabric_from_document(rail_optimised(units=2, per_unit=8, rails=8))
    where = fabric.locations()
    first, same_unit, other_unit = where["gpu-000"], where["gpu-007"], where["gpu-008"]
    # NIC r of every node plugs into rail r's leaf: the node's tier-0 is its unit's rail group
    assert first.tiers[0] == "su0" and other_unit.tiers[0] == "su1"
    assert first.rails == tuple((r, f"su0-rail{r}") for r in range(8))
    assert fab.hops(first, same_unit) == 1
    # rail r's leaves of both units share spine-rail r: one tier up, whatever the rail
    assert first.tiers[1] == other_unit.tiers[1] and fab.hops(first, other_unit) == 3


def test_rail_groups_without_names_get_one_stable_id_per_set_of_leaves() -> None:
    where = fabric_from_document(rail_optimised(2, 4, 8, groups=False)).locations()
    assert where["gpu-000"].tiers[0] == where["gpu-003"].tiers[0]
    assert where["gpu-000"].tiers[0] != where["gpu-004"].tiers[0]
    assert where["gpu-000"].tiers[0].startswith("rails-")


def test_a_miscabled_rail_costs_its_share_of_hops() -> None:
    doc = rail_optimised(2, 4, 8)
    # gpu-001's NIC 3 plugs into the other unit's rail-3 leaf
    link = next(x for x in doc["links"] if x["node"] == "gpu-001" and x["hca"] == "mlx5_3")
    link.update(switch="su1-rail3", switchPort="Ethernet9")
    where = fabric_from_document(doc).locations()
    odd = where["gpu-001"]
    assert odd.tiers[0] not in ("su0", "su1")  # under neither unit as a whole
    assert (3, "su1-rail3") in odd.rails
    # with a node of its own unit: seven rails on one leaf, one through the spine
    shared = fab.Location(where["gpu-000"].tiers, where["gpu-000"].rails)
    same_tier0 = fab.Location(shared.tiers, odd.rails)
    assert fab.hops(shared, same_tier0) == pytest.approx((7 * 1 + 3) / 8)


def _broken(edit: Any) -> str:
    doc = leaf_spine(2, 2)
    edit(doc)
    with pytest.raises(fab.FabricError) as exc:
        fabric_from_document(doc, "fabric.yaml")
    return str(exc.value)


def test_a_loop_is_named() -> None:
    def loop(doc: dict[str, Any]) -> None:
        doc["switches"][0]["parent"] = "spine-0"  # core above spine-0 above core

    assert _broken(loop) == "fabric.yaml: switches: loop core → spine-0 → core"


def test_unknown_nodes_and_switches_are_named() -> None:
    def node(doc: dict[str, Any]) -> None:
        doc["links"].append({"node": "gpu-099", "switch": "leaf-0"})

    def switch(doc: dict[str, Any]) -> None:
        doc["links"][1]["switch"] = "leaf-9"

    def parent(doc: dict[str, Any]) -> None:
        doc["switches"][2]["parent"] = "spine-7"

    assert _broken(node) == (
        "fabric.yaml: links[4]: unknown node 'gpu-099' (not listed under nodes)"
    )
    assert _broken(switch) == "fabric.yaml: links[1]: unknown switch 'leaf-9'"
    assert _broken(parent) == (
        "fabric.yaml: switches[2] (leaf-0): parent 'spine-7' is not a switch here"
    )


def test_two_tier0_switches_for_one_port_are_named() -> None:
    def twice(doc: dict[str, Any]) -> None:
        doc["links"] = [
            {"node": "gpu-000", "hca": "mlx5_0", "switch": "leaf-0"},
            {"node": "gpu-000", "hca": "mlx5_0", "port": 1, "switch": "leaf-1"},
        ]

    assert _broken(twice) == (
        "fabric.yaml: links[1]: gpu-000 mlx5_0 port 1 plugs into leaf-1, but links[0] plugs "
        "it into leaf-0: two tier-0 switches for one port"
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d.update(
                links=[
                    {"node": "gpu-001", "hca": "mlx5_1", "switch": "leaf-0", "switchPort": "E1"},
                    {"node": "gpu-000", "hca": "mlx5_1", "switch": "leaf-0", "switchPort": "E1"},
                ]
            ),
            "links[1]: leaf-0 port E1 is already cabled to gpu-001 mlx5_1 (links[0])",
        ),
        (
            lambda d: d["links"].append({"node": "gpu-000", "hca": "mlx5_1", "switch": "leaf-0"}),
            "links[4]: gpu-000 has both a whole-node link and per-HCA links",
        ),
        (
            lambda d: d["links"].append({"node": "gpu-003", "switch": "spine-0"}),
            "links[4]: spine-0 is a tier-1 switch; nodes plug into tier-0",
        ),
        (
            lambda d: d["switches"][0].update(tier=3),
            "switches[1] (spine-0): parent core is tier 3; the parent of a tier-1 switch must "
            "be tier 2",
        ),
        (
            lambda d: d["switches"].append({"name": "core", "tier": 2}),
            "switches[4]: switch 'core' is listed twice",
        ),
        (
            lambda d: d["links"][0].update(swichPort="E1"),
            "links[0].swichPort: unknown key (did you mean switchPort?)",
        ),
        (lambda d: d.update(kind="Fabrik"), "kind: Input should be 'Fabric'"),
        (
            lambda d: d["switches"][0].update(tier=-1),
            "switches[0].tier: Input should be greater than or equal to 0",
        ),
        (  # as the config files say it (the issue: `switches: Field required` alone)
            lambda d: d.update(switchs=d.pop("switches")),
            "switches: Field required; switchs: unknown key (did you mean switches?)",
        ),
    ],
)
def test_other_bad_files_say_where_and_what(edit: Any, message: str) -> None:
    assert _broken(edit) == f"fabric.yaml: {message}"


@pytest.mark.parametrize(
    ("labels", "tiers"),
    [
        (
            {"fabric.topograph.run/tier-0": "S-1", "fabric.topograph.run/tier-1": "S-9"},
            ("S-1", "S-9"),
        ),
        (
            {
                "network.topology.nvidia.com/leaf": "l1",
                "network.topology.nvidia.com/spine": "s1",
                "network.topology.nvidia.com/core": "c1",
            },
            ("l1", "s1", "c1"),
        ),
        (
            {
                "network.topology.nvidia.com/block": "b7",
                "network.topology.nvidia.com/spine": "s2",
                "network.topology.nvidia.com/datacenter": "dc",
            },
            ("b7", "s2", "dc"),
        ),
        (
            {
                "cloud.google.com/gce-topology-block": "blk",
                "cloud.google.com/gce-topology-subblock": "sub",
                "cloud.google.com/gce-topology-host": "host",
            },
            ("sub", "blk"),
        ),
        (
            {f"topology.k8s.aws/network-node-layer-{i}": f"nn-{i}" for i in (1, 2, 3)},
            ("nn-3", "nn-2", "nn-1"),
        ),
        (
            {f"topology.k8s.aws/network-node-layer-{i}": f"nn-{i}" for i in (1, 2, 3, 4)},
            ("nn-4", "nn-3", "nn-2", "nn-1"),
        ),
        (
            {
                "oci.oraclecloud.com/rdma.hpc_island_id": "isl",
                "oci.oraclecloud.com/rdma.network_block_id": "nb",
                "oci.oraclecloud.com/rdma.local_block_id": "lb",
            },
            ("lb", "nb", "isl"),
        ),
        ({"topology.kubernetes.io/zone": "z1"}, None),
    ],
    ids=["topograph", "topograph-leaf", "topograph-block", "gke", "eks", "eks-4", "oci", "none"],
)
def test_locations_from_the_labels_clusters_carry(
    labels: dict[str, str], tiers: tuple[str, ...] | None
) -> None:
    found = fab.location_from_labels(labels)
    assert (found.tiers if found else None) == tiers


def test_eks_nodes_with_and_without_the_fourth_layer_still_meet() -> None:
    three = fab.location_from_labels(
        {f"topology.k8s.aws/network-node-layer-{i}": f"nn-{i}" for i in (1, 2, 3)}
    )
    four = fab.location_from_labels(
        {f"topology.k8s.aws/network-node-layer-{i}": f"nn-{i}" for i in (1, 2, 3, 4)}
    )
    assert three and four and fab.hops(three, four) == 2  # nn-4 → nn-3 where the other sits


def test_tier_keys_are_configurable() -> None:
    schemes = [["example.com/rack", "example.com/row"]]
    labels = {"example.com/rack": "r1", "example.com/row": "w1", "fabric.topograph.run/tier-0": "x"}
    found = fab.location_from_labels(labels, schemes)
    assert found and found.tiers == ("r1", "w1")


def test_contradicting_labels_are_reported_not_trusted() -> None:
    where = {
        "a": fab.Location(("leaf-1", "spine-1")),
        "b": fab.Location(("leaf-1", "spine-2")),
        "c": fab.Location(("spine-1", "core")),
    }
    shape = fab.tree(where)
    assert shape.problems == (
        "b: tier-0 leaf-1 sits under spine-2 here but under spine-1 elsewhere",
        "c: spine-1 is tier 0 here but tier 1 elsewhere",
    )
    assert shape.nodes_under == {"leaf-1": ("a",)}


def test_label_values_for_switch_names() -> None:
    assert fab.label_value("leaf-1.dc1") == "leaf-1.dc1"
    mac = fab.label_value("5e:6f:06:dc:0f:f2")
    assert LABEL_VALUE.match(mac) and mac != fab.label_value("5e:6f:06:dc:0f:f3")
    assert fab.tier_labels(fab.Location(("a", "b")), fab.DEFAULT_TIER_LABELS) == {
        "fabric.topograph.run/tier-0": "a",
        "fabric.topograph.run/tier-1": "b",
    }


@given(st.text(max_size=120))
@settings(max_examples=300, deadline=None)
def test_label_values_and_object_names_are_always_valid(name: str) -> None:
    value = fab.label_value(name)
    assert len(value) <= 63 and LABEL_VALUE.match(value) and value
    assert DNS_LABEL.match(fab.object_name("tier1", name)) and len(fab.object_name("t", name)) <= 63


locations = st.builds(
    fab.Location,
    st.lists(st.sampled_from(["l1", "l2", "s1", "s2", "c"]), max_size=3, unique=True).map(tuple),
)


@given(locations, locations)
@settings(max_examples=200, deadline=None)
def test_distance_is_symmetric_and_closeness_bounded(a: fab.Location, b: fab.Location) -> None:
    assert fab.hops(a, b) == fab.hops(b, a)
    assert 0 < fab.closeness(a, b) <= 1
    if a.tiers:
        assert fab.hops(a, a) == 1 and fab.closeness(a, a) == 1


def test_kueue_topology_levels_widest_first() -> None:
    topo = kueue_topology("rdma", fab.DEFAULT_TIER_LABELS, 3)
    assert topo["apiVersion"] == "kueue.x-k8s.io/v1beta2" and topo["kind"] == "Topology"
    assert [lvl["nodeLabel"] for lvl in topo["spec"]["levels"]] == [
        "fabric.topograph.run/tier-2",
        "fabric.topograph.run/tier-1",
        "fabric.topograph.run/tier-0",
        "kubernetes.io/hostname",
    ]
    with pytest.raises(ExportError, match="3 tiers but only 2 tier label keys"):
        kueue_topology("rdma", fab.DEFAULT_TIER_LABELS[:2], 3)
    with pytest.raises(ExportError, match="no node has a fabric tier"):
        kueue_topology("rdma", fab.DEFAULT_TIER_LABELS, 0)


def test_volcano_hypernodes_form_the_tree() -> None:
    nodes = volcano_hypernodes(fab.tree(fabric_from_document(leaf_spine(4, 16)).locations()))
    by_tier: dict[int, list[dict[str, Any]]] = {}
    for n in nodes:
        by_tier.setdefault(n["spec"]["tier"], []).append(n)
    assert sorted(by_tier) == [1, 2, 3] and [len(by_tier[t]) for t in (1, 2, 3)] == [4, 2, 1]
    leaf0 = next(n for n in by_tier[1] if n["metadata"]["name"] == "tier1-leaf-0")
    assert [m["selector"]["exactMatch"]["name"] for m in leaf0["spec"]["members"]] == [
        f"gpu-{i:03d}" for i in range(16)
    ]
    assert {m["type"] for n in by_tier[2] for m in n["spec"]["members"]} == {"HyperNode"}
    core = by_tier[3][0]
    assert [m["selector"]["exactMatch"]["name"] for m in core["spec"]["members"]] == [
        "tier2-spine-0",
        "tier2-spine-1",
    ]


def test_documents_are_not_modified() -> None:
    doc = rail_optimised(1, 2, 2)
    before = copy.deepcopy(doc)
    fabric_from_document(doc)
    assert doc == before
