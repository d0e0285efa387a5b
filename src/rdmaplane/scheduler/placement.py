"""Where a GPU/RDMA pod fits on a node, and how well: the scheduler extender's policy.

Pure: it takes a node's published topology (`rdmaplane.nrt`) and a pod's requests and predicts
what the node's kubelet will do with them, following the kubelet's own code (Topology Manager
and device manager, v1.37) and checked against it (tests/kubelet):

- containers are admitted in the kubelet's order (init containers and sidecars, then apps);
  scope `container` asks for a hint per container, scope `pod` one for the pod's effective
  request, which every container then gets;
- per requested device resource, the device manager's hints (`resource_hints`): the sets of
  the NUMA zones holding that resource that have enough free devices (and every device the
  container may reuse from the pod's init containers), preferred when no smaller set has that
  many installed;
- the Topology Manager's merge (`merge_hints`): preferred only when every resource's hint is
  preferred and they are the same zones; `single-numa-node` keeps one-zone hints only,
  `restricted` and `single-numa-node` refuse a hint that is not preferred, `best-effort` admits
  it, `none` gives no affinity at all;
- the device manager's allocation (`allocate`): reusable devices first, then every free device
  inside the affinity before any other.

Which devices inside the affinity is the device plugins' choice; the prediction takes the ones
that pair every GPU with a NIC on its PCIe root where possible (the *best achievable* pairing:
the kubelet itself knows only NUMA), and scores the node 0-10 from that alignment and a packing
term that keeps whole NUMA zones and whole nodes free for large jobs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rdmaplane import nrt as nrtmod
from rdmaplane.errors import InputError
from rdmaplane.scheduler.settings import ResourceNames, Weights

Vec = tuple[int, int, int]  # (GPUs, exclusive HCAs, shared slots)
ZERO: Vec = (0, 0, 0)

MAX_MASK_ZONES = 8  # the Topology Manager's own default limit on NUMA nodes


class RequestError(InputError):
    """A pod whose requests cannot be read; the message names the field."""


@dataclass(frozen=True)
class Policy:
    weights: Weights = field(default_factory=Weights)
    names: ResourceNames = field(default_factory=ResourceNames)


# ---------------------------------------------------------------------------------------------
# Pod requests

KINDS = ("init", "sidecar", "app")


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container's devices: a regular init container, a sidecar (an init container with
    `restartPolicy: Always`) or an app container."""

    kind: str
    devices: Vec
    zero: tuple[int, ...] = ()  # resources its limits name with a count of 0 (see kubelet_hint)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """Device requests of a pod, as the scheduler and the kubelet count them."""

    steps: tuple[ContainerRequest, ...]  # containers naming devices, in the kubelet's order
    total: Vec  # the effective pod request (max of the app sum and each init container)
    zero: tuple[int, ...] = ()  # resources named by some container, 0 in total

    @classmethod
    def of(cls, *devices: Vec) -> PodRequest:
        """A pod of app containers only."""
        steps = tuple(ContainerRequest("app", d) for d in devices if d != ZERO)
        total = ZERO
        for d in devices:
            total = _add(total, d)
        return cls(steps, total)

    @property
    def containers(self) -> tuple[Vec, ...]:
        """Devices of the containers that run alongside each other: sidecars and apps."""
        return tuple(s.devices for s in self.steps if s.kind != "init")

    @property
    def init(self) -> tuple[Vec, ...]:
        return tuple(s.devices for s in self.steps if s.kind == "init")

    @property
    def wants_devices(self) -> bool:
        return self.total != ZERO

    @property
    def wants_rdma(self) -> bool:
        return self.total[1] > 0 or self.total[2] > 0


def pod_request(pod: Any, names: ResourceNames = ResourceNames()) -> PodRequest:
    """Read GPU/HCA/shared-slot requests of a v1 Pod object (requests, else limits), in the
    order the kubelet admits containers: init containers and sidecars as listed, then apps."""
    if not isinstance(pod, Mapping):
        raise RequestError("Pod: expected an object")
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise RequestError("Pod.spec: expected an object")
    steps: list[ContainerRequest] = []
    sidecars: Vec = ZERO
    total: Vec = ZERO
    named: set[int] = set()
    for i, c in _items(spec, "initContainers"):
        vec, names_here = _container_vec(c, f"Pod.spec.initContainers[{i}]", names)
        kind = "sidecar" if c.get("restartPolicy") == "Always" else "init"
        steps.append(ContainerRequest(kind, vec, tuple(r for r in names_here if not vec[r])))
        named.update(names_here)
        if kind == "sidecar":
            sidecars = _add(sidecars, vec)
        else:
            total = _max(total, _add(vec, sidecars))
    apps = sidecars
    for i, c in _items(spec, "containers"):
        vec, names_here = _container_vec(c, f"Pod.spec.containers[{i}]", names)
        steps.append(ContainerRequest("app", vec, tuple(r for r in names_here if not vec[r])))
        named.update(names_here)
        apps = _add(apps, vec)
    total = _max(total, apps)
    return PodRequest(
        tuple(s for s in steps if s.devices != ZERO or s.zero),
        total,
        tuple(r for r in sorted(named) if not total[r]),
    )


def _items(spec: Mapping[str, Any], key: str) -> list[tuple[int, Mapping[str, Any]]]:
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError(f"Pod.spec.{key}: expected a list")
    for i, c in enumerate(value):
        if not isinstance(c, Mapping):
            raise RequestError(f"Pod.spec.{key}[{i}]: expected an object")
    return list(enumerate(value))


def _container_vec(
    container: Mapping[str, Any], where: str, names: ResourceNames
) -> tuple[Vec, tuple[int, ...]]:
    """The container's GPUs, HCAs and shared slots, and which of them it names at all."""
    resources = container.get("resources")
    if resources is None:
        return ZERO, ()
    if not isinstance(resources, Mapping):
        raise RequestError(f"{where}.resources: expected an object")
    amounts = []
    named = []
    for r, name in enumerate(names.as_tuple()):
        value = 0
        for kind in ("limits", "requests"):  # requests win when both are set
            table = resources.get(kind)
            if table is None:
                continue
            if not isinstance(table, Mapping):
                raise RequestError(f"{where}.resources.{kind}: expected an object")
            if name in table:
                value = parse_count(table[name], f"{where}.resources.{kind}[{name}]")
                named.append(r)
        amounts.append(value)
    return (amounts[0], amounts[1], amounts[2]), tuple(dict.fromkeys(named))


def parse_count(value: Any, where: str) -> int:
    """A device count: a whole, non-negative Kubernetes quantity ("2", 2, "1k")."""
    quantity = nrtmod.parse_quantity(value)
    if quantity is None or quantity < 0 or quantity != quantity.to_integral_value():
        raise RequestError(f"{where}: expected a whole number of devices, got {value!r}")
    return int(quantity)


def _add(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def _max(a: Vec, b: Vec) -> Vec:
    return (max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2]))


# ---------------------------------------------------------------------------------------------
# Node state


@dataclass(frozen=True, slots=True)
class RootState:
    """A PCIe root complex: its GPUs and exclusive HCAs (capacity, free) and shared-pool HCAs.

    The root named "" holds a NUMA zone's devices that no published root claims; it never pairs.
    """

    name: str
    gpus: int
    hcas: int
    free_gpus: int
    free_hcas: int
    pool_hcas: int = 0


@dataclass(frozen=True, slots=True)
class ZoneState:
    name: str
    capacity: Vec  # allocatable: the healthy devices
    free: Vec
    roots: tuple[RootState, ...]
    pool_hcas: int = 0  # shared-pool HCAs in this zone
    installed: Vec | None = None  # every device the plugins registered, unhealthy ones too

    @property
    def registered(self) -> Vec:
        """What the kubelet's hints count (its `allDevices`): unhealthy devices too."""
        return self.capacity if self.installed is None else self.installed


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the policy needs of a node; hashable, so decisions can be memoised per state."""

    policy: str
    scope: str
    zones: tuple[ZoneState, ...]

    def fresh(self) -> NodeState:
        """The same node with nothing allocated (tells unresolvable from merely full)."""
        zones = tuple(
            replace(
                z,
                free=z.capacity,
                roots=tuple(replace(r, free_gpus=r.gpus, free_hcas=r.hcas) for r in z.roots),
            )
            for z in self.zones
        )
        return replace(self, zones=zones)


def node_state(
    topology: nrtmod.NodeResourceTopology, names: ResourceNames = ResourceNames()
) -> NodeState:
    """Summarise a published NRT for the policy (zones in NUMA id order)."""
    gpu, hca, shared = names.as_tuple()
    zones = []
    for zone in sorted(topology.numa_zones(), key=_numa_order):
        cap: Vec = (zone.allocatable(gpu), zone.allocatable(hca), zone.allocatable(shared))
        installed: Vec = (zone.capacity(gpu), zone.capacity(hca), zone.capacity(shared))
        free: Vec = (
            min(zone.available(gpu), cap[0]),
            min(zone.available(hca), cap[1]),
            min(zone.available(shared), cap[2]),
        )
        roots = [
            RootState(
                r.name,
                r.allocatable(gpu),
                r.allocatable(hca),
                min(r.available(gpu), r.allocatable(gpu)),
                min(r.available(hca), r.allocatable(hca)),
                r.shared_hcas,
            )
            for r in sorted(topology.pcie_roots(zone.name), key=lambda r: r.name)
        ]
        rest = RootState(
            "",
            max(cap[0] - sum(r.gpus for r in roots), 0),
            max(cap[1] - sum(r.hcas for r in roots), 0),
            max(free[0] - sum(r.free_gpus for r in roots), 0),
            max(free[1] - sum(r.free_hcas for r in roots), 0),
        )
        if rest.gpus or rest.hcas:
            roots.append(rest)
        pool = sum(r.pool_hcas for r in roots) or (1 if cap[2] else 0)
        zones.append(ZoneState(zone.name, cap, free, tuple(roots), pool, installed))
    return NodeState(topology.policy, topology.scope, tuple(zones))


def _numa_order(zone: nrtmod.Zone) -> tuple[int, str]:
    match = re.fullmatch(r"node-(\d+)", zone.name)
    return (int(match.group(1)) if match else 1 << 30, zone.name)


# ---------------------------------------------------------------------------------------------
# The kubelet's choice of NUMA zones

Roots = tuple[tuple[tuple[int, int], ...], ...]  # per zone, per root: (GPUs, HCAs)


@dataclass(frozen=True, slots=True)
class Hint:
    """A Topology Manager hint: a set of NUMA zones (a bitmask of zone indices) and whether it
    is preferred."""

    mask: int
    preferred: bool


@dataclass(frozen=True, slots=True)
class UnitPlacement:
    """Where one container's devices land on a node (the kubelet allocates per container, in
    both scopes; under scope `pod` every container gets the pod's affinity)."""

    unit: Vec
    zones: tuple[int, ...]  # the NUMA affinity the Topology Manager picks; () for none at all
    preferred: bool
    taken: Roots  # devices newly allocated
    shared_taken: int  # shared slots newly allocated (each spans the pool's NUMA zones)
    pcie_pairs: int  # GPUs with a NIC of theirs on the same PCIe root
    numa_pairs: int  # ... on the same NUMA zone (includes pcie_pairs)
    needed: int  # pairs a perfect placement would make
    kind: str = "app"  # init | sidecar | app
    reused: Roots = ()  # devices taken over from the pod's init containers
    shared_reused: int = 0

    @property
    def devices(self) -> Roots:
        """All of the container's GPUs and HCAs: reused and newly taken."""
        return _plus(self.taken, self.reused, 1) if self.reused else self.taken

    @property
    def spilled(self) -> tuple[int, ...]:
        """Zones outside the affinity that devices came from. The Topology Manager can merge
        hints into an affinity narrower than the request (GPUs on {1,3} and NICs on {1,5} give
        {1}, not preferred); the device manager then takes the rest from anywhere."""
        if not self.zones:
            return ()
        return tuple(
            z
            for z, roots in enumerate(self.devices)
            if z not in self.zones and any(g or h for g, h in roots)
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
    shared: int = 0

    def count(self, r: int) -> int:
        if r == 2:
            return self.shared
        return sum(pair[r] for zone in self.roots for pair in zone)

    def mask(self, r: int) -> int:
        """Zones holding reusable devices of resource r (slots: none, they span the pool)."""
        if r == 2:
            return 0
        return sum(1 << z for z, zone in enumerate(self.roots) if any(p[r] for p in zone))

    def after(self, placed: UnitPlacement) -> Reusable:
        """A regular init container adds what it holds; a sidecar or an app container takes
        what it reused away (upstream: add/removeContainerAllocatedResources)."""
        if placed.kind == "init":
            return Reusable(_plus(self.roots, placed.taken, 1), self.shared + placed.shared_taken)
        if not placed.reused:
            return self
        return Reusable(_plus(self.roots, placed.reused, -1), self.shared - placed.shared_reused)


def _no_devices(state: NodeState) -> Roots:
    return tuple(tuple((0, 0) for _ in z.roots) for z in state.zones)


def _plus(a: Roots, b: Roots, sign: int) -> Roots:
    return tuple(
        tuple((g + sign * bg, h + sign * bh) for (g, h), (bg, bh) in zip(za, zb, strict=True))
        for za, zb in zip(a, b, strict=True)
    )


def _mask_sums(values: Sequence[int]) -> list[int]:
    sums = [0] * (1 << len(values))
    for m in range(1, len(sums)):
        low = m & -m
        sums[m] = sums[m ^ low] + values[low.bit_length() - 1]
    return sums


def _mask_maxes(values: Sequence[int]) -> list[int]:
    maxes = [0] * (1 << len(values))
    for m in range(1, len(maxes)):
        low = m & -m
        maxes[m] = max(maxes[m ^ low], values[low.bit_length() - 1])
    return maxes


def _narrowness(mask: int) -> tuple[int, int]:
    """Upstream's `IsNarrowerThan`: fewer NUMA zones, then the lower bitmask."""
    return (mask.bit_count(), mask)


def resource_hints(state: NodeState, r: int, want: int, reusable: Reusable) -> list[Hint]:
    """The device manager's hints for `want` devices of resource r (upstream
    `generateDeviceTopologyHints`): every set of the NUMA zones that have devices of r which
    holds all reusable ones and enough of them with the free ones; preferred when no smaller
    set of those zones has that many devices installed (unhealthy ones count: the kubelet counts
    every registered device). Shared slots span their pool's zones: a set touching the pool
    holds every slot."""
    n = len(state.zones)
    combine = _mask_maxes if r == 2 else _mask_sums
    installed = combine([z.registered[r] for z in state.zones])
    free = combine([z.free[r] for z in state.zones])
    bearing = sum(1 << i for i, z in enumerate(state.zones) if z.registered[r])
    width = bearing.bit_count()
    must, reused = reusable.mask(r), reusable.count(r)
    masks = [m for m in range(1, 1 << n) if not m & ~bearing]
    for m in masks:
        if installed[m] >= want:
            width = min(width, m.bit_count())
    return [
        Hint(m, m.bit_count() == width) for m in masks if not must & ~m and reused + free[m] >= want
    ]


def merge_hints(state: NodeState, hints: Sequence[Sequence[Hint]]) -> Hint:
    """The Topology Manager's merge of the resources' hints (upstream `HintMerger`): a merged
    hint (the AND of one hint per resource) is preferred only when every hint in it is
    preferred and all their zones are equal; the best is the narrowest preferred one, else the
    non-preferred one closest below or at the largest of the resources' narrowest widths
    (`BestNonPreferredAffinityCount`), else the narrowest. A resource with no hint counts as
    `{any, not preferred}`; single-numa-node keeps only preferred one-zone hints first."""
    full = (1 << len(state.zones)) - 1
    if state.policy == "single-numa-node":
        hints = [[h for h in hs if h.preferred and h.mask.bit_count() == 1] for hs in hints]
        if any(not hs for hs in hints):
            return Hint(full, False)
    common: set[int] | None = None
    for hs in hints:
        preferred = {h.mask for h in hs if h.preferred}
        common = preferred if common is None else common & preferred
    if common:
        return Hint(min(common, key=_narrowness), True)
    merged = {full}
    for hs in hints:
        masks = {h.mask for h in hs} or {full}
        merged = {a & m for a in merged for m in masks}
    merged.discard(0)
    if not merged:
        return Hint(full, False)
    target = max((min(h.mask.bit_count() for h in hs) for hs in hints if hs), default=0)
    at = [m for m in merged if m.bit_count() == target]
    below = [m for m in merged if m.bit_count() < target]
    if at:
        return Hint(min(at, key=_narrowness), False)
    if below:
        top = max(m.bit_count() for m in below)
        return Hint(min(m for m in below if m.bit_count() == top), False)
    return Hint(min(merged, key=_narrowness), False)


def kubelet_hint(
    state: NodeState, unit: Vec, reusable: Reusable, zero: Iterable[int] = ()
) -> tuple[Hint, bool] | None:
    """The affinity the Topology Manager gives a unit and whether it admits it; None under
    policy `none` (no hints, no affinity). Beyond 8 NUMA zones the kubelet refuses to start
    with a policy (`max-allowable-numa-nodes`): treated as no alignment at all.

    A resource named with a count of 0 (`rdmaplane.io/hca: "0"`) still gets hints upstream:
    every set of its zones, the one-zone sets preferred. So it can spoil a merge: 8 GPUs (both
    zones, preferred) next to `hca: 0` (both zones: not preferred) is refused by restricted."""
    if state.policy == "none" or not state.zones:
        return None
    full = (1 << len(state.zones)) - 1
    if len(state.zones) > MAX_MASK_ZONES:
        return Hint(full, False), state.policy not in ("restricted", "single-numa-node")
    named = {r for r in range(3) if unit[r]} | {
        r for r in zero if any(z.registered[r] for z in state.zones)
    }
    hints = [resource_hints(state, r, unit[r], reusable) for r in sorted(named)]
    if not hints:  # no device asked for: the providers have no preference
        return Hint(full, True), True
    best = merge_hints(state, hints)
    admit = best.preferred or state.policy == "best-effort"
    return best, admit


def _misfit_reason(
    state: NodeState, unit: Vec, names: ResourceNames, reusable: Reusable | None = None
) -> str:
    short = _short_of(state, unit, reusable)
    if short is not None:
        return f"insufficient {names.as_tuple()[short]}"
    wants = " + ".join(f"{unit[r]} {names.as_tuple()[r]}" for r in range(3) if unit[r])
    if state.policy == "single-numa-node":
        return f"single-numa-node: no NUMA zone can hold {wants}"
    if state.policy == "restricted":
        return f"restricted: {wants} cannot be placed on the fewest NUMA zones possible"
    return f"insufficient free devices for {wants}"


@dataclass(slots=True)
class _Pool:
    """Devices of one kind, per zone and root, and what one container took of them."""

    free: list[list[int]]
    took: list[list[int]]

    @classmethod
    def of(cls, counts: Sequence[Sequence[int]]) -> _Pool:
        return cls([list(row) for row in counts], [[0] * len(row) for row in counts])

    def take(self, z: int, i: int, count: int) -> int:
        step = min(self.free[z][i], count)
        self.free[z][i] -= step
        self.took[z][i] += step
        return step

    def take_in_zone(self, z: int, count: int, partner: _Pool) -> int:
        """Up to `count` from zone z, first from roots where the partner kind has none free (so
        roots that can still make a pair stay whole)."""
        got = 0
        for i in sorted(range(len(self.free[z])), key=lambda i: partner.free[z][i] > 0):
            got += self.take(z, i, count - got)
        return got


def _free(state: NodeState) -> Roots:
    return tuple(tuple((r.free_gpus, r.free_hcas) for r in z.roots) for z in state.zones)


def _pools(devices: Roots) -> tuple[_Pool, _Pool]:
    return (
        _Pool.of([[g for g, _ in zone] for zone in devices]),
        _Pool.of([[h for _, h in zone] for zone in devices]),
    )


def _take_pairs(
    state: NodeState,
    pools: tuple[_Pool, _Pool],
    need: list[int],
    order: Sequence[int],
    shared: bool,
) -> Roots:
    """Take GPUs and HCAs from `pools` in the zones in `order`: pairs on one PCIe root first,
    then pairs within a zone, then the rest; `need` goes down by what was taken. With a shared
    slot instead of HCAs a GPU pairs with any pool HCA, so GPUs on roots with pool HCAs go
    first."""
    gpus, hcas = pools
    for z in order:  # 1. pairs on one PCIe root
        for i, root in enumerate(state.zones[z].roots):
            if not root.name:
                continue
            if shared and root.pool_hcas:
                need[0] -= gpus.take(z, i, need[0])
            elif not shared:
                step = min(gpus.free[z][i], hcas.free[z][i], need[0], need[1])
                need[0] -= gpus.take(z, i, step)
                need[1] -= hcas.take(z, i, step)
    for z in order:  # 2. pairs within a NUMA zone
        if shared and state.zones[z].pool_hcas:
            need[0] -= gpus.take_in_zone(z, need[0], hcas)
        elif not shared:
            pairs = min(sum(gpus.free[z]), sum(hcas.free[z]), need[0], need[1])
            need[0] -= gpus.take_in_zone(z, pairs, hcas)
            need[1] -= hcas.take_in_zone(z, pairs, gpus)
    for z in order:  # 3. whatever is left
        need[0] -= gpus.take_in_zone(z, need[0], hcas)
        need[1] -= hcas.take_in_zone(z, need[1], gpus)
    return tuple(tuple(zip(g, h, strict=True)) for g, h in zip(gpus.took, hcas.took, strict=True))


def _plan_zones(state: NodeState, unit: Vec, reusable: Reusable) -> tuple[int, ...]:
    """Without an affinity the plugins choose; assume the narrowest set of zones that holds
    the container (the best case), for the score only: nothing is promised."""
    n = len(state.zones)
    frees = [
        _mask_sums(
            [z.free[r] + sum(p[r] for p in reusable.roots[i]) for i, z in enumerate(state.zones)]
        )
        for r in range(2)
    ]
    for m in sorted(range(1, 1 << n), key=_narrowness):
        if all(frees[r][m] >= unit[r] for r in range(2)):
            return tuple(i for i in range(n) if m >> i & 1)
    return tuple(range(n))


def _short_of(state: NodeState, unit: Vec, reusable: Reusable | None) -> int | None:
    """The first resource the node (free plus the pod's reusable devices) has too few of."""
    slots = max((z.free[2] for z in state.zones if z.capacity[2]), default=0)
    for r, free in enumerate((*_sum_vecs(z.free for z in state.zones)[:2], slots)):
        if unit[r] > free + (reusable.count(r) if reusable else 0):
            return r
    return None


def _none_healthy(state: NodeState, named: Iterable[int], names: ResourceNames) -> str | None:
    """Why the kubelet refuses a container that names (a count of 0 too) a resource whose
    devices are all unhealthy: `devicesToAllocate` checks health before the count."""
    for r in named:
        if any(z.registered[r] for z in state.zones) and not any(
            z.capacity[r] for z in state.zones
        ):
            return f"no healthy {names.as_tuple()[r]} (every one registered is unhealthy)"
    return None


def allocate(
    state: NodeState,
    step: ContainerRequest,
    affinity: tuple[int, ...],
    preferred: bool,
    reusable: Reusable,
    names: ResourceNames = ResourceNames(),
) -> UnitPlacement | Rejection:
    """The devices one container gets (upstream `devicesToAllocate`): its pod's reusable
    devices first, then free ones inside the affinity, and only when those run short the rest
    from other zones. Which ones inside the affinity is up to the device plugins; this takes
    the best achievable pairing (GPU + NIC on one PCIe root, else on one zone)."""
    unit = step.devices
    dead = _none_healthy(state, (*(r for r in range(3) if unit[r]), *step.zero), names)
    if dead is not None:
        return Rejection(dead)
    short = _short_of(state, unit, reusable)
    if short is not None:
        return Rejection(f"insufficient {names.as_tuple()[short]}")
    plan = affinity or _plan_zones(state, unit, reusable)
    rest = tuple(z for z in range(len(state.zones)) if z not in plan)
    need = [unit[0], unit[1]]
    shared = unit[1] == 0 and unit[2] > 0
    reused = _take_pairs(state, _pools(reusable.roots), need, (*plan, *rest), shared)
    free = _pools(_free(state))
    _take_pairs(state, free, need, plan, shared)  # every aligned device before any other
    taken = _take_pairs(state, free, need, rest, shared)
    shared_reused = min(unit[2], reusable.shared)
    placed = UnitPlacement(
        unit,
        affinity,
        preferred,
        taken,
        unit[2] - shared_reused,
        0,
        0,
        0,
        step.kind,
        reused,
        shared_reused,
    )
    return _with_pairs(state, placed)


def _with_pairs(state: NodeState, p: UnitPlacement) -> UnitPlacement:
    """Count the container's GPU-NIC pairs on one PCIe root and on one NUMA zone."""
    unit, devices = p.unit, p.devices
    shared = unit[1] == 0 and unit[2] > 0
    needed = min(unit[0], unit[1]) if unit[1] else (unit[0] if unit[2] else 0)
    pcie = numa = 0
    for z, zone in enumerate(state.zones):
        for root, (g, h) in zip(zone.roots, devices[z], strict=True):
            if root.name:
                pcie += g if shared and root.pool_hcas else (0 if shared else min(g, h))
        gz = sum(g for g, _ in devices[z])
        numa += (
            gz
            if shared and zone.pool_hcas
            else (0 if shared else min(gz, sum(h for _, h in devices[z])))
        )
    return replace(p, pcie_pairs=min(pcie, needed), numa_pairs=min(numa, needed), needed=needed)


def apply(state: NodeState, placement: UnitPlacement) -> NodeState:
    """The node after a placement's devices are taken."""
    return _shift(state, placement, -1)


def release(state: NodeState, placement: UnitPlacement) -> NodeState:
    """The node after a placement's devices are given back."""
    return _shift(state, placement, 1)


def _shift(state: NodeState, placement: UnitPlacement, sign: int) -> NodeState:
    """Shared slots span every zone of their pool, as the NRT counts them."""
    zones = []
    for z, zone in enumerate(state.zones):
        roots = tuple(
            replace(root, free_gpus=root.free_gpus + sign * g, free_hcas=root.free_hcas + sign * h)
            for root, (g, h) in zip(zone.roots, placement.taken[z], strict=True)
        )
        took_g = sum(g for g, _ in placement.taken[z])
        took_h = sum(h for _, h in placement.taken[z])
        slots = placement.shared_taken if zone.capacity[2] else 0
        free = (
            zone.free[0] + sign * took_g,
            zone.free[1] + sign * took_h,
            zone.free[2] + sign * slots,
        )
        zones.append(replace(zone, roots=roots, free=free))
    return replace(state, zones=tuple(zones))


def _sum_vecs(vecs: Iterable[Vec]) -> Vec:
    total = ZERO
    for v in vecs:
        total = _add(total, v)
    return total


# ---------------------------------------------------------------------------------------------
# Verdict and score


@dataclass(frozen=True, slots=True)
class Verdict:
    fits: bool
    unresolvable: bool  # no amount of freeing devices on this node would help
    reason: str  # why it does not fit, or how it fits
    score: int  # 0..10
    alignment: str  # pcie | numa | cross | none (nothing to align) | "" (does not fit)
    placements: tuple[UnitPlacement, ...] = ()
    state_after: NodeState | None = None


PASS_THROUGH = Verdict(True, False, "pod requests no GPU or RDMA device", 0, "none")


def evaluate(state: NodeState, request: PodRequest, policy: Policy = Policy()) -> Verdict:
    """Can the node hold the pod under its Topology Manager policy, and how well (0-10)?"""
    if not request.wants_devices:
        dead = _none_healthy(state, request.zero, policy.names)
        return PASS_THROUGH if dead is None else Verdict(False, True, dead, 0, "")
    outcome = place_pod(state, request, policy.names)
    if isinstance(outcome, Rejection):
        on_empty = place_pod(state.fresh(), request, policy.names)
        if isinstance(on_empty, Rejection):  # what makes it impossible, not what is in use now
            return Verdict(False, True, on_empty.reason, 0, "")
        return Verdict(False, False, outcome.reason, 0, "")
    placements, after = outcome
    align = _alignment(placements, policy.weights)
    pack = _packing(state, after, request, policy.weights)
    w = policy.weights
    total = w.alignment + w.packing
    score = round(10 * (w.alignment * align + w.packing * pack) / total) if total > 0 else 0
    level = alignment_level(placements)
    return Verdict(
        True, False, describe(state, placements), max(0, min(10, score)), level, placements, after
    )


def place_pod(
    state: NodeState, request: PodRequest, names: ResourceNames = ResourceNames()
) -> tuple[tuple[UnitPlacement, ...], NodeState] | Rejection:
    """Each container's devices and the node afterwards, or why the kubelet refuses the pod.

    As the kubelet admits (upstream topologymanager scopes + devicemanager.Allocate): scope
    `container` asks for a hint per container, in order, each seeing what the ones before took;
    scope `pod` one hint for the pod's effective request, then every container is allocated
    within it. Either way, what regular init containers hold is handed to later containers
    first."""
    pod_hint: tuple[Hint, bool] | None = None
    if state.scope == "pod":
        pod_hint = kubelet_hint(state, request.total, Reusable(_no_devices(state)), request.zero)
        if pod_hint is not None and not pod_hint[1]:
            return Rejection(_misfit_reason(state, request.total, names))
    placements = []
    reusable = Reusable(_no_devices(state))
    for step in request.steps:
        if state.scope == "pod":
            decided = pod_hint
        else:
            decided = kubelet_hint(state, step.devices, reusable, step.zero)
        affinity: tuple[int, ...] = ()
        preferred = False
        if decided is not None:
            hint, admit = decided
            if not admit:
                why = _misfit_reason(state, step.devices, names, reusable)
                return Rejection(_prefix(step) + why)
            affinity = tuple(i for i in range(len(state.zones)) if hint.mask >> i & 1)
            preferred = hint.preferred
        placed = allocate(state, step, affinity, preferred, reusable, names)
        if isinstance(placed, Rejection):
            return Rejection(_prefix(step) + placed.reason)
        placements.append(placed)
        state = apply(state, placed)
        reusable = reusable.after(placed)
    return tuple(placements), state


def _prefix(step: ContainerRequest) -> str:
    return "" if step.kind == "app" else f"{step.kind} container: "


def _kept(placements: tuple[UnitPlacement, ...]) -> tuple[UnitPlacement, ...]:
    """The containers that run: sidecars and apps (init containers' devices pass to them)."""
    return tuple(p for p in placements if p.kind != "init") or placements


def _unit_alignment(p: UnitPlacement, w: Weights) -> float:
    """pcie when every GPU has a NIC on its root, numa when on its zone; a unit with any GPU
    whose NIC is across zones ranks below every fully NUMA-aligned one."""
    if not p.needed:
        value = w.pcie
    elif p.numa_pairs == p.needed:
        value = w.numa + (w.pcie - w.numa) * p.pcie_pairs / p.needed
    else:
        value = w.cross + (w.numa - w.cross) * p.numa_pairs / p.needed / 2
    return value if p.aligned else value * w.not_preferred


def _alignment(placements: tuple[UnitPlacement, ...], w: Weights) -> float:
    placements = _kept(placements)
    top = max(w.pcie, w.numa, w.cross) or 1.0
    weights = [max(1, sum(p.unit)) for p in placements]
    total = sum(_unit_alignment(p, w) * k for p, k in zip(placements, weights, strict=True))
    return total / (sum(weights) * top) if weights else 1.0


def _packing(before: NodeState, after: NodeState, request: PodRequest, w: Weights) -> float:
    r = next(i for i in range(3) if request.total[i])
    touched = [
        i
        for i, (b, a) in enumerate(zip(before.zones, after.zones, strict=True))
        if b.free[r] != a.free[r]
    ]
    cap_zones = sum(before.zones[i].capacity[r] for i in touched)
    free_zones = sum(after.zones[i].free[r] for i in touched)
    cap_node = sum(z.capacity[r] for z in before.zones)
    free_node = sum(z.free[r] for z in after.zones)
    zone_fill = 1 - free_zones / cap_zones if cap_zones else 1.0
    node_fill = 1 - free_node / cap_node if cap_node else 1.0
    total = w.zone_fill + w.node_fill
    return (w.zone_fill * zone_fill + w.node_fill * node_fill) / total if total > 0 else 0.0


def alignment_level(placements: tuple[UnitPlacement, ...]) -> str:
    placements = _kept(placements)
    if all(p.needed == 0 for p in placements):
        return "none" if all(p.aligned for p in placements) else "cross"
    if all(p.aligned and p.pcie_pairs == p.needed for p in placements):
        return "pcie"
    if all(p.aligned and p.numa_pairs == p.needed for p in placements):
        return "numa"
    return "cross"


def describe(state: NodeState, placements: Iterable[UnitPlacement]) -> str:
    """One line per node for people: the zones picked and the pairs made."""
    parts = []
    for p in placements:
        zones = ",".join(state.zones[z].name for z in p.zones) or "-"
        pairs = (
            f", {p.pcie_pairs}/{p.needed} PCIe pairs, {p.numa_pairs}/{p.needed} NUMA pairs"
            if p.needed
            else ""
        )
        if not p.zones:
            note = " (no NUMA affinity: policy none, the device plugins choose)"
        elif not p.preferred:
            note = " (affinity not preferred: alignment not promised)"
        else:
            note = ""
        if p.spilled:
            spill = ",".join(state.zones[z].name for z in p.spilled)
            note += f" (kubelet affinity {zones} too small: rest from {spill}, unaligned)"
        parts.append(f"{zones}{pairs}{note}")
    return "; ".join(parts)
