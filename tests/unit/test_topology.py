"""PCIe relations: the words of `nvidia-smi topo -m`, on hand-built paths and on every sample."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.adapters.discovery import samples
from rdmaplane.core.model import NodeTopology, PciDevice
from rdmaplane.core.topology import Relation, nearest_hcas, pci_relation, relations


def dev(address: str, root: str, *bridges: str, numa: int | None = 0) -> PciDevice:
    return PciDevice(address=address, root=root, bridges=bridges, numa=numa)


RP, UP, DA, DB = "0000:17:01.0", "0000:18:00.0", "0000:19:00.0", "0000:19:01.0"


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # two functions of one card
        (dev("0000:1a:00.0", "pci0000:17", RP), dev("0000:1a:00.1", "pci0000:17", RP), "PIX"),
        # one switch between them (upstream port + two downstream ports)
        (
            dev("0000:1a:00.0", "pci0000:17", RP, UP, DA),
            dev("0000:1b:00.0", "pci0000:17", RP, UP, DB),
            "PIX",
        ),
        # two levels of switches: PXB
        (
            dev("0000:1e:00.0", "pci0000:17", RP, UP, DA, "0000:1c:00.0", "0000:1d:00.0"),
            dev("0000:1f:00.0", "pci0000:17", RP, UP, DB, "0000:20:00.0", "0000:21:00.0"),
            "PXB",
        ),
        # one on the level-1 switch, one below a level-2 switch: still several bridges
        (
            dev("0000:1a:00.0", "pci0000:17", RP, UP, DA),
            dev("0000:1f:00.0", "pci0000:17", RP, UP, DB, "0000:20:00.0", "0000:21:00.0"),
            "PXB",
        ),
        # different root ports of one root complex
        (
            dev("0000:1a:00.0", "pci0000:17", RP),
            dev("0000:2a:00.0", "pci0000:17", "0000:17:03.0"),
            "PHB",
        ),
        # different root complexes, one NUMA node
        (
            dev("0000:1a:00.0", "pci0000:17", RP),
            dev("0000:3a:00.0", "pci0000:37", "0000:37:01.0"),
            "NODE",
        ),
        # different NUMA nodes
        (
            dev("0000:1a:00.0", "pci0000:17", RP),
            dev("0000:9a:00.0", "pci0000:97", "0000:97:01.0", numa=1),
            "SYS",
        ),
        # numa=off: NUMA unknown everywhere reads NODE across host bridges, never SYS
        (
            dev("0000:1a:00.0", "pci0000:17", RP, numa=None),
            dev("0000:9a:00.0", "pci0000:97", "0000:97:01.0", numa=None),
            "NODE",
        ),
        (dev("0000:1a:00.0", "pci0000:17", RP), dev("0000:1a:00.0", "pci0000:17", RP), "X"),
    ],
)
def test_pci_relation(a: PciDevice, b: PciDevice, expected: str) -> None:
    assert pci_relation(a, b).name == expected
    assert pci_relation(b, a).name == expected


# Random PCIe trees: devices are random walks down a small tree of bridges.
bridge = st.sampled_from([f"0000:{b:02x}:00.0" for b in range(0x10, 0x16)])
paths = st.tuples(
    st.sampled_from(["pci0000:00", "pci0000:80"]),
    st.lists(bridge, max_size=5),
    st.sampled_from([None, 0, 1]),
    st.integers(0x30, 0x38),
)


@given(st.lists(paths, min_size=1, max_size=6))
def test_relations_are_symmetric_with_x_on_the_diagonal(devs: list) -> None:
    devices = [
        PciDevice(address=f"0000:{bus:02x}:00.{i}", root=root, bridges=tuple(b), numa=numa)
        for i, (root, b, numa, bus) in enumerate(devs)
    ]
    for a in devices:
        assert pci_relation(a, a) is Relation.X
        for b in devices:
            assert pci_relation(a, b) == pci_relation(b, a)
            if a.root == b.root and a is not b:
                assert pci_relation(a, b) <= Relation.PHB
            if a.root != b.root:
                assert pci_relation(a, b) >= Relation.NODE


# Hand-checked expectations per sample: (row, column) → word.
EXPECTED = {
    # each ConnectX-8 is PIX from its GPU by its Data Direct function (the DMA path NCCL
    # takes), though its own function is NODE from every GPU (nvidia-smi's view)
    "gb300-cx8": {
        ("GPU0", "mlx5_0"): "PIX",
        ("GPU1", "mlx5_1"): "PIX",
        ("GPU3", "mlx5_3"): "PIX",
        ("GPU0", "mlx5_1"): "NODE",
        ("GPU0", "mlx5_2"): "SYS",
        ("GPU0", "mlx5_4"): "NODE",
        ("GPU0", "GPU1"): "NODE",
        ("GPU1", "GPU2"): "SYS",
        ("mlx5_0", "mlx5_1"): "NODE",
        ("mlx5_4", "mlx5_5"): "PIX",
    },
    "hgx-h100-roce": {
        ("GPU0", "mlx5_0"): "PIX",
        ("GPU7", "mlx5_7"): "PIX",
        ("GPU0", "mlx5_1"): "NODE",
        ("GPU0", "mlx5_4"): "SYS",
        ("GPU0", "GPU1"): "NODE",
        ("GPU0", "GPU4"): "SYS",
        ("GPU0", "mlx5_bond_0"): "NODE",
        ("GPU5", "mlx5_bond_0"): "SYS",
    },
    "dgx-a100": {
        ("GPU0", "mlx5_0"): "PXB",
        ("GPU0", "mlx5_1"): "PXB",
        ("GPU0", "GPU1"): "PIX",
        ("mlx5_0", "mlx5_1"): "PIX",
        ("GPU0", "GPU2"): "SYS",
        ("GPU6", "mlx5_9"): "PXB",
        ("mlx5_4", "mlx5_5"): "PIX",
        ("GPU0", "mlx5_4"): "SYS",
        ("GPU4", "mlx5_6"): "PXB",
    },
    "hgx-h200-ib": {
        ("GPU0", "mlx5_0"): "PIX",
        ("GPU1", "mlx5_3"): "PIX",
        ("GPU6", "mlx5_10"): "PIX",
        ("GPU7", "mlx5_11"): "PIX",
        ("mlx5_1", "mlx5_2"): "PIX",
        ("GPU0", "mlx5_1"): "NODE",
        ("GPU0", "mlx5_7"): "SYS",
    },
    "pcie-l40s-split": {
        ("GPU0", "mlx5_0"): "PHB",
        ("GPU2", "mlx5_1"): "PHB",
        ("GPU1", "mlx5_0"): "NODE",
        ("GPU4", "mlx5_0"): "SYS",
        ("GPU7", "mlx5_1"): "SYS",
        ("mlx5_2", "mlx5_3"): "PIX",
    },
    "sriov-exclusive": {
        ("GPU0", "mlx5_0"): "PIX",  # the PF behind the GPU's switch
        ("GPU0", "mlx5_3"): "PIX",  # a VF of it
        ("mlx5_0", "mlx5_3"): "PIX",  # functions of one card
        ("GPU0", "GPU1"): "PIX",
        ("GPU0", "mlx5_1"): "SYS",
        ("GPU2", "mlx5_9"): "PIX",
    },
    "workstation": {
        ("GPU0", "GPU1"): "NODE",
        ("GPU0", "mlx5_0"): "SYS",
        ("GPU1", "mlx5_0"): "SYS",
        ("GPU0", "rxe0"): None,
        ("rxe0", "rxe0"): "X",
    },
    "degraded": {
        ("GPU0", "GPU1"): "PIX",
        ("GPU0", "mlx5_0"): "PIX",
        ("GPU2", "GPU3"): "PHB",
        ("GPU2", "mlx5_3"): "PHB",
        ("GPU0", "GPU2"): "NODE",
        ("GPU0", "mlx5_3"): "NODE",
        ("mlx5_4", "mlx5_bond_0"): "PHB",
    },
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_relations_match_hand_checked_expectations(
    name: str, sample_nodes: dict[str, NodeTopology]
) -> None:
    rel = relations(sample_nodes[name])
    for (a, b), word in EXPECTED[name].items():
        assert rel[a][b] == word, (a, b)
    for a in rel:
        assert rel[a][a] == "X"
        for b in rel:
            assert rel[a][b] == rel[b][a]


def test_every_sample_has_expectations(sample_nodes: dict[str, NodeTopology]) -> None:
    assert set(sample_nodes) == set(EXPECTED)


def test_nvlinks_only_when_known(sample_nodes: dict[str, NodeTopology]) -> None:
    from dataclasses import replace

    topo = sample_nodes["dgx-a100"]
    assert relations(topo)["GPU0"]["GPU1"] == "PIX"  # no NVML in samples: never guessed
    g0, g1, *rest = topo.gpus
    g0 = replace(g0, nvlinks=((g1.pci.address, 12),))
    g1 = replace(g1, nvlinks=((g0.pci.address, 12),))
    rel = relations(replace(topo, gpus=(g0, g1, *rest)))
    assert rel["GPU0"]["GPU1"] == rel["GPU1"]["GPU0"] == "NV12"
    assert rel["GPU0"]["mlx5_0"] == "PXB"


def test_equally_near_nics_are_shared_out_as_nccl_pairs_them(
    sample_nodes: dict[str, NodeTopology],
) -> None:
    """DGX A100: each two-level switch holds two GPUs and two compute NICs, all PXB to each
    other; each GPU gets its own NIC (GPU0 mlx5_0, GPU1 mlx5_1), none is left out."""
    dgx = nearest_hcas(sample_nodes["dgx-a100"])
    assert [(dgx[i][0].name, dgx[i][1].name) for i in range(8)] == [
        ("mlx5_0", "PXB"), ("mlx5_1", "PXB"), ("mlx5_2", "PXB"), ("mlx5_3", "PXB"),
        ("mlx5_6", "PXB"), ("mlx5_7", "PXB"), ("mlx5_8", "PXB"), ("mlx5_9", "PXB"),
    ]  # fmt: skip
    hgx = nearest_hcas(sample_nodes["hgx-h100-roce"])
    assert {r.name for _, r in hgx.values()} == {"PIX"} and len(
        {h.name for h, _ in hgx.values()}
    ) == 8
    ws = nearest_hcas(sample_nodes["workstation"])  # one NIC (rxe0 has no place): both share it
    assert [(h.name, r.name) for h, r in ws.values()] == [("mlx5_0", "SYS"), ("mlx5_0", "SYS")]


@pytest.mark.parametrize("name", samples.names())
def test_the_nearest_nic_is_always_among_the_nearest(
    name: str, sample_nodes: dict[str, NodeTopology]
) -> None:
    topo = sample_nodes[name]
    for index, (hca, relation) in nearest_hcas(topo).items():
        gpu = topo.gpus[index]
        assert relation == min(pci_relation(gpu.pci, h.dma_pci) for h in topo.hcas if h.dma_pci)
        assert hca.dma_pci is not None and pci_relation(gpu.pci, hca.dma_pci) == relation
