"""The node's schedulable devices, counted for the NodeResourceTopology object; pure.

Capacity comes from discovery (GPUs in sysfs, the HCAs the device plugin offers); a device is
allocatable when it is healthy by our monitor and the kubelet lists it as allocatable (when the
kubelet could be asked); it is available when allocatable and no pod holds it.

A shared slot grants the whole pool, and the kubelet's Topology Manager counts a device in every
NUMA node its topology names: so a slot is counted in every NUMA zone its pool spans.

Every device is counted by its resource name, whatever the pools are called: the node's
vocabulary (its GPU plugin's resource and the device plugin's pools by mode) goes into the NRT
with them, so the extender reads renamed pools and other GPU vendors as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from rdmaplane.core import audit, nrt
from rdmaplane.core.allocation import Allocations
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.resources import Vocabulary
from rdmaplane.core.settings.deviceplugin import Pool
from rdmaplane.services.agent.policy.health import HcaHealth


@dataclass(frozen=True, slots=True)
class Offered:
    """A device the device plugin advertises: one HCA (exclusive) or a slot of a pool."""

    resource: str
    device_id: str
    hcas: tuple[str, ...]
    shared: bool = False
    # What the plugin tells the kubelet: False for a device it cannot hand out (no verbs node,
    # port down, netns mode), so the NRT does not offer it while the kubelet cannot be asked.
    healthy: bool = True


class _Device(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def hcas(self) -> tuple[str, ...]: ...
    @property
    def healthy(self) -> bool: ...


class _Pool(Protocol):
    """A device plugin pool's decisions (`deviceplugin.resources.ResourceManager`)."""

    @property
    def pool(self) -> Pool: ...
    @property
    def shared(self) -> bool: ...
    @property
    def devices(self) -> Sequence[_Device]: ...


def offered_devices(pools: Iterable[_Pool]) -> list[Offered]:
    """Every device the pools tell the kubelet about (gone ones stay, marked unhealthy)."""
    return [
        Offered(p.pool.resource_name, d.id, d.hcas, p.shared, d.healthy)
        for p in pools
        for d in p.devices
    ]


def vocabulary(
    gpu_resource: str, pools: Iterable[Pool], offered: Iterable[Offered] = ()
) -> Vocabulary:
    """The node's resource names: its GPU plugin's resource, then the device plugin's pools
    (configured, and any other that offers devices) by mode."""
    named = [(p.resource_name, p.mode) for p in pools]
    named += [(o.resource, "shared" if o.shared else "exclusive") for o in offered]
    return Vocabulary.of([gpu_resource], named)


def gpu_ids(topo: NodeTopology) -> dict[int, str]:
    """The GPU plugin's device ID per GPU index: the UUID, else (no NVML) the PCI address."""
    return {g.index: g.uuid or g.pci.address for g in topo.gpus}


def devices(
    topo: NodeTopology,
    offered: Sequence[Offered],
    health: Mapping[str, HcaHealth],
    allocations: Allocations,
    gpu_resource: str,
) -> list[nrt.Device]:
    out = []
    gpu_free = _Usage(allocations, gpu_resource)
    for gpu in topo.gpus:
        device_id = gpu_ids(topo)[gpu.index]
        out.append(
            nrt.Device(
                resource=gpu_resource,
                numa=_numa(gpu.pci.numa),
                pcie_root=gpu.pci.root,
                healthy=gpu_free.allocatable(device_id),
                in_use=gpu_free.used(device_id),
            )
        )
    usage = {r: _Usage(allocations, r) for r in {o.resource for o in offered}}
    for device in offered:
        hcas = [h for h in (topo.hca(n) for n in device.hcas) if h is not None]
        ok = [h for h in hcas if (hh := health.get(h.name)) is not None and hh.healthy]
        healthy = bool(ok) if device.shared else bool(hcas) and len(ok) == len(hcas)
        healthy = (
            healthy and device.healthy and usage[device.resource].allocatable(device.device_id)
        )
        numas = sorted({_numa(h.numa) for h in hcas}) or [-1]
        roots = {h.pcie_root for h in hcas}
        for numa in numas:
            out.append(
                nrt.Device(
                    resource=device.resource,
                    numa=numa,
                    pcie_root=None if device.shared or len(roots) != 1 else next(iter(roots)),
                    healthy=healthy,
                    in_use=usage[device.resource].used(device.device_id),
                )
            )
    return out


class _Usage:
    def __init__(self, allocations: Allocations, resource: str) -> None:
        self._allocatable = allocations.allocatable_ids(resource)
        self._used = allocations.in_use(resource)

    def allocatable(self, device_id: str) -> bool:
        return self._allocatable is None or device_id in self._allocatable

    def used(self, device_id: str) -> bool:
        return device_id in self._used


def _numa(numa: int | None) -> int:
    return -1 if numa is None else numa


def nrt_object(
    node_name: str,
    topo: NodeTopology,
    offered: Sequence[Offered],
    health: Mapping[str, HcaHealth],
    allocations: Allocations,
    *,
    gpu_resource: str,
    policy: str,
    scope: str,
    uplinks: Iterable[nrt.Uplink] = (),
    pools: Iterable[Pool] = (),
) -> dict[str, Any]:
    """The NodeResourceTopology object (a dict for the API server) of the node right now;
    `pools` are the device plugin's (those that offer no device yet are named too)."""
    pool = _shared_pool(topo, offered)
    resources = [gpu_resource, *sorted({o.resource for o in offered})]
    topology = nrt.build(
        node_name,
        devices(topo, offered, health, allocations, gpu_resource),
        policy=policy,
        scope=scope,
        accounted_pods=allocations.accounted_pods(resources),
        distances=nrt.numa_distances(topo),
        shared_pool_hcas=pool,
        uplinks=uplinks,
        vocabulary=vocabulary(gpu_resource, pools, offered),
    )
    fleet = tuple(nrt.Attribute(k, v) for k, v in audit.attributes(topo).items())
    return nrt.to_object(replace(topology, attributes=topology.attributes + fleet))


def _shared_pool(topo: NodeTopology, offered: Iterable[Offered]) -> list[nrt.PoolHca]:
    """Each shared pool's HCAs, once per pool (every slot of a pool names them all)."""
    members = sorted({(o.resource, n) for o in offered if o.shared for n in o.hcas})
    return [
        nrt.PoolHca(pool, _numa(h.numa), h.pcie_root)
        for pool, name in members
        if (h := topo.hca(name)) is not None
    ]
