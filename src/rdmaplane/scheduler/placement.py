"""Where a GPU/RDMA pod fits on a node, and how well: the scheduler extender's policy.

Pure: it takes a node's published topology (`rdmaplane.nrt`) and a pod's requests and predicts
what the kubelet's Topology Manager will do with them, the way the kubelet does it:

- per requested device resource, NUMA hints: every set of NUMA zones whose free devices cover
  the request; *preferred* when the set is as small as the node's capacity allows;
- hints of all resources merged by intersection, the best being preferred first, then narrowest,
  then lowest-numbered; `single-numa-node` keeps only preferred one-zone hints, `restricted` and
  `single-numa-node` reject a pod whose best hint is not preferred, `best-effort` and `none`
  admit it anyway (for `none` we assume the same narrowest choice, which the plugins may or may
  not make);
- scope `container` aligns each container alone, in order (init containers each on their own,
  as their devices are reused); scope `pod` aligns the pod's effective request at once.

Inside the chosen NUMA zones it then takes devices so as to pair every GPU with a NIC on its
PCIe root where possible (the *best achievable* pairing; the kubelet itself knows only NUMA), and
scores the node 0-10 from that alignment and a packing term that keeps whole NUMA zones and whole
nodes free for large jobs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import product
from typing import Any

from rdmaplane import nrt as nrtmod

Vec = tuple[int, int, int]  # (GPUs, exclusive HCAs, shared slots)
ZERO: Vec = (0, 0, 0)

MAX_MASK_ZONES = 8  # the Topology Manager's own default limit on NUMA nodes


class RequestError(ValueError):
    """A pod whose requests cannot be read; the message names the field."""


@dataclass(frozen=True)
class ResourceNames:
    gpu: str = nrtmod.GPU
    hca: str = nrtmod.HCA
    hca_shared: str = nrtmod.HCA_SHARED

    def as_tuple(self) -> tuple[str, str, str]:
        return (self.gpu, self.hca, self.hca_shared)


@dataclass(frozen=True)
class Weights:
    """How a score is made; every weight is relative to its sibling(s)."""

    alignment: float = 0.8  # alignment term vs. packing term
    packing: float = 0.2
    pcie: float = 1.0  # value of a GPU paired with a NIC on its PCIe root ...
    numa: float = 0.5  # ... with a NIC on its NUMA zone only ...
    cross: float = 0.0  # ... with a NIC across NUMA zones
    not_preferred: float = 0.5  # factor when the kubelet does not promise NUMA alignment
    zone_fill: float = 0.5  # packing: how full the touched NUMA zones end up ...
    node_fill: float = 0.5  # ... and how full the node ends up


@dataclass(frozen=True)
class Policy:
    weights: Weights = Weights()
    names: ResourceNames = ResourceNames()


# ---------------------------------------------------------------------------------------------
# Pod requests


@dataclass(frozen=True, slots=True)
class PodRequest:
    """Device requests of a pod, as the scheduler and the kubelet count them."""

    containers: tuple[Vec, ...]  # app containers and sidecars with devices, in order
    init: tuple[Vec, ...]  # regular init containers with devices (plus the sidecars before them)
    total: Vec  # the effective pod request (max of the app sum and each init container)

    @property
    def wants_devices(self) -> bool:
        return self.total != ZERO

    @property
    def wants_rdma(self) -> bool:
        return self.total[1] > 0 or self.total[2] > 0

    def units(self, scope: str) -> tuple[tuple[Vec, ...], tuple[Vec, ...]]:
        """(units checked alone, units placed and kept) under a Topology Manager scope."""
        if scope == "pod":
            return (), (self.total,)
        return self.init, self.containers


def pod_request(pod: Any, names: ResourceNames = ResourceNames()) -> PodRequest:
    """Read GPU/HCA/shared-slot requests of a v1 Pod object (requests, else limits)."""
    if not isinstance(pod, Mapping):
        raise RequestError("Pod: expected an object")
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise RequestError("Pod.spec: expected an object")
    apps = [
        _container_vec(c, f"Pod.spec.containers[{i}]", names) for i, c in _items(spec, "containers")
    ]
    sidecars: Vec = ZERO
    init: list[Vec] = []
    for i, c in _items(spec, "initContainers"):
        vec = _container_vec(c, f"Pod.spec.initContainers[{i}]", names)
        if c.get("restartPolicy") == "Always":
            apps.append(vec)
            sidecars = _add(sidecars, vec)
        else:
            init.append(_add(vec, sidecars))
    total = ZERO
    for vec in apps:
        total = _add(total, vec)
    for vec in init:
        total = (max(total[0], vec[0]), max(total[1], vec[1]), max(total[2], vec[2]))
    keep = tuple(v for v in apps if v != ZERO)
    return PodRequest(keep, tuple(v for v in init if v != ZERO), total)


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


def _container_vec(container: Mapping[str, Any], where: str, names: ResourceNames) -> Vec:
    resources = container.get("resources")
    if resources is None:
        return ZERO
    if not isinstance(resources, Mapping):
        raise RequestError(f"{where}.resources: expected an object")
    amounts = []
    for name in names.as_tuple():
        value = 0
        for kind in ("limits", "requests"):  # requests win when both are set
            table = resources.get(kind)
            if table is None:
                continue
            if not isinstance(table, Mapping):
                raise RequestError(f"{where}.resources.{kind}: expected an object")
            if name in table:
                value = parse_count(table[name], f"{where}.resources.{kind}[{name}]")
        amounts.append(value)
    return (amounts[0], amounts[1], amounts[2])


def parse_count(value: Any, where: str) -> int:
    """A device count: a whole, non-negative Kubernetes quantity ("2", 2, "1k")."""
    quantity = nrtmod.parse_quantity(value)
    if quantity is None or quantity < 0 or quantity != quantity.to_integral_value():
        raise RequestError(f"{where}: expected a whole number of devices, got {value!r}")
    return int(quantity)


def _add(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


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
    capacity: Vec  # allocatable
    free: Vec
    roots: tuple[RootState, ...]
    pool_hcas: int = 0  # shared-pool HCAs in this zone


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
        zones.append(ZoneState(zone.name, cap, free, tuple(roots), pool))
    return NodeState(topology.policy, topology.scope, tuple(zones))


def _numa_order(zone: nrtmod.Zone) -> tuple[int, str]:
    match = re.fullmatch(r"node-(\d+)", zone.name)
    return (int(match.group(1)) if match else 1 << 30, zone.name)


# ---------------------------------------------------------------------------------------------
# The kubelet's choice of NUMA zones


@dataclass(frozen=True, slots=True)
class UnitPlacement:
    """Where one alignment unit (a container, or the pod) lands on a node."""

    unit: Vec
    zones: tuple[int, ...]  # the NUMA affinity the Topology Manager picks
    preferred: bool
    taken: tuple[tuple[tuple[int, int], ...], ...]  # per zone, per root: (GPUs, HCAs)
    shared_taken: tuple[int, ...]  # per zone
    pcie_pairs: int  # GPUs with a NIC of theirs on the same PCIe root
    numa_pairs: int  # ... on the same NUMA zone (includes pcie_pairs)
    needed: int  # pairs a perfect placement would make

    @property
    def spilled(self) -> tuple[int, ...]:
        """Zones outside the affinity that devices had to come from. The Topology Manager can
        merge hints into an affinity narrower than the request (GPUs on {1,3} and NICs on {1,5}
        give {1}); the kubelet then takes the rest from anywhere, so no alignment is promised
        for those."""
        return tuple(
            z
            for z, roots in enumerate(self.taken)
            if z not in self.zones and (any(g or h for g, h in roots) or self.shared_taken[z])
        )

    @property
    def aligned(self) -> bool:
        """The kubelet promises this unit's NUMA alignment: preferred hint, nothing spilled."""
        return self.preferred and not self.spilled


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str


def place_unit(
    state: NodeState, unit: Vec, names: ResourceNames = ResourceNames()
) -> UnitPlacement | Rejection:
    """Predict the kubelet's admission and device choice for one unit on a node."""
    totals_free = _sum_vecs(z.free for z in state.zones)
    for r in range(3):
        if unit[r] > totals_free[r]:
            return Rejection(f"insufficient {names.as_tuple()[r]}")
    if unit == ZERO or not state.zones:
        return _allocate(state, unit, tuple(range(len(state.zones))), True)
    chosen = _best_hint(state, unit)
    if chosen is None:
        return Rejection(_misfit_reason(state, unit, names))
    mask, preferred = chosen
    zones = tuple(i for i in range(len(state.zones)) if mask >> i & 1)
    return _allocate(state, unit, zones, preferred)


def _best_hint(state: NodeState, unit: Vec) -> tuple[int, bool] | None:
    n = len(state.zones)
    if n > MAX_MASK_ZONES:  # beyond the Topology Manager's reach: no alignment at all
        return None if state.policy in ("restricted", "single-numa-node") else ((1 << n) - 1, False)
    full = (1 << n) - 1
    requested = [r for r in range(3) if unit[r]]
    frees = {r: _mask_sums([z.free[r] for z in state.zones]) for r in requested}
    preferred_lists = []
    for r in requested:
        caps = _mask_sums([z.capacity[r] for z in state.zones])
        fits = [m for m in range(1, full + 1) if caps[m] >= unit[r]]
        if not fits:
            return None
        width = min(m.bit_count() for m in fits)
        if state.policy == "single-numa-node" and width != 1:
            return None
        preferred_lists.append(
            [m for m in fits if m.bit_count() == width and frees[r][m] >= unit[r]]
        )
    best: int | None = None
    for combo in product(*preferred_lists):
        merged = full
        for m in combo:
            merged &= m
        if merged and (best is None or _narrower(merged, best)):
            best = merged
    if best is not None:
        return best, True
    if state.policy in ("restricted", "single-numa-node"):
        return None
    for m in sorted(range(1, full + 1), key=lambda m: (m.bit_count(), m)):
        if all(frees[r][m] >= unit[r] for r in requested):
            return m, False
    return None


def _narrower(a: int, b: int) -> bool:
    return (a.bit_count(), a) < (b.bit_count(), b)


def _mask_sums(values: Sequence[int]) -> list[int]:
    sums = [0] * (1 << len(values))
    for m in range(1, len(sums)):
        low = m & -m
        sums[m] = sums[m ^ low] + values[low.bit_length() - 1]
    return sums


def _misfit_reason(state: NodeState, unit: Vec, names: ResourceNames) -> str:
    wants = " + ".join(f"{unit[r]} {names.as_tuple()[r]}" for r in range(3) if unit[r])
    if state.policy == "single-numa-node":
        return f"single-numa-node: no NUMA zone can hold {wants}"
    if state.policy == "restricted":
        return f"restricted: {wants} cannot be placed on the fewest NUMA zones possible"
    return f"insufficient free devices for {wants}"


@dataclass(slots=True)
class _Pool:
    """Free and taken devices of one kind, per zone and root, while one unit is placed."""

    free: list[list[int]]
    took: list[list[int]]

    @classmethod
    def of(cls, state: NodeState, gpus: bool) -> _Pool:
        free = [[r.free_gpus if gpus else r.free_hcas for r in z.roots] for z in state.zones]
        return cls(free, [[0] * len(row) for row in free])

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


def _allocate(
    state: NodeState, unit: Vec, zones: tuple[int, ...], preferred: bool
) -> UnitPlacement:
    """Take devices from the chosen zones (spilling to the others only if they fall short):
    GPU+NIC pairs on one PCIe root first, then pairs within a zone, then the rest. With a shared
    slot instead of NICs, a GPU pairs with any pool HCA."""
    gpus, hcas = _Pool.of(state, True), _Pool.of(state, False)
    shared_took = [0] * len(state.zones)
    need = list(unit)
    shared = unit[1] == 0 and unit[2] > 0
    pcie_pairs = 0
    rest = tuple(i for i in range(len(state.zones)) if i not in zones)
    for group in (zones, rest):
        for z in group:  # 1. pairs on one PCIe root
            for i, root in enumerate(state.zones[z].roots):
                if root.name and shared and root.pool_hcas:
                    step = gpus.take(z, i, need[0])
                elif root.name and not shared:
                    step = min(gpus.free[z][i], hcas.free[z][i], need[0], need[1])
                    gpus.take(z, i, step)
                    need[1] -= hcas.take(z, i, step)
                else:
                    continue
                need[0] -= step
                pcie_pairs += step
        for z in group:  # 2. pairs within a NUMA zone
            if shared and state.zones[z].pool_hcas:
                need[0] -= gpus.take_in_zone(z, need[0], hcas)
            elif not shared:
                pairs = min(sum(gpus.free[z]), sum(hcas.free[z]), need[0], need[1])
                need[0] -= gpus.take_in_zone(z, pairs, hcas)
                need[1] -= hcas.take_in_zone(z, pairs, gpus)
        for z in group:  # 3. whatever is left
            need[0] -= gpus.take_in_zone(z, need[0], hcas)
            need[1] -= hcas.take_in_zone(z, need[1], gpus)
            shared_took[z] = min(need[2], state.zones[z].free[2])
            need[2] -= shared_took[z]
    needed = min(unit[0], unit[1]) if unit[1] else (unit[0] if unit[2] else 0)
    per_zone = range(len(state.zones))
    if shared:
        numa = sum(sum(gpus.took[z]) for z in per_zone if state.zones[z].pool_hcas)
    else:
        numa = sum(min(sum(gpus.took[z]), sum(hcas.took[z])) for z in per_zone)
    taken = tuple(tuple(zip(gpus.took[z], hcas.took[z], strict=True)) for z in per_zone)
    return UnitPlacement(
        unit,
        zones,
        preferred,
        taken,
        tuple(shared_took),
        min(pcie_pairs, needed),
        min(numa, needed),
        needed,
    )


def apply(state: NodeState, placement: UnitPlacement) -> NodeState:
    """The node after a placement's devices are taken."""
    return _shift(state, placement, -1)


def release(state: NodeState, placement: UnitPlacement) -> NodeState:
    """The node after a placement's devices are given back."""
    return _shift(state, placement, 1)


def _shift(state: NodeState, placement: UnitPlacement, sign: int) -> NodeState:
    zones = []
    for z, zone in enumerate(state.zones):
        roots = tuple(
            replace(root, free_gpus=root.free_gpus + sign * g, free_hcas=root.free_hcas + sign * h)
            for root, (g, h) in zip(zone.roots, placement.taken[z], strict=True)
        )
        took_g = sum(g for g, _ in placement.taken[z])
        took_h = sum(h for _, h in placement.taken[z])
        free = (
            zone.free[0] + sign * took_g,
            zone.free[1] + sign * took_h,
            zone.free[2] + sign * placement.shared_taken[z],
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
        return PASS_THROUGH
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
    """The placements of the pod's units and the node afterwards (or why the kubelet refuses)."""
    alone, kept = request.units(state.scope)
    for unit in alone:
        tried = place_unit(state, unit, names)
        if isinstance(tried, Rejection):
            return Rejection(f"init container: {tried.reason}")
    placements = []
    for unit in kept:
        placed = place_unit(state, unit, names)
        if isinstance(placed, Rejection):
            return placed
        placements.append(placed)
        state = apply(state, placed)
    return tuple(placements), state


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
        note = "" if p.preferred else " (spans more NUMA zones than needed)"
        if p.spilled:
            spill = ",".join(state.zones[z].name for z in p.spilled)
            note += f" (kubelet affinity {zones} too small: rest from {spill}, unaligned)"
        parts.append(f"{zones}{pairs}{note}")
    return "; ".join(parts)
