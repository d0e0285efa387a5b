"""Who holds which devices, as the kubelet's PodResources API reports it; pure data.

The kubelet knows device IDs only: GPUs by the GPU plugin's IDs (UUIDs from NVML), HCAs by our
device plugin's IDs. `Allocations` keeps them per resource and per pod, so the NRT's
`available` can subtract exactly what running pods hold, and name the pods it accounted for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PodDevices:
    namespace: str
    name: str
    devices: Mapping[str, frozenset[str]]  # resource name → device IDs, all containers together

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Allocations:
    """`allocatable` is None when the kubelet could not be asked (then nothing is known to be
    unallocatable); `pods` lists only pods that hold at least one device."""

    pods: tuple[PodDevices, ...] = ()
    allocatable: Mapping[str, frozenset[str]] | None = None

    def in_use(self, resource: str) -> frozenset[str]:
        return frozenset(i for p in self.pods for i in p.devices.get(resource, ()))

    def accounted_pods(self, resources: Iterable[str]) -> tuple[str, ...]:
        """Sorted `namespace/name` of the pods holding any of `resources`."""
        wanted = set(resources)
        return tuple(sorted({p.key for p in self.pods if wanted & set(p.devices)}))

    def allocatable_ids(self, resource: str) -> frozenset[str] | None:
        if self.allocatable is None:
            return None
        return self.allocatable.get(resource, frozenset())


def merge_containers(
    namespace: str, name: str, containers: Iterable[Iterable[tuple[str, Iterable[str]]]]
) -> PodDevices:
    """One pod's devices from its containers' (resource, IDs) lists."""
    merged: dict[str, set[str]] = {}
    for devices in containers:
        for resource, ids in devices:
            merged.setdefault(resource, set()).update(ids)
    return PodDevices(namespace, name, {r: frozenset(i) for r, i in sorted(merged.items()) if i})
