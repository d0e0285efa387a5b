"""The kubelet's Topology Manager, modelled (upstream `pkg/kubelet/cm/topologymanager`, v1.37):
how it merges the device manager's hints into a NUMA affinity, whether its policy admits it,
and how its scopes admit a pod's containers. Pure.

- scope `container` asks for a hint per container, in the kubelet's order; scope `pod` one for
  the pod's effective request, which every container then gets;
- the merge (`merge_hints`): preferred only when every resource's hint is preferred and they
  are the same zones; `single-numa-node` keeps one-zone hints only, `restricted` and
  `single-numa-node` refuse a hint that is not preferred, `best-effort` admits it, `none` gives
  no affinity at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rdmaplane.core.resources import Amounts
from rdmaplane.services.scheduler.policy.devicemanager import (
    Rejection,
    Reusable,
    UnitPlacement,
    allocate,
    apply,
    resource_hints,
    short_of,
)
from rdmaplane.services.scheduler.policy.nodestate import NodeState, no_devices
from rdmaplane.services.scheduler.policy.numamask import Hint, narrowness, zones_of
from rdmaplane.services.scheduler.policy.podrequest import ContainerRequest, PodRequest

MAX_MASK_ZONES = 8  # the Topology Manager's own default limit on NUMA nodes


def merge_hints(state: NodeState, hints: Sequence[Sequence[Hint]]) -> Hint:
    """The Topology Manager's merge of the resources' hints (upstream `HintMerger`): a merged
    hint (the AND of one hint per resource) is preferred only when every hint in it is
    preferred and all their zones are equal; the best is the narrowest preferred one, else the
    non-preferred one closest below or at the largest of the resources' narrowest widths
    (`BestNonPreferredAffinityCount`), else the narrowest. A resource with no hint counts as
    `{any, not preferred}`; single-numa-node keeps only preferred one-zone hints first."""
    full = (1 << len(state.zones)) - 1
    if state.policy == "single-numa-node":
        hints = [
            [hint for hint in given if hint.preferred and hint.mask.bit_count() == 1]
            for given in hints
        ]
        if any(not given for given in hints):
            return Hint(full, False)
    common: set[int] | None = None
    for given in hints:
        preferred = {hint.mask for hint in given if hint.preferred}
        common = preferred if common is None else common & preferred
    if common:
        return Hint(min(common, key=narrowness), True)
    merged = {full}
    for given in hints:
        masks = {hint.mask for hint in given} or {full}
        merged = {left & right for left in merged for right in masks}
    merged.discard(0)
    if not merged:
        return Hint(full, False)
    target = max(
        (min(hint.mask.bit_count() for hint in given) for given in hints if given), default=0
    )
    at = [mask for mask in merged if mask.bit_count() == target]
    below = [mask for mask in merged if mask.bit_count() < target]
    if at:
        return Hint(min(at, key=narrowness), False)
    if below:
        top = max(mask.bit_count() for mask in below)
        return Hint(min(mask for mask in below if mask.bit_count() == top), False)
    return Hint(min(merged, key=narrowness), False)


def kubelet_hint(
    state: NodeState, unit: Amounts, reusable: Reusable, zero: Iterable[str] = ()
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
    named = set(unit) | {
        name for name in zero if any(zone.registered[name] for zone in state.zones)
    }
    hints = [
        resource_hints(state, name, unit[name], reusable)
        for name in state.vocabulary.names
        if name in named
    ]
    if not hints:  # no device asked for: the providers have no preference
        return Hint(full, True), True
    best = merge_hints(state, hints)
    admit = best.preferred or state.policy == "best-effort"
    return best, admit


def misfit_reason(state: NodeState, unit: Amounts, reusable: Reusable | None = None) -> str:
    """Why the Topology Manager refuses `unit` on the node, in its policy's words."""
    short = short_of(state, unit, reusable)
    if short is not None:
        return f"insufficient {short}"
    wants = " + ".join(f"{unit[name]} {name}" for name in state.vocabulary.names if unit[name])
    if state.policy == "single-numa-node":
        return f"single-numa-node: no NUMA zone can hold {wants}"
    if state.policy == "restricted":
        return f"restricted: {wants} cannot be placed on the fewest NUMA zones possible"
    return f"insufficient free devices for {wants}"


def place_pod(
    state: NodeState, request: PodRequest
) -> tuple[tuple[UnitPlacement, ...], NodeState] | Rejection:
    """Each container's devices and the node afterwards, or why the kubelet refuses the pod.

    As the kubelet admits (upstream topologymanager scopes + devicemanager.Allocate): scope
    `container` asks for a hint per container, in order, each seeing what the ones before took;
    scope `pod` one hint for the pod's effective request, then every container is allocated
    within it. Either way, what regular init containers hold is handed to later containers
    first."""
    request = request.on(state.vocabulary)
    pod_hint: tuple[Hint, bool] | None = None
    if state.scope == "pod":
        pod_hint = kubelet_hint(state, request.total, Reusable(no_devices(state)), request.zero)
        if pod_hint is not None and not pod_hint[1]:
            return Rejection(misfit_reason(state, request.total))
    placements = []
    reusable = Reusable(no_devices(state))
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
                why = misfit_reason(state, step.devices, reusable)
                return Rejection(_prefix(step) + why)
            affinity = zones_of(hint.mask, len(state.zones))
            preferred = hint.preferred
        placed = allocate(state, step, affinity, preferred, reusable)
        if isinstance(placed, Rejection):
            return Rejection(_prefix(step) + placed.reason)
        placements.append(placed)
        state = apply(state, placed)
        reusable = reusable.after(placed)
    return tuple(placements), state


def _prefix(step: ContainerRequest) -> str:
    return "" if step.kind == "app" else f"{step.kind} container: "
