"""PCIe links that trained below what the device and its slot allow: one judgement for the
health rules, `inspect`, the doctor, the NRT and the fleet audit. Pure.

A link is *downtrained* when it runs narrower than the lower of the device's and its slot's
maximum width, or slower than the lower of their maximum speeds (a x16 NIC at x8 has half its
bandwidth: a loose or dirty connector, a riser, a lane that failed to train). GPUs are judged
like NICs, on width and speed, except at the idle speed: a GPU lowers its link to 2.5 GT/s
(Gen1) while idle to save power, which is no fault; a GPU at 16 of 32 GT/s is downtrained.
"""

from __future__ import annotations

from dataclasses import dataclass

from rdmaplane.core.model import NodeTopology, PcieLink

DOWNTRAINED = "PcieDowntrained"
# The speed a GPU drops its link to while idle (PCIe Gen1): power saving, not a fault.
GPU_IDLE_GTS = 2.5


def describe(link: PcieLink) -> str:
    """`16 GT/s x8`."""
    return f"{link.speed_gts:g} GT/s x{link.width}"


def downtrained(link: PcieLink | None, *, judge_speed: bool = True) -> str | None:
    """Why the link is short of what device and slot allow, or None when it is not (or no link
    is known)."""
    if link is None:
        return None
    narrow = link.width < link.expected_width
    slow = judge_speed and link.speed_gts < link.expected_speed_gts
    if not (narrow or slow):
        return None
    capable = f"{link.expected_speed_gts:g} GT/s x{link.expected_width}"
    return f"PCIe link {describe(link)}, capable of {capable}"


def gpu_downtrained(link: PcieLink | None) -> str | None:
    """`downtrained` for a GPU: width and speed, the idle speed (2.5 GT/s) excepted."""
    idle = link is not None and link.speed_gts <= GPU_IDLE_GTS
    return downtrained(link, judge_speed=not idle)


@dataclass(frozen=True, slots=True)
class Downtrained:
    device: str  # "mlx5_3", "GPU2"
    pci: str
    why: str


def node_downtrained(topo: NodeTopology) -> list[Downtrained]:
    """Every downtrained link of the node: its HCAs, then its GPUs (the idle speed excepted)."""
    found = [
        Downtrained(hca.name, hca.pci.address, why)
        for hca in topo.hcas
        if hca.pci is not None and (why := downtrained(hca.pci.link))
    ]
    return found + [
        Downtrained(f"GPU{gpu.index}", gpu.pci.address, why)
        for gpu in topo.gpus
        if (why := gpu_downtrained(gpu.pci.link))
    ]
