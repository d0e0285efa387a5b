"""What the DRA driver offers: one device per HCA port of the pools, named and described so the
scheduler can pair it (pcieRoot, numaNode as the standard attribute helpers write them), and
which of them cannot be handed out."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.adapters.discovery.samples import names, read_sample
from rdmaplane.core.gid import GidPolicy, select_gid
from rdmaplane.core.model import Hca, LinkLayer, NodeTopology, PhysState, Port, PortState
from rdmaplane.core.nccl import NcclSettings
from rdmaplane.core.nrt import Uplink
from rdmaplane.core.selectors import Selectors, compute_ports
from rdmaplane.core.settings.dra import DraSharing
from rdmaplane.core.usability import NO_NCCL_PLAN, NO_VERBS_DEVICE, PORT_DOWN, REPORTED_FAULT
from rdmaplane.services.dra.policy.devices import (
    MAX_STRING,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    DraDevice,
    DraPool,
    Share,
    device_name,
    offer,
    unusable,
)

SAMPLES = {name: read_sample(name) for name in names()}
ALL = DraPool("rdmaplane.io/hca", Selectors())  # the device plugin's default pool: every HCA
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_every_port_of_the_pool_is_one_device_with_a_dns_label(sample: str) -> None:
    topo = SAMPLES[sample]
    devices = offer(topo, [ALL])
    ports = {(h.name, p.number) for h, p in compute_ports(topo, Selectors())}
    assert {(d.hca, d.port) for d in devices.values()} == ports
    assert all(DNS_LABEL.match(name) for name in devices)
    assert offer(topo, [ALL]) == devices  # the same node, the same names and attributes


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_attributes_say_where_the_port_sits(sample: str) -> None:
    topo = SAMPLES[sample]
    for device in offer(topo, [ALL]).values():
        hca = topo.hca(device.hca)
        assert hca is not None
        port = hca.port(device.port)
        assert port is not None
        assert device.attribute(PCIE_ROOT) == hca.pcie_root  # of its DMA function
        assert device.attribute(PCI_BUS_ID) == (hca.pci.address if hca.pci else None)
        assert device.name == device_name(hca, port.number)
        assert device.attribute("rdmaDevice") == hca.name
        assert device.attribute("linkLayer") == port.link_layer.value
        assert device.attribute("netdev") == port.netdev
        numa = hca.numa if hca.numa is not None and hca.numa >= 0 else None
        assert device.attribute(NUMA_NODE) == numa == device.attribute("numaNode")
        if port.link_layer == LinkLayer.ETHERNET:
            assert device.attribute("gidIndex") == select_gid(hca, port).index
        else:
            assert device.attribute("gidIndex") is None  # NCCL uses index 0 on InfiniBand
        assert all(not isinstance(v, str) or 0 < len(v) <= MAX_STRING for _, v in device.attributes)


def test_names_come_from_the_pci_address_not_the_hca_name() -> None:
    topo = SAMPLES["hgx-h100-roce"]
    hca = topo.hca("mlx5_0")
    assert hca is not None and hca.pci is not None
    assert (
        device_name(hca, 1) == "pci-" + hca.pci.address.replace(":", "-").replace(".", "-") + "-p1"
    )
    renamed = dataclasses.replace(hca, name="mlx5_7")  # cards added: the kernel's numbering moved
    assert device_name(renamed, 1) == device_name(hca, 1)


def test_software_devices_with_punctuation_twins_get_distinct_names() -> None:
    port = Port(1, PortState.ACTIVE, PhysState.LINK_UP, LinkLayer.ETHERNET, 25.0)
    topo = NodeTopology(hcas=(Hca("rxe_0", None, (port,)), Hca("rxe-0", None, (port,))))
    devices = offer(topo, [DraPool("rdmaplane.io/hca", Selectors(hca_names=("rxe*",)))])
    assert len(devices) == 2 and all(DNS_LABEL.match(n) for n in devices)
    assert all(d.attribute(PCIE_ROOT) is None for d in devices.values())


@given(st.text(alphabet="abcXYZ_-.:09", min_size=1, max_size=120), st.integers(1, 255))
def test_any_hca_name_becomes_a_dns_label(name: str, number: int) -> None:
    assert DNS_LABEL.match(device_name(Hca(name, None), number))


def test_a_port_that_goes_down_stays_offered_and_a_vanished_hca_leaves() -> None:
    topo = SAMPLES["hgx-h100-roce"]
    default = DraPool("rdmaplane.io/hca")  # no selectors: the fastest ports that are up
    before = offer(topo, [default])
    down = with_ports_down(topo, "mlx5_3")
    assert ("mlx5_3", 1) not in {(h.name, p.number) for h, p in compute_ports(down, None)}

    after = offer(down, [default], before=before)

    assert set(after) == set(before)  # still offered (and tainted, see test_dra_slices)
    gone = dataclasses.replace(down, hcas=tuple(h for h in down.hcas if h.name != "mlx5_3"))
    assert {d.hca for d in offer(gone, [default], before=after).values()} == {
        d.hca for d in before.values()
    } - {"mlx5_3"}


@settings(max_examples=50)
@given(st.sets(st.sampled_from([h.name for h in SAMPLES["dgx-a100"].hcas])))
def test_remembered_devices_are_exactly_those_whose_port_still_exists(removed: set[str]) -> None:
    topo = SAMPLES["dgx-a100"]
    before = offer(topo, [ALL])
    left = dataclasses.replace(topo, hcas=tuple(h for h in topo.hcas if h.name not in removed))
    after = offer(left, [DraPool(ALL.name, Selectors(hca_names=("none",)))], before=before)
    assert {d.hca for d in after.values()} == {d.hca for d in before.values()} - removed


def test_a_port_two_pools_select_belongs_to_the_first() -> None:
    topo = SAMPLES["hgx-h100-roce"]
    compute = DraPool("rdmaplane.io/hca", Selectors(hca_names=("mlx5_[0-7]",)))
    devices = offer(topo, [compute, DraPool("rdmaplane.io/storage", Selectors())])
    pools = {d.hca: d.attribute("pool") for d in devices.values()}
    assert pools["mlx5_0"] == "rdmaplane.io/hca"
    assert pools["mlx5_bond_0"] == "rdmaplane.io/storage"


def test_fabric_attributes_when_the_uplinks_are_known() -> None:
    topo = SAMPLES["hgx-h100-roce"]
    uplinks = [Uplink("mlx5_0", "leaf-3", rail=0), Uplink("mlx5_1", "x" * 80, rail=1)]
    devices = {d.hca: d for d in offer(topo, [ALL], uplinks).values()}
    assert devices["mlx5_0"].attribute("tier0Switch") == "leaf-3"
    assert devices["mlx5_0"].attribute("rail") == 0
    assert devices["mlx5_1"].attribute("tier0Switch") is None  # too long for an attribute
    assert devices["mlx5_1"].attribute("rail") == 1
    assert devices["mlx5_2"].attribute("rail") is None


def every_node(topo: NodeTopology) -> frozenset[str]:
    """A /dev/infiniband holding every HCA's verbs device."""
    return frozenset(h.uverbs for h in topo.hcas if h.uverbs)


def reasons(
    topo: NodeTopology, pools: list[DraPool], before: dict[str, DraDevice] | None = None
) -> dict[str, str]:
    """The reason each offered HCA's port cannot be handed out, by HCA name."""
    devices = offer(topo, pools, before=before)
    found = unusable(topo, devices, pools, every_node(topo), "/dev")
    return {devices[n].hca: p.reason for n, p in found.items()}


def test_storage_ports_that_are_down_cannot_be_handed_out_from_the_start() -> None:
    # The node: the dual-port storage NIC (200G RoCE, a slower class than the 400G
    # InfiniBand compute NICs, never judged by the fault classes) has both ports down.
    topo = with_ports_down(SAMPLES["hgx-h200-ib"], "mlx5_1", "mlx5_2")
    assert reasons(topo, [ALL]) == {"mlx5_1": PORT_DOWN, "mlx5_2": PORT_DOWN}


@settings(max_examples=60)
@given(st.data())
def test_a_port_set_down_is_unusable_and_the_others_keep_their_verdict(data: st.DataObject) -> None:
    sample = data.draw(st.sampled_from(sorted(SAMPLES)))
    topo = SAMPLES[sample]
    down = data.draw(st.sets(st.sampled_from([h.name for h in topo.hcas])))
    changed = with_ports_down(topo, *down)
    default = DraPool("rdmaplane.io/hca")  # no selectors: a port that goes down stays by `before`
    for pools in ([ALL], [default]):
        before = offer(topo, pools)
        was = reasons(topo, pools)
        now = reasons(changed, pools, before)
        offered = {d.hca for d in before.values()}
        assert now == {
            **{h: r for h, r in was.items() if h not in down},
            **dict.fromkeys(down & offered, PORT_DOWN),
        }


def test_a_missing_verbs_device_node_makes_its_port_unusable() -> None:
    topo = SAMPLES["hgx-h100-roce"]
    devices = offer(topo, [ALL])
    found = unusable(topo, devices, [ALL], every_node(topo) - {"uverbs3"}, "/host/dev")
    assert {devices[n].hca: p.reason for n, p in found.items()} == {"mlx5_3": NO_VERBS_DEVICE}
    assert "looked under /host/dev" in next(iter(found.values())).message


def test_a_reported_fault_makes_any_port_unusable_with_its_reason() -> None:
    """Rising error counters (what the agent's health rules call unhealthy) refuse the port
    whatever its link class: a compute port and the bonded storage port alike."""
    topo = SAMPLES["hgx-h100-roce"]
    devices = offer(topo, [ALL])
    said = "port 1 symbol_error +50 within 60 s (max 10)"
    reported = {("mlx5_0", 1): said, ("mlx5_bond_0", 1): said, ("mlx5_0", 2): said}
    found = unusable(topo, devices, [ALL], every_node(topo), "/dev", reported)
    assert {devices[n].hca: (p.reason, p.message) for n, p in found.items()} == {
        "mlx5_0": (REPORTED_FAULT, f"mlx5_0: {said}"),
        "mlx5_bond_0": (REPORTED_FAULT, f"mlx5_bond_0: {said}"),
    }


def test_each_device_is_judged_with_its_own_pools_gid_policy() -> None:
    topo = SAMPLES["hgx-h100-roce"]
    elsewhere = NcclSettings(gid_policy=GidPolicy(cidr="192.168.0.0/16"))  # no GID in range
    pools = [
        DraPool("rdmaplane.io/hca", Selectors(hca_names=("mlx5_[0-3]",)), elsewhere),
        DraPool("rdmaplane.io/storage", Selectors()),
    ]
    assert reasons(topo, pools) == dict.fromkeys(
        ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"], NO_NCCL_PLAN
    )


def with_ports_down(topo: NodeTopology, *names: str) -> NodeTopology:
    """The node with every port of the HCAs `names` DOWN/Disabled."""
    hcas = []
    for h in topo.hcas:
        if h.name in names:
            ports = tuple(
                dataclasses.replace(p, state=PortState.DOWN, phys_state=PhysState.DISABLED)
                for p in h.ports
            )
            h = dataclasses.replace(h, ports=ports)
        hcas.append(h)
    return dataclasses.replace(topo, hcas=tuple(hcas))


def test_a_shared_pools_ports_are_shared_by_bandwidth_and_an_exclusive_pools_are_not() -> None:
    topo = SAMPLES["hgx-h100-roce"]
    shared = DraPool("rdmaplane.io/hca-shared", Selectors(hca_names=("mlx5_[0-3]",)),
                  share=DraSharing(100, 25))  # fmt: skip
    devices = offer(topo, [shared, ALL])
    for device in devices.values():
        if device.pool == shared.name:
            assert device.share == Share(400, 100, 25)  # the ports' rate, 400G
        else:
            assert device.share is None
    assert {d.hca for d in devices.values() if d.share} == {f"mlx5_{k}" for k in range(4)}


def test_a_connectx8_pairs_by_its_data_direct_functions_root_and_names_its_own_function() -> None:
    topo = SAMPLES["gb300-cx8"]
    devices = offer(topo, [DraPool("rdmaplane.io/hca")])  # the fastest ports: the four CX-8
    for gpu in topo.gpus:
        (paired,) = (
            d for d in devices.values() if d.attribute(PCIE_ROOT) == gpu.pci.root
        )  # one NIC on each GPU's root, and it is the GPU's own CX-8
        hca = topo.hca(paired.hca)
        assert hca is not None and hca.pci is not None and hca.data_direct is not None
        assert hca.pci.root != gpu.pci.root  # not by the NIC's own function
        assert paired.attribute(PCI_BUS_ID) == hca.pci.address
        assert paired.attribute("dataDirectBusID") == hca.data_direct.address
    storage = [d for d in devices.values() if d.attribute("linkLayer") == "Ethernet"]
    assert storage == []  # the 200G BlueField-3 ports are not the compute class
