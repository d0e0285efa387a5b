"""The kubelet's device manager, modelled (upstream `pkg/kubelet/cm/devicemanager`, v1.37): the
hints it gives the Topology Manager per resource, the devices it allocates to one container,
and the devices a pod's init containers hand on to its later containers. Pure.

Which devices inside the affinity is the device plugins' choice (`pairing`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from rdmaplane.core.resources import NONE, Amounts
from rdmaplane.services.scheduler.policy.nodestate import (
    NodeState,
    Roots,
    add_roots,
    free_devices,
    moved,
)
from rdmaplane.services.scheduler.policy.numamask import (
    Hint,
    mask_maxes,
    mask_sums,
    narrowness,
    zones_of,
)
from rdmaplane.services.scheduler.policy.pairing import (
    Pairing,
    count_pairs,
    pools_of,
    take_pairs,
)
from rdmaplane.services.scheduler.policy.podrequest import ContainerRequest


@dataclass(frozen=True, slots=True)
class UnitPlacement:
    """Where one container's devices land on a node (the kubelet allocates per container, in
    both scopes; under scope `pod` every container gets the pod's affinity)."""

    unit: Amounts
    zones: tuple[int, ...]  # the NUMA affinity the Topology Manager picks; () for none at all
    preferred: bool
    taken: Roots  # devices newly allocated
    shared_taken: Amounts  # shared slots newly allocated (each spans the pool's NUMA zones)
    pcie_pairs: int  # GPUs with a NIC of theirs on the same PCIe root
    numa_pairs: int  # ... on the same NUMA zone (includes pcie_pairs)
    needed: int  # pairs a perfect placement would make
    kind: str = "app"  # init | sidecar | app
    reused: Roots = ()  # devices taken over from the pod's init containers (() for none)
    shared_reused: Amounts = NONE

    @property
    def devices(self) -> Roots:
        """All of the container's GPUs and HCAs: reused and newly taken."""
        return add_roots(self.taken, self.reused, 1) if self.reused else self.taken

    @property
    def spilled(self) -> tuple[int, ...]:
        """Zones outside the affinity that devices came from. The Topology Manager can merge
        hints into an affinity narrower than the request (GPUs on {1,3} and NICs on {1,5} give
        {1}, not preferred); the device manager then takes the rest from anywhere."""
        if not self.zones:
            return ()
        return tuple(
            zone for zone, roots in enumerate(self.devices) if zone not in self.zones and any(roots)
        )

    @property
    def aligned(self) -> bool:
        """The kubelet promises this container's NUMA alignment: a preferred affinity, nothing
        outside it."""
        return self.preferred and bool(self.zones) and not self.spilled


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str


@dataclass(frozen=True, slots=True)
class Reusable:
    """Devices a pod's regular init containers hold: the device manager hands them to the
    pod's later containers first, and a later container's hints must cover their zones."""

    roots: Roots
    shared: Amounts = NONE  # slots of each shared pool
    holds_devices: bool = field(init=False, repr=False, compare=False)  # on some root

    def __post_init__(self) -> None:
        object.__setattr__(self, "holds_devices", any(any(zone) for zone in self.roots))

    def count(self, name: str) -> int:
        if not self.holds_devices:
            return self.shared[name]
        return self.shared[name] + sum(held[name] for zone in self.roots for held in zone)

    def mask(self, name: str) -> int:
        """Zones holding reusable devices of `name` (slots: none, they span the pool)."""
        if not self.holds_devices:
            return 0
        return sum(
            1 << index for index, zone in enumerate(self.roots) if any(held[name] for held in zone)
        )

    def after(self, placed: UnitPlacement) -> Reusable:
        """A regular init container adds what it holds; a sidecar or an app container takes
        what it reused away (upstream: add/removeContainerAllocatedResources)."""
        if placed.kind == "init":
            return Reusable(
                add_roots(self.roots, placed.taken, 1), self.shared + placed.shared_taken
            )
        if not placed.reused and not placed.shared_reused:
            return self
        roots = add_roots(self.roots, placed.reused, -1) if placed.reused else self.roots
        return Reusable(roots, self.shared - placed.shared_reused)


def resource_hints(state: NodeState, name: str, want: int, reusable: Reusable) -> list[Hint]:
    """The device manager's hints for `want` devices of resource `name` (upstream
    `generateDeviceTopologyHints`): every set of the NUMA zones that have devices of it which
    holds all reusable ones and enough of them with the free ones; preferred when no smaller
    set of those zones has that many devices installed (unhealthy ones count: the kubelet counts
    every registered device). Shared slots span their pool's zones: a set touching the pool
    holds every slot."""
    combine = mask_maxes if state.vocabulary.kind(name) == "shared" else mask_sums
    installed = combine([zone.registered[name] for zone in state.zones])
    free = combine([zone.free[name] for zone in state.zones])
    bearing = sum(1 << i for i, zone in enumerate(state.zones) if zone.registered[name])
    width = bearing.bit_count()
    must, reused = reusable.mask(name), reusable.count(name)
    masks = [mask for mask in range(1, 1 << len(state.zones)) if not mask & ~bearing]
    for mask in masks:
        if installed[mask] >= want:
            width = min(width, mask.bit_count())
    return [
        Hint(mask, mask.bit_count() == width)
        for mask in masks
        if not must & ~mask and reused + free[mask] >= want
    ]


def _plan_zones(state: NodeState, unit: Amounts, reusable: Reusable) -> tuple[int, ...]:
    """Without an affinity the plugins choose; assume the narrowest set of zones that holds
    the container (the best case), for the score only: nothing is promised."""
    count = len(state.zones)
    rooted = [name for name in state.vocabulary.rooted if unit[name]]
    frees = {
        name: mask_sums(
            [
                zone.free[name] + sum(held[name] for held in reusable.roots[i])
                for i, zone in enumerate(state.zones)
            ]
        )
        for name in rooted
    }
    for mask in sorted(range(1, 1 << count), key=narrowness):
        if all(frees[name][mask] >= unit[name] for name in rooted):
            return zones_of(mask, count)
    return tuple(range(count))


def short_of(state: NodeState, unit: Amounts, reusable: Reusable | None) -> str | None:
    """The first resource the node (free plus the pod's reusable devices) has too few of."""
    for name in state.vocabulary.names:
        if not unit[name]:
            continue
        if state.vocabulary.kind(name) == "shared":
            free = max((zone.free[name] for zone in state.zones if zone.capacity[name]), default=0)
        else:
            free = sum(zone.free[name] for zone in state.zones)
        if unit[name] > free + (reusable.count(name) if reusable else 0):
            return name
    return None


def none_healthy(state: NodeState, named: Iterable[str]) -> str | None:
    """Why the kubelet refuses a container that names (a count of 0 too) a resource whose
    devices are all unhealthy: `devicesToAllocate` checks health before the count."""
    for name in named:
        if any(zone.registered[name] for zone in state.zones) and not any(
            zone.capacity[name] for zone in state.zones
        ):
            return f"no healthy {name} (every one registered is unhealthy)"
    return None


def allocate(
    state: NodeState,
    step: ContainerRequest,
    affinity: tuple[int, ...],
    preferred: bool,
    reusable: Reusable,
) -> UnitPlacement | Rejection:
    """The devices one container gets (upstream `devicesToAllocate`): its pod's reusable
    devices first, then free ones inside the affinity, and only when those run short the rest
    from other zones. Which ones inside the affinity is up to the device plugins; this takes
    the best achievable pairing (GPU + NIC on one PCIe root, else on one zone)."""
    unit = step.devices
    dead = none_healthy(state, (*unit, *step.zero))
    if dead is not None:
        return Rejection(dead)
    short = short_of(state, unit, reusable)
    if short is not None:
        return Rejection(f"insufficient {short}")
    plan = affinity or _plan_zones(state, unit, reusable)
    rest = tuple(zone for zone in range(len(state.zones)) if zone not in plan)
    rooted = state.vocabulary.rooted
    need = {name: unit[name] for name in rooted}
    pairing = Pairing.of(state.vocabulary, unit)
    reused: Roots = ()  # nothing, unless earlier init containers left devices to hand on
    if reusable.holds_devices:
        reused = take_pairs(state, pools_of(reusable.roots, rooted), need, (*plan, *rest), pairing)
    free = pools_of(free_devices(state), rooted)
    take_pairs(state, free, need, plan, pairing)  # every aligned device before any other
    taken = take_pairs(state, free, need, rest, pairing)
    slots = unit.only(state.vocabulary.shared)
    shared_reused = Amounts(
        (pool, min(count, reusable.shared[pool])) for pool, count in slots.items()
    )
    placed = UnitPlacement(
        unit,
        affinity,
        preferred,
        taken,
        slots - shared_reused,
        0,
        0,
        0,
        step.kind,
        reused,
        shared_reused,
    )
    pcie, numa, needed = count_pairs(state, unit, placed.devices)
    return replace(placed, pcie_pairs=pcie, numa_pairs=numa, needed=needed)


def apply(state: NodeState, placement: UnitPlacement) -> NodeState:
    """The node after a placement's devices are taken."""
    return _shift(state, placement, -1)


def release(state: NodeState, placement: UnitPlacement) -> NodeState:
    """The node after a placement's devices are given back."""
    return _shift(state, placement, 1)


def _shift(state: NodeState, placement: UnitPlacement, sign: int) -> NodeState:
    """Shared slots span every zone of their pool, as the NRT counts them."""
    zones = []
    for zone, taken in zip(state.zones, placement.taken, strict=True):
        moving = Amounts(
            (pool, count) for pool, count in placement.shared_taken.items() if zone.capacity[pool]
        )
        for held in taken:
            moving = moving + held
        if not moving:  # untouched: the same zone, its hash already known
            zones.append(zone)
            continue
        roots = tuple(
            replace(root, free=moved(root.free, held, sign)) if held else root
            for root, held in zip(zone.roots, taken, strict=True)
        )
        zones.append(replace(zone, roots=roots, free=moved(zone.free, moving, sign)))
    return replace(state, zones=tuple(zones))
