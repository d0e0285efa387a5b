"""The NCCL/UCX environment: exact device lists, GID settings, errors, stability."""

from __future__ import annotations

import json
import random

import pytest
from gidtables import hca, node, pair, port, standard
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.core.gid import GidPolicy
from rdmaplane.core.model import Hca, NodeTopology, Port
from rdmaplane.core.nccl import (
    NcclPlanError,
    NcclSettings,
    default_socket_ifname,
    nccl_env,
    parse_nccl_version,
)
from rdmaplane.core.selectors import Selectors, compute_ports
from rdmaplane.core.untrusted import FieldError

H200_COMPUTE = "mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1,mlx5_10:1,mlx5_11:1"


def nccl_selects(value: str, name: str, port_number: int) -> bool:
    """NCCL_IB_HCA as NCCL reads it: `^` excludes, `=` matches names exactly, otherwise each
    entry is a name prefix; `:port` restricts the port."""
    exclude = value.startswith("^")
    value = value.removeprefix("^")
    exact = value.startswith("=")
    value = value.removeprefix("=")
    hit = False
    for entry in filter(None, value.split(",")):
        want, _, want_port = entry.partition(":")
        name_ok = name == want if exact else name.startswith(want)
        hit |= name_ok and (not want_port or int(want_port) == port_number)
    return hit != exclude


def every_port(topo: NodeTopology) -> list[tuple[Hca, Port]]:
    return [(h, p) for h in topo.hcas for p in h.ports]


def pick(topo: NodeTopology, *names: str) -> list[tuple[Hca, Port]]:
    return compute_ports(topo, Selectors(hca_names=names))


def test_hgx_h100_roce_uniform_index(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["hgx-h100-roce"]
    env = nccl_env(topo, compute_ports(topo))
    devices = ",".join(f"mlx5_{i}:1" for i in range(8))
    assert env == {
        "NCCL_IB_HCA": f"={devices}",
        "NCCL_IB_GID_INDEX": "3",
        "UCX_NET_DEVICES": devices,
        "MC_GID_INDEX": "3",  # Mooncake: the unified index, for exactly these NICs
        "RDMAPLANE_HCAS": ",".join(f"mlx5_{i}" for i in range(8)),
    }


def test_hgx_h200_infiniband_exact_names_and_nothing_gid_related(
    sample_nodes: dict[str, NodeTopology],
) -> None:
    topo = sample_nodes["hgx-h200-ib"]
    env = nccl_env(topo, compute_ports(topo))
    assert env == {
        "NCCL_IB_HCA": f"={H200_COMPUTE}",
        "UCX_NET_DEVICES": H200_COMPUTE,
        "MC_GID_INDEX": "0",  # the port GID of an InfiniBand port
        "RDMAPLANE_HCAS": H200_COMPUTE.replace(":1", ""),
    }
    chosen = {
        (h.name, p.number)
        for h, p in every_port(topo)
        if nccl_selects(env["NCCL_IB_HCA"], h.name, p.number)
    }
    assert chosen == {
        (n, 1)
        for n in ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")
    }
    # why the `=` matters: without it `mlx5_1` is a prefix that also catches mlx5_10
    assert nccl_selects("mlx5_1:1", "mlx5_10", 1) and not nccl_selects("=mlx5_1:1", "mlx5_10", 1)


def test_a_gb300_names_the_connectx8s_not_their_data_direct_devices(
    sample_nodes: dict[str, NodeTopology],
) -> None:
    """NCCL exposes a ConnectX-8 with Data Direct as `mlx5_N_dma` (pciPath: the Data Direct
    function), but matches NCCL_IB_HCA against the verbs device's own name before it makes
    that device: the plan names `mlx5_N` and leaves NCCL_IB_DATA_DIRECT at NCCL's default."""
    topo = sample_nodes["gb300-cx8"]
    env = nccl_env(topo, compute_ports(topo))
    names = "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert env["NCCL_IB_HCA"] == f"={names}" and env["UCX_NET_DEVICES"] == names
    assert not any("DATA_DIRECT" in k or "_dma" in v for k, v in env.items())


def test_indexes_that_differ_give_the_address_based_env(
    sample_nodes: dict[str, NodeTopology],
) -> None:
    topo = sample_nodes["degraded"]
    env = nccl_env(topo, pick(topo, "mlx5_0", "mlx5_4"))
    assert env == {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_4:1",
        "NCCL_IB_ROCE_VERSION_NUM": "2",
        "NCCL_IB_ADDR_FAMILY": "AF_INET",
        "UCX_NET_DEVICES": "mlx5_0:1,mlx5_4:1",
        "RDMAPLANE_HCAS": "mlx5_0,mlx5_4",  # no MC_GID_INDEX: no one index is right for both
    }
    ranged = NcclSettings(gid_policy=GidPolicy(cidr="10.99.0.0/16", roce_version=2))
    assert nccl_env(topo, pick(topo, "mlx5_0", "mlx5_4"), ranged)["NCCL_IB_ADDR_RANGE"] == (
        "10.99.0.0/16"
    )


def test_old_nccl_without_one_index_is_an_error_that_says_why(
    sample_nodes: dict[str, NodeTopology],
) -> None:
    topo = sample_nodes["degraded"]
    with pytest.raises(
        NcclPlanError, match=r"NCCL 2\.18 needs one NCCL_IB_GID_INDEX.*mlx5_0:1 → 5, mlx5_4:1 → 7"
    ):
        nccl_env(topo, pick(topo, "mlx5_0", "mlx5_4"), NcclSettings(nccl_version="2.18"))
    # one index is fine for old NCCL too
    old = nccl_env(topo, pick(topo, "mlx5_bond_0"), NcclSettings(nccl_version="2.18.3"))
    assert old["NCCL_IB_GID_INDEX"] == "3"
    new = nccl_env(topo, pick(topo, "mlx5_0", "mlx5_4"), NcclSettings(nccl_version="2.21"))
    assert new["NCCL_IB_ADDR_FAMILY"] == "AF_INET"


def test_a_port_without_usable_gid_is_refused(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["degraded"]
    with pytest.raises(NcclPlanError, match="no usable GID on mlx5_3:1: only link-local GIDs"):
        nccl_env(topo, pick(topo, "mlx5_0", "mlx5_3"))
    with pytest.raises(NcclPlanError, match="mlx5_4:1: no IPv6 GID"):
        nccl_env(topo, pick(topo, "mlx5_0", "mlx5_4"), NcclSettings(gid_policy=GidPolicy(family=6)))


def test_ipv6_family_is_spelled_af_inet6() -> None:
    topo = node(
        hca("mlx5_0", port(pair(0, "fe80::1") + pair(2, "fd00::1"))),
        hca("mlx5_1", port(pair(0, "fe80::2") + pair(2, "10.0.0.2") + pair(4, "fd00::2"))),
    )
    env = nccl_env(topo, every_port(topo), NcclSettings(gid_policy=GidPolicy(family=6)))
    assert env["NCCL_IB_ADDR_FAMILY"] == "AF_INET6" and "NCCL_IB_GID_INDEX" not in env


def test_mixed_infiniband_and_roce_set_is_refused(sample_nodes: dict[str, NodeTopology]) -> None:
    """NCCL cannot use InfiniBand and RoCE devices as one ("Try selecting NICs of only one
    link type using NCCL_IB_HCA"): no environment for such a set, as the doctor's nccl-env
    check and its NCCL log rule say."""
    topo = sample_nodes["hgx-h200-ib"]
    with pytest.raises(NcclPlanError, match=r"InfiniBand mlx5_0:1; RoCE mlx5_1:1, mlx5_2:1"):
        nccl_env(topo, pick(topo, "mlx5_0", "mlx5_1", "mlx5_2"))
    env = nccl_env(topo, pick(topo, "mlx5_1", "mlx5_2"))
    assert env["NCCL_IB_GID_INDEX"] == "3" and env["MC_GID_INDEX"] == "3"


def test_optional_knobs(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["hgx-h100-roce"]
    s = NcclSettings(socket_ifname="=eth0", ib_tc=106, ib_sl=3)
    env = nccl_env(topo, compute_ports(topo), s)
    assert (env["NCCL_SOCKET_IFNAME"], env["NCCL_IB_TC"], env["NCCL_IB_SL"]) == (
        "=eth0",
        "106",
        "3",
    )
    assert list(env) == [
        "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX",
        "NCCL_SOCKET_IFNAME",
        "NCCL_IB_TC",
        "NCCL_IB_SL",
        "UCX_NET_DEVICES",
        "RDMAPLANE_HCAS",
        "MC_GID_INDEX",
    ]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ib_tc": 256}, "ib_tc"),
        ({"ib_sl": 16}, "ib_sl"),
        ({"nccl_version": "latest"}, "nccl_version"),
        ({"socket_ifname": " "}, "socket_ifname"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(FieldError) as caught:
        NcclSettings(**kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field and field not in caught.value.reason


def test_versions() -> None:
    assert parse_nccl_version("v2.26.2-1") == (2, 26)
    assert parse_nccl_version("2.9") < parse_nccl_version("2.21")
    assert not NcclSettings(nccl_version="2.20.5").auto_gid


def test_empty_set_and_unwritable_names_are_refused() -> None:
    topo = node(hca("mlx5,0", port(standard())))
    with pytest.raises(NcclPlanError, match="no HCA ports"):
        nccl_env(topo, [])
    with pytest.raises(NcclPlanError, match="cannot be written into NCCL_IB_HCA"):
        nccl_env(topo, every_port(topo))


def test_ports_of_another_node_are_refused(sample_nodes: dict[str, NodeTopology]) -> None:
    with pytest.raises(NcclPlanError, match="is not an HCA of"):
        nccl_env(sample_nodes["hgx-h100-roce"], compute_ports(sample_nodes["hgx-h200-ib"]))


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_env_names_exactly_the_set_and_is_byte_stable(
    data: st.DataObject, sample_nodes: dict[str, NodeTopology]
) -> None:
    topo = sample_nodes["hgx-h200-ib"]
    ports = every_port(topo)
    chosen = data.draw(
        st.lists(st.sampled_from(ports), min_size=1, unique_by=lambda hp: hp[0].name)
    )
    if len({p.link_layer for _, p in chosen}) > 1:
        with pytest.raises(NcclPlanError, match="InfiniBand and RoCE ports together"):
            nccl_env(topo, chosen)
        return
    env = nccl_env(topo, chosen)
    want = {(h.name, p.number) for h, p in chosen}
    got = {
        (h.name, p.number) for h, p in ports if nccl_selects(env["NCCL_IB_HCA"], h.name, p.number)
    }
    assert got == want
    assert env["NCCL_IB_HCA"].startswith("=")
    assert {tuple(d.split(":")) for d in env["UCX_NET_DEVICES"].split(",")} == {
        (n, str(p)) for n, p in want
    }
    assert set(env["RDMAPLANE_HCAS"].split(",")) == {n for n, _ in want}  # the KV frameworks'
    if "MC_GID_INDEX" in env:  # ... one index, right for every port of the set
        assert all(any(g.index == int(env["MC_GID_INDEX"]) for g in p.gids) for _, p in chosen), (
            env["MC_GID_INDEX"]
        )
    shuffled = list(chosen)
    random.Random(data.draw(st.integers())).shuffle(shuffled)
    assert json.dumps(nccl_env(topo, shuffled)) == json.dumps(env)


@pytest.mark.parametrize(
    ("name", "hcas", "expected"),
    [
        ("hgx-h100-roce", None, "=eno1"),  # front-end NIC, not the bonded storage NIC
        ("dgx-a100", None, "=enp226s0"),
        ("pcie-l40s-split", None, "=ens1f0np0"),
        ("workstation", None, "=eno1"),
        ("degraded", None, "=ens1f0np0"),
        ("degraded", ("mlx5_0", "mlx5_4"), "=bond0"),  # not ens1f0np0's VLAN either
    ],
)
def test_default_socket_ifname(
    name: str, hcas: tuple[str, ...] | None, expected: str, sample_nodes: dict[str, NodeTopology]
) -> None:
    topo = sample_nodes[name]
    ports = pick(topo, *hcas) if hcas else compute_ports(topo)
    assert default_socket_ifname(topo, ports) == expected


def test_default_socket_ifname_none_when_nothing_fits() -> None:
    topo = node(hca("mlx5_0", port(standard())))
    assert default_socket_ifname(topo, every_port(topo)) is None
