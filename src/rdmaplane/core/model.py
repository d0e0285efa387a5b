"""The node model: one name for each thing on a GPU/RDMA node.

Pure data, no I/O. An `Hca` is an RDMA device (`mlx5_0`), a `Port` belongs to an HCA, a `Gid` to
a port, a `Netdev` is a Linux interface. Everything is frozen so a `NodeTopology` can be shared
between the device plugin, the publisher and the health monitor without copies.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

from rdmaplane.core import names

SCHEMA = names.NODE_TOPOLOGY_SCHEMA

# Linux numbers NUMA nodes below MAX_NUMNODES (1 << CONFIG_NODES_SHIFT, at most 1024): a
# larger one is junk, never a zone.
MAX_NUMA_NODES = 1024
# No RDMA port runs faster (XDR: 1.6 Tb/s on a 4x port); a rate above, or not above 0, is junk.
MAX_RATE_GBPS = 10_000.0
# PCIe 7.0 runs 128 GT/s per lane; the widest link the spec allows is x32.
MAX_PCIE_GTS = 128.0
MAX_PCIE_WIDTH = 32

NVIDIA_VENDOR = "0x10de"
MELLANOX_VENDOR = "0x15b3"


class PortState(IntEnum):
    """Logical port state, the number in `ports/<n>/state` (`4: ACTIVE`)."""

    NOP = 0
    DOWN = 1
    INIT = 2
    ARMED = 3
    ACTIVE = 4
    ACTIVE_DEFER = 5


class PhysState(IntEnum):
    """Physical port state, the number in `ports/<n>/phys_state` (`5: LinkUp`)."""

    NOP = 0
    SLEEP = 1
    POLLING = 2
    DISABLED = 3
    TRAINING = 4
    LINK_UP = 5
    LINK_ERROR_RECOVERY = 6
    PHY_TEST = 7


def link_up(state: int, phys_state: int) -> bool:
    """Usable for traffic: logically ACTIVE and physically LinkUp (the numbers as sysfs has
    them, or the enums): the one rule for what a port that is up is."""
    return state == PortState.ACTIVE and phys_state == PhysState.LINK_UP


class LinkLayer(StrEnum):
    INFINIBAND = "InfiniBand"
    ETHERNET = "Ethernet"
    UNKNOWN = "Unknown"


class NetnsMode(StrEnum):
    """The RDMA subsystem's network-namespace mode (ib_core `netns_mode`, `rdma system show`).

    Shared: every network namespace sees every RDMA device (what a device plugin handing out
    `/dev/infiniband/*` to pods relies on). Exclusive: a device is seen only in the namespace it
    belongs to (an RDMA CNI moves one into a pod). Unknown: the node could not tell."""

    SHARED = "shared"
    EXCLUSIVE = "exclusive"
    UNKNOWN = "unknown"


class GidType(StrEnum):
    """What `gid_attrs/types/<i>` says. IB ports report `IB/RoCE v1` for their GIDs too."""

    ROCE_V1 = "IB/RoCE v1"
    ROCE_V2 = "RoCE v2"


@dataclass(frozen=True, slots=True)
class Gid:
    """One non-empty entry of a port's GID table.

    `type` and `netdev` are None when reading their attribute failed (the kernel answers EINVAL
    for entries being torn down, and for IB ports' `ndevs`); `attrs_error` then says why.
    """

    index: int
    raw: str
    type: GidType | None = None
    netdev: str | None = None
    attrs_error: str | None = None

    @property
    def address(self) -> ipaddress.IPv6Address:
        return ipaddress.IPv6Address(self.raw)

    @property
    def is_zero(self) -> bool:
        return self.address.packed == bytes(16)

    @property
    def is_link_local(self) -> bool:
        return self.address.is_link_local

    @property
    def is_ipv4_mapped(self) -> bool:
        return self.address.ipv4_mapped is not None

    @property
    def ip(self) -> str | None:
        """The interface address a RoCE GID encodes; None for empty and IB GIDs."""
        if self.is_zero:
            return None
        mapped = self.address.ipv4_mapped
        return str(mapped) if mapped is not None else str(self.address)

    @property
    def family(self) -> int | None:
        """4 or 6 for RoCE GIDs that carry an IP address, None otherwise."""
        if self.is_zero:
            return None
        return 4 if self.is_ipv4_mapped else 6


@dataclass(frozen=True, slots=True)
class PcieLink:
    """A PCI function's link (`current_link_speed`/`_width`, `max_link_speed`/`_width`) and, when
    known, the maximum of the port above it (the slot's: a x16 card in a x8 slot runs x8 by
    design). Speeds in GT/s."""

    speed_gts: float
    width: int
    max_speed_gts: float
    max_width: int
    slot_speed_gts: float | None = None
    slot_width: int | None = None

    @property
    def expected_speed_gts(self) -> float:
        return min(self.max_speed_gts, self.slot_speed_gts or self.max_speed_gts)

    @property
    def expected_width(self) -> int:
        return min(self.max_width, self.slot_width or self.max_width)


@dataclass(frozen=True, slots=True)
class PciDevice:
    """A PCI function and where it hangs in the PCIe tree.

    `bridges` lists every bridge between the root complex (`root`, e.g. `pci0000:17`) and the
    function, root port first: a switch shows up as its upstream port plus one downstream port.
    """

    address: str
    root: str
    bridges: tuple[str, ...] = ()
    vendor: str | None = None
    device: str | None = None
    class_code: str | None = None
    numa: int | None = None
    driver: str | None = None
    local_cpus: str | None = None
    link: PcieLink | None = None

    @property
    def parent(self) -> str:
        return self.bridges[-1] if self.bridges else self.root


@dataclass(frozen=True, slots=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...] = ()
    distances: tuple[int, ...] = ()  # to every NUMA node, in id order, as the kernel lists them


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU, numbered in PCI bus order like `nvidia-smi` does."""

    index: int
    pci: PciDevice
    uuid: str | None = None
    name: str | None = None
    nvlinks: tuple[tuple[str, int], ...] | None = None  # (peer PCI address, links); NVML only


@dataclass(frozen=True, slots=True)
class Port:
    number: int
    state: PortState
    phys_state: PhysState
    link_layer: LinkLayer
    rate_gbps: float | None = None
    rate: str | None = None  # as the kernel prints it, e.g. "400 Gb/sec (4X NDR)"
    lid: int | None = None
    sm_lid: int | None = None
    netdev: str | None = None
    gids: tuple[Gid, ...] = ()
    gid_table_len: int = 0
    umad: str | None = None  # e.g. "umad0"
    issm: str | None = None

    @property
    def is_up(self) -> bool:
        """Usable for traffic (`link_up`)."""
        return link_up(self.state, self.phys_state)


@dataclass(frozen=True, slots=True)
class PortObservation:
    """One poll's view of a port (the agent's cheap probe): its states and the watched error
    counters that could be read."""

    hca: str
    port: int
    state: PortState
    phys_state: PhysState
    counters: Mapping[str, int] = field(default_factory=dict)

    @property
    def is_up(self) -> bool:
        return link_up(self.state, self.phys_state)


DATA_DIRECT_DEVICE = "0x2100"  # ConnectX-8's Data Direct DMA function (Mellanox vendor)


@dataclass(frozen=True, slots=True)
class Hca:
    """An RDMA device. `pci` is None for software devices (rxe, siw).

    `data_direct` is the NIC's Data Direct function (ConnectX-8 and later, device 0x2100): a
    second PCIe function of the card, a DMA engine the NIC reaches the GPU's memory through,
    often under another root complex than the NIC's own (GB300: the GPU's). Pairing a NIC
    with a GPU goes by the function its DMA takes: `dma_pci`, and so `pcie_root`."""

    name: str
    pci: PciDevice | None
    ports: tuple[Port, ...] = ()
    node_type: str | None = None
    node_guid: str | None = None
    sys_image_guid: str | None = None
    fw_ver: str | None = None
    hca_type: str | None = None
    board_id: str | None = None
    uverbs: str | None = None  # e.g. "uverbs0"
    parent_netdev: str | None = None  # software devices name the netdev they run on
    data_direct: PciDevice | None = None

    @property
    def numa(self) -> int | None:
        return self.pci.numa if self.pci else None

    @property
    def dma_pci(self) -> PciDevice | None:
        """The function the NIC's DMA to GPU memory goes through: its Data Direct function
        when it has one, else its own."""
        return self.data_direct or self.pci

    @property
    def pcie_root(self) -> str | None:
        """The root complex that pairs it with a GPU (its DMA function's)."""
        return self.dma_pci.root if self.dma_pci else None

    def port(self, number: int) -> Port | None:
        return next((p for p in self.ports if p.number == number), None)


class NetdevKind(StrEnum):
    PHYSICAL = "physical"
    IPOIB = "ipoib"
    BOND = "bond"
    VLAN = "vlan"
    VIRTUAL = "virtual"


@dataclass(frozen=True, slots=True)
class Netdev:
    name: str
    kind: NetdevKind
    pci: str | None = None  # PCI address of the function behind it
    mac: str | None = None
    mtu: int | None = None
    operstate: str | None = None
    speed_mbps: int | None = None
    master: str | None = None  # bond this interface is enslaved to
    lower: tuple[str, ...] = ()  # bond slaves / VLAN parent
    dev_port: int | None = None


@dataclass(frozen=True, slots=True)
class ReadWarning:
    """Something the reader could not read or understand, and the file it came from."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """Everything rdmaplane knows about one node."""

    hostname: str | None = None
    numa_nodes: tuple[NumaNode, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    hcas: tuple[Hca, ...] = ()
    netdevs: tuple[Netdev, ...] = ()
    warnings: tuple[ReadWarning, ...] = ()
    source: str | None = None
    netns_mode: NetnsMode = NetnsMode.UNKNOWN

    def hca(self, name: str) -> Hca | None:
        return next((h for h in self.hcas if h.name == name), None)

    def netdev(self, name: str) -> Netdev | None:
        return next((n for n in self.netdevs if n.name == name), None)


def parse_cpulist(text: str) -> tuple[int, ...]:
    """The kernel's CPU list notation: `0-3,8,10-11` → (0, 1, 2, 3, 8, 10, 11).

    Raises ValueError on anything else (including ranges too wide to be real)."""
    cpus: list[int] = []
    for part in filter(None, text.replace("\n", ",").split(",")):
        lo, sep, hi = part.partition("-")
        first, last = int(lo), int(hi) if sep else int(lo)
        if first < 0 or last < first or last - first > 65536:
            raise ValueError(part)
        cpus.extend(range(first, last + 1))
    return tuple(cpus)


def format_cpulist(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 3, 8) → `0-3,8`."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


def parse_rate_gbps(text: str) -> float:
    """A port's `rate` as the kernel prints it: `400 Gb/sec (4X NDR)` → 400.0.

    Raises ValueError on anything else."""
    m = _RATE.match(text)
    if not m:
        raise ValueError(text)
    return float(m.group(1))
