"""What the agent publishes: labels, the RDMAReady condition, the topology annotation, the NRT."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmaplane.core import nrt
from rdmaplane.core.allocation import Allocations, PodDevices, merge_containers
from rdmaplane.core.model import NetnsMode, NodeTopology
from rdmaplane.core.netns import shared_pools_blocked
from rdmaplane.core.porthealth import ERRORS_RISING, Symptom
from rdmaplane.core.usability import PORT_DOWN
from rdmaplane.services.agent.policy.desired import (
    LABELS,
    PoolGid,
    gid_label,
    owned_labels,
    rdma_ready,
    topology_annotation,
)
from rdmaplane.services.agent.policy.health import HcaHealth
from rdmaplane.services.agent.policy.inventory import Offered, gpu_ids, nrt_object

GPU = "nvidia.com/gpu"
HCA = "rdmaplane.io/hca"


@pytest.fixture
def hgx(sample_nodes: dict[str, NodeTopology]) -> NodeTopology:
    return sample_nodes["hgx-h100-roce"]


def healthy(topo: NodeTopology) -> dict[str, HcaHealth]:
    return {h.name: HcaHealth(h.name) for h in topo.hcas}


# ---------------------------------------------------------------- labels


def test_owned_labels_remove_what_no_longer_holds(hgx: NodeTopology):
    labels = owned_labels(nrt.node_labels(hgx, gid_index=3))
    assert labels == {
        nrt.LABEL_RDMA: "true",
        nrt.LABEL_LINK_LAYER: "Ethernet",
        nrt.LABEL_RATE_GBPS: "400",
        nrt.LABEL_GID_INDEX: "3",
        nrt.LABEL_RDMA_NETNS: "shared",
    }
    assert owned_labels(nrt.node_labels(hgx))[nrt.LABEL_GID_INDEX] is None
    assert owned_labels({}) == dict.fromkeys(LABELS)
    assert set(LABELS) == {k for k in labels if k.startswith("rdmaplane.io/")}


@pytest.mark.parametrize("mode", list(NetnsMode))
def test_the_netns_label_says_the_mode_when_known(hgx: NodeTopology, mode: NetnsMode):
    labels = owned_labels(nrt.node_labels(replace(hgx, netns_mode=mode)))
    assert labels[nrt.LABEL_RDMA_NETNS] == (None if mode is NetnsMode.UNKNOWN else mode.value)


# ---------------------------------------------------------------- condition


def test_ready_when_all_managed_are_healthy():
    c = rdma_ready(
        ["mlx5_1", "mlx5_0"], {"mlx5_0": HcaHealth("mlx5_0"), "mlx5_1": HcaHealth("mlx5_1")}
    )
    assert (c.status, c.reason) == (True, "AllDevicesHealthy")
    assert c.message == "2 healthy: mlx5_0, mlx5_1"


def test_not_ready_names_the_broken_device_and_why():
    health = {
        "mlx5_0": HcaHealth("mlx5_0"),
        "mlx5_1": HcaHealth("mlx5_1", (Symptom(PORT_DOWN, "port 1 DOWN (DISABLED)"),)),
    }
    c = rdma_ready(["mlx5_0", "mlx5_1"], health)
    assert (c.status, c.reason) == (False, "PortDown")
    assert c.message == "1 of 2 unhealthy: mlx5_1: port 1 DOWN (DISABLED)"


def test_counter_problem_reason_and_missing_device():
    errors = HcaHealth("mlx5_0", (Symptom(ERRORS_RISING, "port 1 symbol_error +200"),))
    c = rdma_ready(["mlx5_0"], {"mlx5_0": errors})
    assert (c.status, c.reason) == (False, "ErrorCountersRising")
    gone = rdma_ready(["mlx5_0", "mlx5_9"], {"mlx5_0": HcaHealth("mlx5_0")})
    assert (gone.status, gone.reason) == (False, "DeviceMissing")
    assert "mlx5_9: not present" in gone.message


def test_no_devices_is_not_ready():
    c = rdma_ready([], {})
    assert (c.status, c.reason) == (False, "NoRdmaDevices")


def test_a_gid_mismatch_is_said_without_making_the_node_unready():
    problem = "NCCL_IB_GID_INDEX differs between device plugin pools (a → 3, b → 2)"
    c = rdma_ready(["mlx5_0"], {"mlx5_0": HcaHealth("mlx5_0")}, problem)
    assert (c.status, c.reason) == (True, "GidIndexMismatch")
    assert c.message == f"1 healthy: mlx5_0; {problem}"
    down = HcaHealth("mlx5_0", (Symptom(PORT_DOWN, "port 1 DOWN (DISABLED)"),))
    c = rdma_ready(["mlx5_0"], {"mlx5_0": down}, problem)
    assert (c.status, c.reason) == (False, "PortDown") and c.message.endswith(f"; {problem}")


def test_shared_pools_blocked_by_exclusive_mode_come_first():
    problem = shared_pools_blocked(NetnsMode.EXCLUSIVE, [("example.com/shared", ["mlx5_0"])])
    assert problem is not None
    down = HcaHealth("mlx5_0", (Symptom(PORT_DOWN, "port 1 DOWN (DISABLED)"),))
    c = rdma_ready(["mlx5_0"], {"mlx5_0": down}, "a gid mismatch", problem)
    assert (c.status, c.reason, c.message) == (False, "NetnsExclusive", problem)
    assert rdma_ready([], {}, None, problem).reason == "NoRdmaDevices"


# ---------------------------------------------------------------- the GID index label


@pytest.mark.parametrize(
    ("pools", "label", "problem"),
    [
        ([PoolGid("a", True, 3)], 3, None),
        ([PoolGid("a", True, 3), PoolGid("b", True, 3)], 3, None),
        ([PoolGid("a", True, 3), PoolGid("ib", False, None)], 3, None),  # IB needs no index
        ([PoolGid("ib", False, None)], None, None),
        ([], None, None),
        ([PoolGid("a", True, 3), PoolGid("auto", True, None)], None, None),  # NCCL picks there
        (
            [PoolGid("b", True, 2), PoolGid("a", True, 3), PoolGid("auto", True, None)],
            None,
            "NCCL_IB_GID_INDEX differs between device plugin pools (a → 3, b → 2)",
        ),
    ],
)
def test_gid_label_names_only_what_every_pool_injects(
    pools: list[PoolGid], label: int | None, problem: str | None
):
    assert gid_label(pools) == (label, problem)


@given(st.lists(st.tuples(st.booleans(), st.one_of(st.none(), st.integers(0, 8))), max_size=5))
def test_a_gid_label_is_what_every_roce_pool_injects(found: list[tuple[bool, int | None]]):
    pools = [
        PoolGid(f"p{i}", roce, index if roce else None) for i, (roce, index) in enumerate(found)
    ]
    label, problem = gid_label(pools)
    injected = {p.index for p in pools if p.roce}
    assert (label is not None) == (len(injected) == 1 and None not in injected)
    if label is not None:
        assert injected == {label} and problem is None
    assert (problem is not None) == (len(injected - {None}) > 1)


# ---------------------------------------------------------------- annotation


def test_annotation_is_compact_json_with_numa_and_roots(hgx: NodeTopology):
    health = healthy(hgx)
    health["mlx5_2"] = HcaHealth("mlx5_2", (Symptom(PORT_DOWN, "port 1 DOWN (DISABLED)"),))
    text = topology_annotation(hgx, health, gpu_ids(hgx))
    assert " " not in text
    doc = json.loads(text)
    assert doc["v"] == 1
    assert [g["index"] for g in doc["gpus"]] == list(range(8))
    gpu0 = doc["gpus"][0]
    assert gpu0["id"] == hgx.gpus[0].uuid and gpu0["id"].startswith("GPU-")
    assert (gpu0["numa"], gpu0["pcieRoot"]) == (0, "pci0000:15")
    hcas = {h["name"]: h for h in doc["hcas"]}
    assert hcas["mlx5_0"] == {
        "name": "mlx5_0",
        "numa": 0,
        "pcieRoot": "pci0000:15",
        "healthy": True,
        "linkLayer": "Ethernet",
        "rateGbps": 400.0,
        "netdev": "ens108np0",
    }
    assert hcas["mlx5_2"]["healthy"] is False
    assert topology_annotation(hgx, health, gpu_ids(hgx)) == text  # deterministic


# ---------------------------------------------------------------- NRT


def exclusive(topo: NodeTopology, names: list[str] | None = None) -> list[Offered]:
    return [
        Offered("rdmaplane.io/hca", h.pci.address, (h.name,))
        for h in topo.hcas
        if h.pci and (names is None or h.name in names)
    ]


COMPUTE = [f"mlx5_{i}" for i in range(8)]  # the HGX sample's 400G NICs (not the storage bond)


def zones(obj: dict) -> dict[str, nrt.Zone]:
    return {z.name: z for z in nrt.from_object(obj).zones}


def test_nrt_zones_per_numa_and_pcie_root(hgx: NodeTopology):
    obj = nrt_object(
        "hgx-h100-017",
        hgx,
        exclusive(hgx, COMPUTE),
        healthy(hgx),
        Allocations(),
        gpu_resource=GPU,
        policy="single-numa-node",
        scope="container",
    )
    parsed = nrt.from_object(obj)
    assert (parsed.name, parsed.policy, parsed.scope) == (
        "hgx-h100-017",
        "single-numa-node",
        "container",
    )
    z = zones(obj)
    assert [c.value for c in z["node-0"].costs] == [10, 21]
    for numa in ("node-0", "node-1"):
        assert z[numa].resource(GPU) == nrt.ZoneResource(GPU, 4, 4, 4)
        assert z[numa].resource("rdmaplane.io/hca") == nrt.ZoneResource("rdmaplane.io/hca", 4, 4, 4)
    root = z["pci0000:15"]
    assert (root.type, root.parent) == ("PCIeRoot", "node-0")
    assert root.available(GPU) == 1 and root.available("rdmaplane.io/hca") == 1


def test_available_follows_allocations_and_health(hgx: NodeTopology):
    gpu0, mlx5_0 = hgx.gpus[0], hgx.hca("mlx5_0")
    pod = merge_containers(
        "team", "train-0", [[(GPU, [gpu0.uuid])], [("rdmaplane.io/hca", [mlx5_0.pci.address])]]
    )
    other = PodDevices("team", "cpu-only", {})
    health = healthy(hgx)
    health["mlx5_5"] = HcaHealth("mlx5_5", (Symptom(PORT_DOWN, "port 1 DOWN (DISABLED)"),))
    obj = nrt_object(
        "hgx-h100-017",
        hgx,
        exclusive(hgx, COMPUTE),
        health,
        Allocations(pods=(pod, other)),
        gpu_resource=GPU,
        policy="none",
        scope="container",
    )
    z = zones(obj)
    assert z["node-0"].resource(GPU) == nrt.ZoneResource(GPU, 4, 4, 3)
    assert z["node-0"].available("rdmaplane.io/hca") == 3
    assert z["pci0000:15"].available(GPU) == 0
    hca1 = z["node-1"].resource("rdmaplane.io/hca")
    assert (hca1.capacity, hca1.allocatable, hca1.available) == (4, 3, 3)
    assert nrt.from_object(obj).accounted_pods == {"team/train-0"}


def test_a_device_the_plugin_cannot_hand_out_is_not_allocatable(hgx: NodeTopology):
    """The health monitor calls mlx5_0 healthy, but the plugin reports its device Unhealthy
    (e.g. no verbs node): with no kubelet answer to go by, the NRT follows the plugin."""
    offered = [replace(o, healthy=o.hcas != ("mlx5_0",)) for o in exclusive(hgx, COMPUTE)]
    obj = nrt_object(
        "n",
        hgx,
        offered,
        healthy(hgx),
        Allocations(),
        gpu_resource=GPU,
        policy="none",
        scope="pod",
    )
    hca0 = zones(obj)["node-0"].resource("rdmaplane.io/hca")
    assert (hca0.capacity, hca0.allocatable, hca0.available) == (4, 3, 3)


def test_kubelet_allocatable_limits_gpus(hgx: NodeTopology):
    listed = frozenset(g.uuid for g in hgx.gpus[:2])
    allocations = Allocations(allocatable={GPU: listed, "rdmaplane.io/hca": frozenset()})
    obj = nrt_object(
        "n",
        hgx,
        exclusive(hgx),
        healthy(hgx),
        allocations,
        gpu_resource=GPU,
        policy="none",
        scope="pod",
    )
    z = zones(obj)
    assert z["node-0"].resource(GPU) == nrt.ZoneResource(GPU, 4, 2, 2)
    assert z["node-1"].allocatable(GPU) == 0
    assert z["node-0"].allocatable("rdmaplane.io/hca") == 0  # the kubelet lists none of ours


def test_shared_slots_count_in_every_zone_of_the_pool(hgx: NodeTopology):
    pool = tuple(COMPUTE)
    offered = [
        Offered("rdmaplane.io/hca-shared", f"hca-shared-{i:04d}", pool, True) for i in range(4)
    ]
    used = PodDevices("ns", "p", {"rdmaplane.io/hca-shared": frozenset({"hca-shared-0001"})})
    obj = nrt_object(
        "n",
        hgx,
        offered,
        healthy(hgx),
        Allocations(pods=(used,)),
        gpu_resource=GPU,
        policy="none",
        scope="pod",
    )
    z = zones(obj)
    for numa in ("node-0", "node-1"):
        assert z[numa].resource("rdmaplane.io/hca-shared") == nrt.ZoneResource(
            "rdmaplane.io/hca-shared", 4, 4, 3
        )
    assert z["pci0000:15"].shared_hcas == 1
    assert z["pci0000:15"].resource("rdmaplane.io/hca-shared") is None


def test_unknown_numa_publishes_one_zone(sample_nodes: dict[str, NodeTopology]):
    degraded = sample_nodes["degraded"]
    obj = nrt_object(
        "d",
        degraded,
        exclusive(degraded),
        healthy(degraded),
        Allocations(),
        gpu_resource=GPU,
        policy="none",
        scope="container",
    )
    numa_zones = [z.name for z in nrt.from_object(obj).numa_zones()]
    assert numa_zones == ["node-0"]
    assert zones(obj)["node-0"].resource(GPU).capacity == 4


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sick=st.sets(st.sampled_from(COMPUTE)),
    held_gpus=st.sets(st.integers(0, 7)),
    held_hcas=st.sets(st.sampled_from(COMPUTE)),
    listed_gpus=st.none() | st.sets(st.integers(0, 7)),
)
def test_zone_counts_add_up(hgx, sick, held_gpus, held_hcas, listed_gpus):
    """Per resource, the NUMA zones' numbers are the node's devices counted one by one:
    capacity = all, allocatable = healthy and listed by the kubelet, available = that and free."""
    health = healthy(hgx)
    for name in sick:
        health[name] = HcaHealth(name, (Symptom(PORT_DOWN, "port 1 DOWN (DISABLED)"),))
    address = {h.name: h.pci.address for h in hgx.hcas if h.pci}
    uuid = {g.index: g.uuid for g in hgx.gpus}
    pod = PodDevices(
        "ns",
        "p",
        {GPU: frozenset(uuid[i] for i in held_gpus), HCA: frozenset(address[n] for n in held_hcas)},
    )
    allocatable = None
    if listed_gpus is not None:
        allocatable = {
            GPU: frozenset(uuid[i] for i in listed_gpus),
            HCA: frozenset(address.values()),
        }
    obj = nrt_object(
        "n",
        hgx,
        exclusive(hgx, COMPUTE),
        health,
        Allocations(pods=(pod,), allocatable=allocatable),
        gpu_resource=GPU,
        policy="none",
        scope="container",
    )
    numa = nrt.from_object(obj).numa_zones()

    def total(resource: str, field: str) -> int:
        return sum(getattr(z.resource(resource), field) for z in numa if z.resource(resource))

    listed = set(range(8)) if listed_gpus is None else listed_gpus
    assert (total(GPU, "capacity"), total(GPU, "allocatable"), total(GPU, "available")) == (
        8,
        len(listed),
        len(listed - held_gpus),
    )
    ok = set(COMPUTE) - sick
    assert (total(HCA, "capacity"), total(HCA, "allocatable"), total(HCA, "available")) == (
        8,
        len(ok),
        len(ok - held_hcas),
    )
