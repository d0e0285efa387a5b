"""Where a GPU/RDMA pod fits on a node, and how well: the scheduler extender's verdict. Pure.

It takes a node's state (`nodestate`, from its published topology) and a pod's requests
(`podrequest`) and predicts what the node's kubelet will do with them, following the kubelet's
own code (v1.37: `topologymanager`, `devicemanager`) and checked against it (tests/kubelet):
containers are admitted in the kubelet's order, each gets the NUMA affinity the Topology
Manager picks from the device manager's hints, and devices inside it. Which devices inside the
affinity is the device plugins' choice; the prediction takes the ones that pair every GPU with
a NIC on its PCIe root where possible (`pairing`: the *best achievable* pairing, the kubelet
itself knows only NUMA), and scores the node 0-10 from that alignment and a packing term
(`score`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rdmaplane.services.scheduler.policy.devicemanager import (
    Rejection,
    UnitPlacement,
    none_healthy,
)
from rdmaplane.services.scheduler.policy.nodestate import NodeState
from rdmaplane.services.scheduler.policy.podrequest import PodRequest
from rdmaplane.services.scheduler.policy.score import Policy, alignment_level, score
from rdmaplane.services.scheduler.policy.topologymanager import place_pod


@dataclass(frozen=True, slots=True)
class Verdict:
    fits: bool
    unresolvable: bool  # no amount of freeing devices on this node would help
    reason: str  # why it does not fit, or how it fits
    score: int  # 0..MAX_SCORE
    alignment: str  # pcie | numa | cross | none (nothing to align) | "" (does not fit)
    placements: tuple[UnitPlacement, ...] = ()
    state_after: NodeState | None = None


PASS_THROUGH = Verdict(True, False, "pod requests no GPU or RDMA device", 0, "none")


def evaluate(state: NodeState, request: PodRequest, policy: Policy = Policy()) -> Verdict:
    """Can the node hold the pod under its Topology Manager policy, and how well (0-10)?
    Only the resources the node's vocabulary names are its devices."""
    request = request.on(state.vocabulary)
    if not request.wants_devices:
        dead = none_healthy(state, request.zero)
        return PASS_THROUGH if dead is None else Verdict(False, True, dead, 0, "")
    outcome = place_pod(state, request)
    if isinstance(outcome, Rejection):
        on_empty = place_pod(state.fresh(), request)
        if isinstance(on_empty, Rejection):  # what makes it impossible, not what is in use now
            return Verdict(False, True, on_empty.reason, 0, "")
        return Verdict(False, False, outcome.reason, 0, "")
    placements, after = outcome
    return Verdict(
        True,
        False,
        describe(state, placements),
        score(state, after, request, placements, policy.weights),
        alignment_level(placements),
        placements,
        after,
    )


def describe(state: NodeState, placements: Iterable[UnitPlacement]) -> str:
    """One line per node for people: the zones picked and the pairs made."""
    parts = []
    for placed in placements:
        zones = ",".join(state.zones[index].name for index in placed.zones) or "-"
        pairs = (
            f", {placed.pcie_pairs}/{placed.needed} PCIe pairs, "
            f"{placed.numa_pairs}/{placed.needed} NUMA pairs"
            if placed.needed
            else ""
        )
        if not placed.zones:
            note = " (no NUMA affinity: policy none, the device plugins choose)"
        elif not placed.preferred:
            note = " (affinity not preferred: alignment not promised)"
        else:
            note = ""
        if placed.spilled:
            spill = ",".join(state.zones[index].name for index in placed.spilled)
            note += f" (kubelet affinity {zones} too small: rest from {spill}, unaligned)"
        parts.append(f"{zones}{pairs}{note}")
    return "; ".join(parts)
