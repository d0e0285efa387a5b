"""What the node offers through DRA: one device per HCA port of the pools, with attributes; pure.

The pools are the device plugin's (selectors choose the ports, the NCCL settings are the GID and
environment policy), so both ways of serving a node offer the same ports with the same plan. A
port offered once stays offered while it exists, even when it goes down (it is then tainted,
see `slices`), so a running pod's device never silently leaves the slice; a port whose HCA
vanished is dropped. Whether a device can be handed out is the device plugin's rule
(`rdmaplane.core.usability`), applied to its one port (`unusable`), with the faults the agent's
health rules report for that port.

Names are DNS labels derived from the PCI address (`pci-0000-1a-00-0-p1`): HCA names such as
`mlx5_3` can move to another card when cards are added, and an allocation made before a
reboot must still mean the same NIC after it. Standard attributes (`resource.kubernetes.io/…`)
follow `k8s.io/dynamic-resource-allocation/deviceattribute`: `pcieRoot` is `pci<domain>:<bus>`,
the first directory below `/sys/devices`, of the function the NIC's DMA goes through (on a
ConnectX-8 with Data Direct that function's: the GPU's root on GB300, not the NIC's own);
`numaNode` is left out when the kernel says -1 (a value every NUMA-less device shared would
pair them all).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rdmaplane.core.gid import select_gid
from rdmaplane.core.model import Hca, LinkLayer, NodeTopology, Port
from rdmaplane.core.nccl import NcclSettings
from rdmaplane.core.nrt import Uplink
from rdmaplane.core.selectors import Selectors, compute_ports, natural_key
from rdmaplane.core.settings.dra import DraSharing
from rdmaplane.core.usability import Unusable, why_unusable

STANDARD = "resource.kubernetes.io/"
PCIE_ROOT = STANDARD + "pcieRoot"
PCI_BUS_ID = STANDARD + "pciBusID"
NUMA_NODE = STANDARD + "numaNode"
MAX_STRING = 64  # a string attribute value may not be longer (ResourceSlice validation)
MAX_NAME = 63  # a device name is a DNS label

_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")

AttributeValue = int | str | bool


@dataclass(frozen=True, slots=True)
class DraPool:
    """A device plugin pool as DRA uses it: which ports, and the NCCL/GID policy for them;
    `share` for a shared pool (its ports go to several claims, each taking some bandwidth)."""

    name: str  # the pool's resource name, e.g. rdmaplane.io/hca
    selectors: Selectors | None = None  # None: the fastest class of ports that are up
    settings: NcclSettings = field(default_factory=NcclSettings)
    share: DraSharing | None = None


@dataclass(frozen=True, slots=True)
class Share:
    """A port offered to several claims: `capacity_gbps` (its rate, down to a whole step) is
    consumed by their requests, `default_gbps` each unless they name more or less."""

    capacity_gbps: int
    default_gbps: int
    step_gbps: int


def share_of(port: Port, rule: DraSharing) -> Share | None:
    """The share policy of one port of a shared pool; None (offered whole) when its rate is
    unknown or below one step."""
    if port.rate_gbps is None:
        return None
    capacity = int(port.rate_gbps) // rule.step_gbps * rule.step_gbps
    if capacity < rule.step_gbps:
        return None
    return Share(capacity, min(rule.default_gbps, capacity), rule.step_gbps)


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One HCA port offered to claims."""

    name: str
    hca: str
    port: int
    pool: str
    attributes: tuple[tuple[str, AttributeValue], ...] = ()  # sorted by name
    share: Share | None = None  # None: one claim at a time

    def attribute(self, name: str) -> AttributeValue | None:
        return next((v for k, v in self.attributes if k == name), None)


def device_name(hca: Hca, port: int) -> str:
    """`pci-0000-1a-00-0-p1`; software devices (no PCI function) by their HCA name."""
    base = f"pci-{hca.pci.address}" if hca.pci is not None else hca.name
    label = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-") or "hca"
    name = f"{label}-p{port}"
    if len(name) > MAX_NAME:
        name = f"{name[: MAX_NAME - 9].rstrip('-')}-{_digest(base, port)}"
    return name


def _digest(text: str, port: int) -> str:
    return hashlib.sha256(f"{text}:{port}".encode()).hexdigest()[:8]


def offer(
    topo: NodeTopology,
    pools: Sequence[DraPool],
    uplinks: Iterable[Uplink] = (),
    before: Mapping[str, DraDevice] | None = None,
) -> dict[str, DraDevice]:
    """The devices to publish, by name: every pool's ports (a port two pools select belongs to
    the first), plus the devices of `before` whose port still exists. `uplinks` (the agent's
    fabric source) give the tier-0 switch and rail attributes."""
    by_hca = {u.hca: u for u in uplinks}
    chosen: dict[tuple[str, int], tuple[Hca, Port, DraPool]] = {}
    for pool in pools:
        for hca, port in compute_ports(topo, pool.selectors):
            chosen.setdefault((hca.name, port.number), (hca, port, pool))
    pools_by_name = {p.name: p for p in pools}
    for old in (before or {}).values():
        still = topo.hca(old.hca)
        still_port = still.port(old.port) if still is not None else None
        its_pool = pools_by_name.get(old.pool)
        if still is not None and still_port is not None and its_pool is not None:
            chosen.setdefault((old.hca, old.port), (still, still_port, its_pool))
    out: dict[str, DraDevice] = {}
    for key in sorted(chosen, key=lambda k: (natural_key(k[0]), k[1])):
        hca, port, pool = chosen[key]
        name = device_name(hca, port.number)
        if name in out:  # two software devices whose names differ only in punctuation
            name = f"{name[: MAX_NAME - 9].rstrip('-')}-{_digest(hca.name, port.number)}"
        attributes = _attributes(hca, port, pool, by_hca.get(hca.name))
        share = share_of(port, pool.share) if pool.share is not None else None
        out[name] = DraDevice(name, hca.name, port.number, pool.name, attributes, share)
    return out


def unusable(
    topo: NodeTopology,
    devices: Mapping[str, DraDevice],
    pools: Sequence[DraPool],
    device_nodes: Collection[str],
    dev_root: str,
    reported: Mapping[tuple[str, int], str] | None = None,
) -> dict[str, Unusable]:
    """Each device (by name) whose port cannot be handed out, and why: `why_unusable` for that
    one port with its pool's NCCL settings and the fault `reported[(hca, port)]` (what the agent's
    rule table calls unhealthy and only it sees: rising error counters), whatever its link
    class. A device serves one claim, so the device plugin's shared-pool rule (exclusive netns
    mode) is not one of them."""
    settings = {p.name: p.settings for p in pools}
    out = {}
    for name, device in devices.items():
        hca = topo.hca(device.hca)
        port = hca.port(device.port) if hca is not None else None
        if hca is None or port is None:  # not offered: `offer` drops such devices
            continue
        problem = why_unusable(
            topo,
            hca,
            [port],
            settings[device.pool],
            device_nodes=device_nodes,
            dev_root=dev_root,
            fault=(reported or {}).get((device.hca, device.port)),
        )
        if problem is not None:
            out[name] = problem
    return out


def _attributes(
    hca: Hca, port: Port, pool: DraPool, uplink: Uplink | None
) -> tuple[tuple[str, AttributeValue], ...]:
    found: dict[str, AttributeValue | None] = {
        "rdmaDevice": hca.name,
        "port": port.number,
        "linkLayer": port.link_layer.value,
        "netdev": port.netdev,
        "pool": pool.name,
        "rateGbps": round(port.rate_gbps) if port.rate_gbps is not None else None,
    }
    if hca.pci is not None:
        root = hca.pcie_root or ""  # of its DMA function: a ConnectX-8's Data Direct one
        found[PCIE_ROOT] = root if _ROOT.match(root) else None
        found[PCI_BUS_ID] = hca.pci.address if _BDF.match(hca.pci.address) else None
    if hca.data_direct is not None and _BDF.match(hca.data_direct.address):
        found["dataDirectBusID"] = hca.data_direct.address
    if hca.numa is not None and hca.numa >= 0:
        found[NUMA_NODE] = found["numaNode"] = hca.numa
    if port.link_layer == LinkLayer.ETHERNET:
        found["gidIndex"] = select_gid(hca, port, pool.settings.gid_policy).index
    if uplink is not None:
        found["tier0Switch"] = uplink.switch
        found["rail"] = uplink.rail
    return tuple(
        sorted(
            (k, v)
            for k, v in found.items()
            if v is not None and not (isinstance(v, str) and not 0 < len(v) <= MAX_STRING)
        )
    )
