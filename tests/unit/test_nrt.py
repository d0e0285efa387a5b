"""The published NRT contract: building, wire round trip, and errors that name the field."""

from __future__ import annotations

import copy
import dataclasses
import re

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.core import nrt

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.:/", min_size=1, max_size=20)


@st.composite
def topologies(draw: st.DrawFn) -> nrt.NodeResourceTopology:
    zones = []
    for i in range(draw(st.integers(0, 4))):
        resources = tuple(
            nrt.ZoneResource(
                name,
                *sorted(draw(st.lists(st.integers(0, 64), min_size=3, max_size=3)), reverse=True),
            )
            for name in draw(st.lists(NAMES, unique=True, max_size=3))
        )
        costs = tuple(
            nrt.Cost(f"node-{j}", draw(st.integers(0, 255))) for j in range(draw(st.integers(0, 3)))
        )
        attrs = tuple(
            nrt.Attribute(n, draw(NAMES)) for n in draw(st.lists(NAMES, unique=True, max_size=2))
        )
        zones.append(
            nrt.Zone(
                f"z{i}",
                draw(st.sampled_from(["Node", "PCIeRoot"])),
                draw(st.sampled_from(["", "node-0"])),
                costs,
                attrs,
                resources,
            )
        )
    attributes = (
        nrt.Attribute(nrt.ATTR_POLICY, draw(st.sampled_from(nrt.POLICIES))),
        nrt.Attribute(nrt.ATTR_SCOPE, draw(st.sampled_from(nrt.SCOPES))),
        nrt.Attribute(
            nrt.ATTR_ACCOUNTED_PODS,
            ",".join(sorted(draw(st.lists(NAMES, unique=True, max_size=3)))),
        ),
    )
    return nrt.NodeResourceTopology(
        draw(NAMES), tuple(zones), attributes, tuple(draw(st.lists(NAMES, max_size=1)))
    )


@given(topologies())
def test_round_trip(topology: nrt.NodeResourceTopology) -> None:
    obj = nrt.to_object(topology)
    assert nrt.from_object(obj) == topology
    assert nrt.to_object(nrt.from_object(obj)) == obj


def _hgx_like() -> nrt.NodeResourceTopology:
    devices = [
        nrt.Device(nrt.GPU, 0, "pci0000:15"),
        nrt.Device(nrt.HCA, 0, "pci0000:15", in_use=True),
        nrt.Device(nrt.GPU, 0, "pci0000:37", healthy=False),
        nrt.Device(nrt.GPU, 1, "pci0000:97"),
        nrt.Device(nrt.HCA, 1, "pci0000:97"),
        nrt.Device(nrt.HCA_SHARED, 1),
    ]
    return nrt.build(
        "gpu-1",
        devices,
        policy="single-numa-node",
        scope="pod",
        accounted_pods=["b/two", "a/one", "a/one"],
        distances={0: {0: 10, 1: 21}, 1: {0: 21, 1: 10}},
        shared_pool_hcas=[nrt.PoolHca(nrt.HCA_SHARED, 1, "pci0000:97")] * 2,
    )


def test_build_zones_roots_and_attributes() -> None:
    topology = _hgx_like()
    obj = nrt.to_object(topology)
    assert (
        obj["apiVersion"] == "topology.node.k8s.io/v1alpha2"
        and obj["kind"] == "NodeResourceTopology"
    )
    assert {a["name"]: a["value"] for a in obj["attributes"]} == {
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "pod",
        "rdmaplane.io/accounted-pods": "a/one,b/two",
    }
    zones = {z["name"]: z for z in obj["zones"]}
    assert [z["name"] for z in obj["zones"]] == [
        "node-0",
        "node-1",
        "pci0000:15",
        "pci0000:37",
        "pci0000:97",
    ]
    assert zones["node-0"]["costs"] == [
        {"name": "node-0", "value": 10},
        {"name": "node-1", "value": 21},
    ]
    gpu0 = next(r for r in zones["node-0"]["resources"] if r["name"] == nrt.GPU)
    assert gpu0 == {"name": nrt.GPU, "capacity": "2", "allocatable": "1", "available": "1"}
    hca0 = next(r for r in zones["node-0"]["resources"] if r["name"] == nrt.HCA)
    assert hca0["available"] == "0"
    assert zones["pci0000:97"]["parent"] == "node-1" and zones["pci0000:97"]["type"] == "PCIeRoot"
    assert zones["pci0000:97"]["attributes"] == [{"name": "rdmaplane.io/shared-hcas", "value": "2"}]
    assert [r["name"] for r in zones["pci0000:97"]["resources"]] == [nrt.GPU, nrt.HCA]
    assert topology.accounted_pods == {"a/one", "b/two"}
    assert nrt.free_by_numa(topology)["node-1"] == {nrt.GPU: 1, nrt.HCA: 1, nrt.HCA_SHARED: 1}
    assert nrt.free_by_root(topology, "node-0") == {
        "pci0000:15": {nrt.GPU: 1, nrt.HCA: 0},
        "pci0000:37": {nrt.GPU: 0},
    }


def test_unknown_numa_publishes_node_0() -> None:
    topology = nrt.build(
        "ws", [nrt.Device(nrt.GPU, -1, "pci0000:00"), nrt.Device(nrt.HCA, -1, "pci0000:80")]
    )
    assert [z.name for z in topology.numa_zones()] == ["node-0"]
    assert [z.name for z in topology.pcie_roots("node-0")] == ["pci0000:00", "pci0000:80"]
    assert (topology.policy, topology.scope) == ("none", "container")


def test_legacy_topology_policies_are_read() -> None:
    obj = {"metadata": {"name": "n"}, "topologyPolicies": ["SingleNUMANodePodLevel"], "zones": []}
    topology = nrt.from_object(obj)
    assert (topology.policy, topology.scope) == ("single-numa-node", "pod")


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("zones", 0, "resources", 0, "available"), "lots", "zones[0].resources[0].available"),
        (("zones", 0, "resources", 0, "capacity"), -1, "zones[0].resources[0].capacity"),
        (("zones", 1, "name"), 7, "zones[1].name"),
        (("zones", 0, "costs", 0, "value"), "10", "zones[0].costs[0].value"),
        (("attributes", 0, "value"), "always", "attributes[topologyManagerPolicy]"),
        (("metadata", "name"), "", "metadata.name"),
        (("zones",), {"a": 1}, "zones"),
        (("apiVersion",), "v1", "apiVersion"),
        (
            ("zones", 0, "resources", 0, "allocatable"),
            "1e999999999",
            "zones[0].resources[0].allocatable",
        ),
    ],
)
def test_malformed_objects_name_the_field(
    path: tuple[object, ...], value: object, field: str
) -> None:
    obj = copy.deepcopy(nrt.to_object(_hgx_like()))
    target = obj
    for key in path[:-1]:
        target = target[key]  # type: ignore[index]
    target[path[-1]] = value  # type: ignore[index]
    with pytest.raises(nrt.NrtError, match=rf"^{re.escape(field)}:"):
        nrt.from_object(obj)


def test_quantities_accept_int_string_and_other_producers_forms() -> None:
    obj = nrt.to_object(_hgx_like())
    obj["zones"][0]["resources"][0]["capacity"] = 2
    obj["zones"][0]["resources"].append(
        {"name": "cpu", "capacity": "1500m", "allocatable": "1e3", "available": "0.5"}
    )
    obj["zones"][0]["resources"].append(
        {"name": "memory", "capacity": "64Gi", "allocatable": "2k", "available": "0"}
    )
    zone = nrt.from_object(obj).zones[0]
    assert zone.resources[0].capacity == 2
    assert zone.resource("cpu") == nrt.ZoneResource("cpu", 2, 1000, 1)  # fractions round up
    assert zone.resource("memory") == nrt.ZoneResource("memory", 64 * 2**30, 2000, 0)


# ---------------------------------------------------------------- other writers

_MANAGERS = st.sampled_from(["rdmaplane", "nfd-topology-updater", "kubectl-edit", "exporter"])
_FIELDS = st.lists(
    st.sampled_from([*nrt.CONTENT_FIELDS, "f:metadata", "f:apiVersion"]), unique=True
).map(lambda keys: {k: {} for k in keys})
_ENTRIES = st.lists(
    st.fixed_dictionaries(
        {"manager": _MANAGERS, "operation": st.sampled_from(["Update", "Apply"]),
         "fieldsV1": _FIELDS},
        optional={"subresource": st.sampled_from(["", "status"])},
    )
)  # fmt: skip


@given(_ENTRIES)
def test_other_writers_are_the_other_managers_owning_content(entries: list[dict]) -> None:
    obj = {"metadata": {"name": "n", "managedFields": entries}}
    expected = {
        e["manager"]
        for e in entries
        if e["manager"] != "rdmaplane"
        and not e.get("subresource")
        and any(f in e["fieldsV1"] for f in nrt.CONTENT_FIELDS)
    }
    assert nrt.other_writers(obj, "rdmaplane") == sorted(expected)


@pytest.mark.parametrize(
    "obj",
    [{}, {"metadata": None}, {"metadata": {"managedFields": "x"}},
     {"metadata": {"managedFields": [None, {"manager": 3, "fieldsV1": {"f:zones": {}}}]}}],
)  # fmt: skip
def test_other_writers_of_odd_objects_are_none(obj: dict) -> None:
    assert nrt.other_writers(obj, "rdmaplane") == []


def _free(
    topology: nrt.NodeResourceTopology, zone: int, res: int, free: int
) -> nrt.NodeResourceTopology:
    """`topology` with `free` of its zone's resource available."""
    zones = list(topology.zones)
    resources = list(zones[zone].resources)
    resources[res] = msgspec.structs.replace(resources[res], available=free)
    zones[zone] = msgspec.structs.replace(zones[zone], resources=tuple(resources))
    return dataclasses.replace(topology, zones=tuple(zones))


@given(topologies(), st.data())
def test_frees_is_more_of_a_resource_free_in_some_zone(
    topology: nrt.NodeResourceTopology, data: st.DataObject
) -> None:
    assert not nrt.frees(topology, topology)
    spots = [(z, r) for z, zone in enumerate(topology.zones) for r in range(len(zone.resources))]
    if not spots:
        return
    z, r = data.draw(st.sampled_from(spots))
    was = topology.zones[z].resources[r].available
    now = data.draw(st.integers(0, 64))
    changed = _free(topology, z, r, now)
    assert nrt.frees(topology, changed) == (now > was)
    assert nrt.frees(changed, topology) == (was > now)
