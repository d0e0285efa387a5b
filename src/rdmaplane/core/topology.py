"""How far apart two PCI devices are, in the words `nvidia-smi topo -m` uses.

`X` self · `PIX` at most one PCIe switch between them · `PXB` several switches, no host bridge ·
`PHB` through the host bridge of one root complex · `NODE` between root complexes of one NUMA
node · `SYS` across the inter-socket link · `NV#` bonded NVLinks (only when NVML told us).

Pure functions over the model; no I/O.
"""

from __future__ import annotations

from enum import IntEnum

from rdmaplane.core.model import Gpu, Hca, NodeTopology, PciDevice


class Relation(IntEnum):
    """PCIe distance classes, ordered from closest to farthest (NCCL's order)."""

    X = 0
    PIX = 1
    PXB = 2
    PHB = 3
    NODE = 4
    SYS = 5


def pci_relation(a: PciDevice, b: PciDevice) -> Relation:
    """The PCIe relation between two functions.

    Functions of one card, or devices below one switch, leave at most one bridge behind the
    deepest bridge they share: PIX. More bridges without leaving the root complex: PXB. Sharing
    only the root complex: PHB. Different root complexes: NODE within a NUMA node (or when NUMA
    is unknown, as on `numa=off` kernels), SYS across NUMA nodes.
    """
    if a.address == b.address:
        return Relation.X
    if a.root != b.root:
        if a.numa is not None and b.numa is not None and a.numa != b.numa:
            return Relation.SYS
        return Relation.NODE
    shared = _common_prefix(a.bridges, b.bridges)
    if shared == 0:
        return Relation.PHB
    below = max(len(a.bridges), len(b.bridges)) - shared
    return Relation.PIX if below <= 1 else Relation.PXB


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def device_label(d: Gpu | Hca) -> str:
    """The row/column name of a device in relation maps: `GPU<i>` or the HCA name."""
    return f"GPU{d.index}" if isinstance(d, Gpu) else d.name


def relation_label(a: Gpu | Hca, b: Gpu | Hca) -> str | None:
    """`X`, `NV#` or a PCIe relation word; None when either side has no PCI function (rxe). An
    HCA is where its DMA goes through (`Hca.dma_pci`: a ConnectX-8's Data Direct function),
    as NCCL places it; nvidia-smi places it at its own function."""
    if a is b:
        return "X"
    if isinstance(a, Gpu) and isinstance(b, Gpu):
        links = _nvlinks(a, b)
        if links:
            return f"NV{links}"
    pa = a.pci if isinstance(a, Gpu) else a.dma_pci
    pb = b.pci if isinstance(b, Gpu) else b.dma_pci
    if pa is None or pb is None:
        return None
    return pci_relation(pa, pb).name


def _nvlinks(a: Gpu, b: Gpu) -> int:
    if a.nvlinks is None:
        return 0
    return sum(n for peer, n in a.nvlinks if peer == b.pci.address)


def relations(topo: NodeTopology) -> dict[str, dict[str, str | None]]:
    """The full matrix over GPUs (PCI-bus order) then HCAs, keyed by `device_label`."""
    devices: list[Gpu | Hca] = [*topo.gpus, *topo.hcas]
    return {
        device_label(a): {device_label(b): relation_label(a, b) for b in devices} for a in devices
    }


def _closest_hcas(gpu: Gpu, hcas: tuple[Hca, ...] | list[Hca]) -> list[tuple[Hca, Relation]]:
    """HCAs with a PCI function ordered nearest first (ties keep the given order), by where
    their DMA goes through (`Hca.dma_pci`)."""
    pairs = [(h, pci_relation(gpu.pci, h.dma_pci)) for h in hcas if h.dma_pci is not None]
    return sorted(pairs, key=lambda p: p[1])


def nearest_hcas(topo: NodeTopology) -> dict[int, tuple[Hca, Relation]]:
    """Each GPU's nearest HCA (by GPU index), pairing as NCCL does: among HCAs equally near,
    GPUs in PCI order take distinct ones while the tree allows (DGX A100: GPU0 and GPU1 share a
    switch with mlx5_0 and mlx5_1, PXB both, and get one each), then the least taken."""
    taken: dict[str, int] = {}
    out: dict[int, tuple[Hca, Relation]] = {}
    for gpu in topo.gpus:
        ranked = _closest_hcas(gpu, topo.hcas)
        if not ranked:
            continue
        best = ranked[0][1]
        tied = [h for h, r in ranked if r == best]
        choice = min(tied, key=lambda h: taken.get(h.name, 0))  # the first of the least taken
        taken[choice.name] = taken.get(choice.name, 0) + 1
        out[gpu.index] = (choice, best)
    return out
