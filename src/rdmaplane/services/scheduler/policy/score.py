"""How well a pod fits a node, 0-10: the alignment its containers get (every GPU with a NIC on
its PCIe root, on its NUMA zone, or across) and a packing term that keeps whole NUMA zones and
whole nodes free for large jobs, weighted by the extender's settings. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rdmaplane.core.resources import DEFAULT, Vocabulary
from rdmaplane.core.settings.scheduler import Weights
from rdmaplane.services.scheduler.policy.devicemanager import UnitPlacement
from rdmaplane.services.scheduler.policy.nodestate import NodeState
from rdmaplane.services.scheduler.policy.podrequest import PodRequest

MAX_SCORE = 10  # a node's best score: kube-scheduler's extenderv1.MaxExtenderPriority


@dataclass(frozen=True)
class Policy:
    """How nodes are scored, and the cluster's resource names: what a node's NRT is read with
    when it does not name its own (`nrt.NodeResourceTopology.vocabulary`)."""

    weights: Weights = field(default_factory=Weights)
    vocabulary: Vocabulary = DEFAULT


def score(
    before: NodeState,
    after: NodeState,
    request: PodRequest,
    placements: tuple[UnitPlacement, ...],
    weights: Weights,
) -> int:
    """The node's score for the pod placed as `placements`, leaving the node `after`."""
    align = alignment(placements, weights)
    pack = packing(before, after, request, weights)
    total = weights.alignment + weights.packing
    if total <= 0:
        return 0
    value = round(MAX_SCORE * (weights.alignment * align + weights.packing * pack) / total)
    return max(0, min(MAX_SCORE, value))


def running(placements: tuple[UnitPlacement, ...]) -> tuple[UnitPlacement, ...]:
    """The containers that run: sidecars and apps (init containers' devices pass to them)."""
    return tuple(placed for placed in placements if placed.kind != "init") or placements


def unit_alignment(placed: UnitPlacement, weights: Weights) -> float:
    """pcie when every GPU has a NIC on its root, numa when on its zone; a unit with any GPU
    whose NIC is across zones ranks below every fully NUMA-aligned one."""
    if not placed.needed:
        value = weights.pcie
    elif placed.numa_pairs == placed.needed:
        value = weights.numa + (weights.pcie - weights.numa) * placed.pcie_pairs / placed.needed
    else:
        spread = (weights.numa - weights.cross) * placed.numa_pairs / placed.needed / 2
        value = weights.cross + spread
    return value if placed.aligned else value * weights.not_preferred


def alignment(placements: tuple[UnitPlacement, ...], weights: Weights) -> float:
    """The running containers' alignment, weighted by their devices, 0-1."""
    placements = running(placements)
    top = max(weights.pcie, weights.numa, weights.cross) or 1.0
    sizes = [max(1, placed.unit.total()) for placed in placements]
    total = sum(
        unit_alignment(placed, weights) * size
        for placed, size in zip(placements, sizes, strict=True)
    )
    return total / (sum(sizes) * top) if sizes else 1.0


def packing(before: NodeState, after: NodeState, request: PodRequest, weights: Weights) -> float:
    """How full the zones the pod touches and the node are after it, 0-1 (by the first
    resource the pod asks for)."""
    name = next(each for each in before.vocabulary.names if request.total[each])
    touched = [
        index
        for index, (was, now) in enumerate(zip(before.zones, after.zones, strict=True))
        if was.free[name] != now.free[name]
    ]
    capacity_zones = sum(before.zones[index].capacity[name] for index in touched)
    free_zones = sum(after.zones[index].free[name] for index in touched)
    capacity_node = sum(zone.capacity[name] for zone in before.zones)
    free_node = sum(zone.free[name] for zone in after.zones)
    zone_fill = 1 - free_zones / capacity_zones if capacity_zones else 1.0
    node_fill = 1 - free_node / capacity_node if capacity_node else 1.0
    total = weights.zone_fill + weights.node_fill
    if total <= 0:
        return 0.0
    return (weights.zone_fill * zone_fill + weights.node_fill * node_fill) / total


def alignment_level(placements: tuple[UnitPlacement, ...]) -> str:
    """pcie | numa | cross | none (nothing to align), for all the running containers."""
    placements = running(placements)
    if all(placed.needed == 0 for placed in placements):
        return "none" if all(placed.aligned for placed in placements) else "cross"
    if all(placed.aligned and placed.pcie_pairs == placed.needed for placed in placements):
        return "pcie"
    if all(placed.aligned and placed.numa_pairs == placed.needed for placed in placements):
        return "numa"
    return "cross"
