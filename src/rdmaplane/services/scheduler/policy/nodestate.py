"""A node as the placement policy sees it: its NUMA zones, their PCIe roots, and the devices
of each (allocatable, free, registered), summarised from the node's published topology. Pure.

`Roots` is the shape devices are counted in while placing: per NUMA zone, per PCIe root, an
`Amounts` by resource name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from rdmaplane.core import nrt as nrtmod
from rdmaplane.core.resources import DEFAULT, NONE, Amounts, Vocabulary


@dataclass(frozen=True, slots=True)
class RootState:
    """A PCIe root complex: its GPUs and exclusive HCAs by resource (allocatable, free) and the
    HCAs of each shared pool on it.

    The root named "" holds a NUMA zone's devices that no published root claims; it never pairs.
    """

    name: str
    devices: Amounts
    free: Amounts
    pool_hcas: Amounts = NONE
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_hash", hash((self.name, self.devices, self.free, self.pool_hcas))
        )

    def __hash__(self) -> int:  # once: node states are interned, and share their roots
        return self._hash


@dataclass(frozen=True, slots=True)
class ZoneState:
    name: str
    capacity: Amounts  # allocatable: the healthy devices
    free: Amounts
    roots: tuple[RootState, ...]
    pool_hcas: Amounts = NONE  # HCAs of each shared pool in this zone
    installed: Amounts | None = None  # every device the plugins registered, unhealthy ones too
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = (self.name, self.capacity, self.free, self.roots, self.pool_hcas, self.installed)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash

    @property
    def registered(self) -> Amounts:
        """What the kubelet's hints count (its `allDevices`): unhealthy devices too."""
        return self.capacity if self.installed is None else self.installed


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the policy needs of a node; hashable, so decisions can be memoised per state."""

    policy: str
    scope: str
    zones: tuple[ZoneState, ...]
    vocabulary: Vocabulary = DEFAULT  # which of its resources are GPUs, HCA pools, shared pools

    def fresh(self) -> NodeState:
        """The same node with nothing allocated (tells unresolvable from merely full)."""
        zones = tuple(
            replace(
                zone,
                free=zone.capacity,
                roots=tuple(replace(root, free=root.devices) for root in zone.roots),
            )
            for zone in self.zones
        )
        return replace(self, zones=zones)


def node_state(
    topology: nrtmod.NodeResourceTopology, vocabulary: Vocabulary = DEFAULT
) -> NodeState:
    """Summarise a published NRT for the policy (zones in NUMA id order), by the names it
    publishes, else `vocabulary`."""
    names = topology.vocabulary(vocabulary)
    rooted = names.rooted
    zones = []
    for zone in sorted(topology.numa_zones(), key=_numa_order):
        capacity = Amounts((name, zone.allocatable(name)) for name in names.names)
        installed = Amounts((name, zone.capacity(name)) for name in names.names)
        free = Amounts((name, min(zone.available(name), capacity[name])) for name in names.names)
        roots = [
            RootState(
                root.name,
                Amounts((name, root.allocatable(name)) for name in rooted),
                Amounts(
                    (name, min(root.available(name), root.allocatable(name))) for name in rooted
                ),
                Amounts(root.pool_hcas(names.shared)),
            )
            for root in sorted(topology.pcie_roots(zone.name), key=lambda root: root.name)
        ]
        rest = RootState(
            "",
            Amounts(
                (name, max(capacity[name] - sum(root.devices[name] for root in roots), 0))
                for name in rooted
            ),
            Amounts(
                (name, max(free[name] - sum(root.free[name] for root in roots), 0))
                for name in rooted
            ),
        )
        if rest.devices:
            roots.append(rest)
        pool = Amounts(
            (
                shared,
                sum(root.pool_hcas[shared] for root in roots) or (1 if capacity[shared] else 0),
            )
            for shared in names.shared
        )
        zones.append(ZoneState(zone.name, capacity, free, tuple(roots), pool, installed))
    return NodeState(topology.policy, topology.scope, tuple(zones), names)


def _numa_order(zone: nrtmod.Zone) -> tuple[int, str]:
    match = re.fullmatch(r"node-(\d+)", zone.name)
    return (int(match.group(1)) if match else 1 << 30, zone.name)


Roots = tuple[tuple[Amounts, ...], ...]  # per zone, per root: GPUs and exclusive HCAs by name


def no_devices(state: NodeState) -> Roots:
    """Nothing, in the shape of the node's roots."""
    return tuple(tuple(NONE for _ in zone.roots) for zone in state.zones)


def free_devices(state: NodeState) -> Roots:
    """The node's free devices, per zone and root."""
    return tuple(tuple(root.free for root in zone.roots) for zone in state.zones)


def add_roots(left: Roots, right: Roots, sign: int) -> Roots:
    """`left` plus (`sign` > 0) or minus `right`, root by root."""
    return tuple(
        tuple(moved(a, b, sign) for a, b in zip(zone_a, zone_b, strict=True))
        for zone_a, zone_b in zip(left, right, strict=True)
    )


def moved(amounts: Amounts, by: Amounts, sign: int) -> Amounts:
    return amounts + by if sign > 0 else amounts - by
