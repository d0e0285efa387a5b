"""Which ports are compute ports: the default rule and the device-plugin-style selectors."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from gidtables import hca, node, port, standard
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.adapters.config.base import ConfigError, validate
from rdmaplane.core.model import LinkLayer, NodeTopology
from rdmaplane.core.selectors import Selectors, classify_ports, compute_ports, natural_key


def names(pairs: list) -> list[str]:  # type: ignore[type-arg]
    return [f"{h.name}:{p.number}" for h, p in pairs]


def test_mixed_rates_leave_the_storage_nic_out(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["pcie-l40s-split"]
    assert names(compute_ports(topo)) == ["mlx5_0:1", "mlx5_1:1"]
    why = {v.hca.name: v.reason for v in classify_ports(topo)}
    assert why["mlx5_2"] == "excluded: 25G Ethernet is not the compute class (400G Ethernet)"


def test_hgx_h100_bond_is_excluded_by_rate(sample_nodes: dict[str, NodeTopology]) -> None:
    assert names(compute_ports(sample_nodes["hgx-h100-roce"])) == [f"mlx5_{i}:1" for i in range(8)]


def test_dgx_a100_rate_tie_goes_to_the_class_with_more_ports(
    sample_nodes: dict[str, NodeTopology],
) -> None:
    ports = compute_ports(sample_nodes["dgx-a100"])
    assert names(ports) == [f"mlx5_{i}:1" for i in (0, 1, 2, 3, 6, 7, 8, 9)]
    assert {p.link_layer for _, p in ports} == {LinkLayer.INFINIBAND}


def test_down_port_is_excluded(sample_nodes: dict[str, NodeTopology]) -> None:
    verdicts = {v.hca.name: v for v in classify_ports(sample_nodes["degraded"])}
    assert not verdicts["mlx5_3"].compute
    assert verdicts["mlx5_3"].reason == "excluded: port is DOWN/DISABLED, not up"
    assert names(compute_ports(sample_nodes["degraded"])) == ["mlx5_bond_0:1"]


def test_natural_order_puts_mlx5_10_after_mlx5_9(sample_nodes: dict[str, NodeTopology]) -> None:
    assert names(compute_ports(sample_nodes["hgx-h200-ib"]))[-3:] == [
        "mlx5_9:1",
        "mlx5_10:1",
        "mlx5_11:1",
    ]
    assert sorted(["mlx5_10", "mlx5_bond_0", "mlx5_2", "mlx5_9"], key=natural_key) == [
        "mlx5_2",
        "mlx5_9",
        "mlx5_10",
        "mlx5_bond_0",
    ]


def test_default_does_not_depend_on_hca_order(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["hgx-h200-ib"]
    shuffled = list(topo.hcas)
    random.Random(7).shuffle(shuffled)
    assert compute_ports(replace(topo, hcas=tuple(shuffled))) == compute_ports(topo)


def test_equal_classes_of_equal_size_pick_infiniband() -> None:
    topo = node(
        hca("mlx5_0", port(standard(), link=LinkLayer.ETHERNET, rate=200)),
        hca("mlx5_1", port(standard(), link=LinkLayer.INFINIBAND, rate=200)),
    )
    assert names(compute_ports(topo)) == ["mlx5_1:1"]


def test_no_ports_up_means_no_compute_ports() -> None:
    assert compute_ports(node(hca("mlx5_0", port(standard(), up=False)))) == []


@pytest.mark.parametrize(
    ("selectors", "expected"),
    [
        (Selectors(hca_names=("mlx5_1?",)), ["mlx5_10:1", "mlx5_11:1"]),
        (Selectors(hca_names=("mlx5_1",)), ["mlx5_1:1"]),
        (Selectors(link_types=("ether",)), ["mlx5_1:1", "mlx5_2:1", "mlx5_7:1", "mlx5_8:1"]),
        (
            Selectors(link_types=("infiniband",), if_names=("ibp28s0", "ibp210s0")),
            ["mlx5_0:1", "mlx5_10:1"],
        ),
        (Selectors(vendors=("15b3",), device_ids=("0x1021",), drivers=("mlx5_core",)), None),
        (Selectors(vendors=("8086",)), []),
        (Selectors(drivers=("ice",)), []),
    ],
)
def test_selectors(
    selectors: Selectors, expected: list[str] | None, sample_nodes: dict[str, NodeTopology]
) -> None:
    topo = sample_nodes["hgx-h200-ib"]
    every = names([(h, p) for h in topo.hcas for p in h.ports])
    got = names(compute_ports(topo, selectors))
    assert got == (sorted(every, key=natural_key) if expected is None else expected)


def test_if_names_match_bond_and_its_slaves(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["hgx-h100-roce"]
    for ifname in ("bond0", "ens3f0np0"):
        assert names(compute_ports(topo, Selectors(if_names=(ifname,)))) == ["mlx5_bond_0:1"]


def test_selected_down_port_stays_and_says_so(sample_nodes: dict[str, NodeTopology]) -> None:
    verdicts = classify_ports(sample_nodes["degraded"], Selectors(hca_names=("mlx5_3",)))
    chosen = [v for v in verdicts if v.compute]
    assert [v.hca.name for v in chosen] == ["mlx5_3"]
    assert chosen[0].reason == "compute: matches the selectors (but port is DOWN/DISABLED)"
    other = next(v for v in verdicts if v.hca.name == "mlx5_0")
    assert other.reason == "excluded: hcaNames mlx5_3 does not match mlx5_0"


def test_unknown_link_type_is_refused() -> None:
    with pytest.raises(ValueError, match="link_types: 'token-ring'"):
        Selectors(link_types=("token-ring",))


def test_from_device_plugin_config(sample_nodes: dict[str, NodeTopology]) -> None:
    config = {"vendors": ["15b3"], "deviceIDs": ["1021"], "linkTypes": ["infiniband"]}
    sel = validate(Selectors, config)
    assert sel == Selectors(vendors=("15b3",), device_ids=("1021",), link_types=("infiniband",))
    assert names(compute_ports(sample_nodes["hgx-h200-ib"], sel)) == names(
        compute_ports(sample_nodes["hgx-h200-ib"])
    )
    with pytest.raises(ConfigError, match=r"^devices: unknown key \(did you mean deviceIDs\?\)"):
        validate(Selectors, {"devices": ["ib0"]})
    with pytest.raises(ConfigError, match=r"^s: vendors: Input should be a valid list"):
        validate(Selectors, {"vendors": "15b3"}, "s: ")


_VALUES = st.lists(st.text(min_size=1, max_size=8), max_size=3).map(tuple)


@given(
    st.builds(
        Selectors,
        vendors=_VALUES,
        device_ids=_VALUES,
        drivers=_VALUES,
        if_names=_VALUES,
        hca_names=_VALUES,
        link_types=st.lists(st.sampled_from(["ether", "infiniband", "IB"]), max_size=2).map(tuple),
    )
)
def test_to_config_names_exactly_the_selectors_given(sel: Selectors) -> None:
    said = sel.to_config()
    assert validate(Selectors, said) == sel
    assert all(said.values())  # empty ones, matching everything, are left out
