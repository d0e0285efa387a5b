"""The one rule for whether HCA ports can be handed out: the device plugin's health and the DRA
driver's taints both come from it (their agreement is tested in test_dra_agrees_with_plugin)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.core.model import Hca, LinkLayer, NetnsMode, NodeTopology, PhysState, Port, PortState
from rdmaplane.core.nccl import NcclSettings
from rdmaplane.core.netns import NETNS_EXCLUSIVE
from rdmaplane.core.usability import (
    NO_NCCL_PLAN,
    NO_VERBS_DEVICE,
    PORT_DOWN,
    REPORTED_FAULT,
    Unusable,
    why_unusable,
)
from tests.unit.gidtables import E, hca, node, port, standard

NODES = frozenset({"uverbs0", "uverbs1"})


def judge(
    topo: NodeTopology,
    h: Hca,
    ports: list[Port] | None = None,
    *,
    device_nodes: frozenset[str] = NODES,
    fault: str | None = None,
    shared: bool = False,
) -> Unusable | None:
    return why_unusable(
        topo,
        h,
        h.ports if ports is None else ports,
        NcclSettings(),
        device_nodes=device_nodes,
        dev_root="/dev",
        fault=fault,
        shared=shared,
    )


def one(p: Port, name: str = "mlx5_0") -> tuple[NodeTopology, Hca]:
    h = replace(hca(name, p), uverbs="uverbs0")
    return node(h), h


@given(
    st.sampled_from(PortState),
    st.sampled_from(PhysState),
    st.sampled_from([LinkLayer.ETHERNET, LinkLayer.INFINIBAND]),
    st.sampled_from([1.0, 25.0, 200.0, 400.0]),
)
def test_a_port_is_usable_exactly_when_it_is_up_whatever_its_link_class(
    state: PortState, phys: PhysState, link: LinkLayer, rate: float
) -> None:
    p = replace(port(standard(), link=link, rate=rate), state=state, phys_state=phys)
    topo, h = one(p)

    problem = judge(topo, h)

    if p.is_up:
        assert problem is None
    else:
        assert problem is not None and problem.reason == PORT_DOWN
        assert (
            problem.message
            == f"mlx5_0: no port ACTIVE and LinkUp (port 1 {state.name}/{phys.name})"
        )


def test_an_hca_is_usable_while_one_of_its_ports_is_up() -> None:
    h = replace(
        hca("mlx5_0", port(standard(), number=1, up=False), port(standard(2), number=2)),
        uverbs="uverbs0",
    )
    topo = node(h)
    assert judge(topo, h) is None
    problem = judge(topo, h, [h.ports[0]])  # the DRA driver judges each port alone
    assert problem is not None and problem.reason == PORT_DOWN


@pytest.mark.parametrize(
    ("entries", "netdev", "why"),
    [
        ([E(0, "fe80::1", 1), E(1, "fe80::1", 2)], "eth0", "only link-local GIDs"),
        ([], None, "GID table is empty"),  # the netdev went away, and its GIDs with it
        ([E(2, "10.0.0.1", None)], "eth0", "cannot be read"),
    ],
)
def test_a_roce_port_without_a_usable_gid_has_no_nccl_plan(
    entries: list[E], netdev: str | None, why: str
) -> None:
    topo, h = one(port(entries, netdev=netdev))
    problem = judge(topo, h)
    assert problem is not None and problem.reason == NO_NCCL_PLAN
    assert problem.message.startswith("no NCCL plan for mlx5_0: no usable GID on mlx5_0:1")
    assert why in problem.message


def test_an_infiniband_port_needs_no_gid_and_no_netdev() -> None:
    topo, h = one(port([], link=LinkLayer.INFINIBAND, netdev=None))
    assert judge(topo, h) is None


def test_reasons_come_in_order_the_first_that_holds_is_said() -> None:
    down = port([E(0, "fe80::1", 2)], up=False)  # down, and no usable GID either
    topo, h = one(down)
    exclusive = replace(topo, netns_mode=NetnsMode.EXCLUSIVE)
    said = [
        judge(exclusive, h, shared=True, fault="symbol_error +400"),
        judge(topo, h, fault="symbol_error +400", device_nodes=frozenset()),
        judge(topo, h, device_nodes=frozenset()),
        judge(topo, h),
    ]
    assert [p.reason if p else None for p in said] == [
        NETNS_EXCLUSIVE,
        REPORTED_FAULT,
        NO_VERBS_DEVICE,
        PORT_DOWN,
    ]
    assert (
        str(said[2]) == "mlx5_0: no verbs device node /dev/infiniband/uverbs0 (looked under /dev)"
    )
    assert judge(exclusive, h) == judge(topo, h)  # an exclusive device is not blocked


def test_an_hca_without_a_verbs_device_in_sysfs_cannot_be_handed_out() -> None:
    topo, h = one(port(standard()))
    problem = judge(topo, replace(h, uverbs=None))
    assert problem is not None and problem.reason == NO_VERBS_DEVICE
    assert "/dev/infiniband/uverbs?" in problem.message
