"""Rails: which rail indices a pod's devices sit on, and whether two pods' rails match. Pure.

On a rail-optimised node NIC k (the NIC of GPU k) is cabled into rail k's switch; the NRT's HCA
zones carry `rdmaplane.io/rail` and hang below the PCIe root the NIC sits on. A pod that takes
part of a node uses the rails of the NICs it is given, and ring steps between two pods of one
job stay on a rail switch only where their rails match: a pod on rails 0-3 and one on rails 4-7
cross the spine on every step (or fail, where rails are separate networks).

Which NICs a pod gets is the kubelet's choice; the extender predicts it per PCIe root
(`devicemanager.allocate`, judged by the kubelet's own code in tests/kubelet). `pod_rails` reads
the rails off that prediction: per root, as many of the root's rails as the pod holds NICs
there, lowest first (the device plugin prefers the lowest IDs, `deviceplugin.alloc`); a root
where it holds GPUs only gives the rails of its NICs. Exact where a root has one NIC (HGX-class
nodes), the lowest rails of the root where it has several.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from rdmaplane.core.nrt import Uplink
from rdmaplane.services.scheduler.policy.devicemanager import UnitPlacement
from rdmaplane.services.scheduler.policy.nodestate import NodeState

Rails = frozenset[int]
RootRails = Mapping[str, tuple[int, ...]]  # PCIe root → the rails of its NICs, ascending
NONE: Rails = frozenset()


def root_rails(uplinks: Iterable[Uplink]) -> dict[str, tuple[int, ...]]:
    """Per PCIe root, the rails of the NICs on it (HCA zones without a root or rail: left out)."""
    found: dict[str, list[int]] = {}
    for u in uplinks:
        if u.pcie_root and u.rail is not None:
            found.setdefault(u.pcie_root, []).append(u.rail)
    return {root: tuple(sorted(rails)) for root, rails in found.items()}


def pod_rails(state: NodeState, placements: Sequence[UnitPlacement], roots: RootRails) -> Rails:
    """The rails of the NICs a pod's devices are predicted on (empty: none known)."""
    vocab = state.vocabulary
    rails: set[int] = set()
    for p in placements:
        for zone, held in zip(state.zones, p.devices, strict=True):
            for root, amounts in zip(zone.roots, held, strict=True):
                on_root = roots.get(root.name, ())
                nics = sum(amounts[n] for n in vocab.exclusive)
                if nics:
                    rails.update(on_root[:nics])
                elif any(amounts[n] for n in vocab.gpus):
                    rails.update(on_root)
    return frozenset(rails)


def rails_match(a: Rails, b: Rails) -> bool:
    """Two pods' rails match when one's are among the other's: every ring step between them
    has a rail switch in common (a whole-node pod matches any pod)."""
    return bool(a) and bool(b) and (a <= b or b <= a)


def rail_room(candidates: Sequence[tuple[str | None, Rails]], others: int) -> list[float | None]:
    """Per candidate node (its tier-0 switch, the rails the pod would get there), the share of
    the job's `others` other pods that the other candidates under the same switch could take
    on rails matching its own, one pod each (None where its rails are unknown).

    A job's first pod decides the rails the rest must match; on nodes already partly used a
    rail set only a few free nodes still offer leaves the later pods with none to match."""
    offered: dict[str | None, Counter[Rails]] = {}
    for switch, rails in candidates:
        if rails:
            offered.setdefault(switch, Counter())[rails] += 1
    room: list[float | None] = []
    for switch, rails in candidates:
        if not rails or others <= 0:
            room.append(None)
            continue
        there = offered[switch]
        matching = sum(n for r, n in there.items() if rails_match(rails, r)) - 1
        room.append(min(1.0, matching / others))
    return room


def match_share(candidate: Rails, peers: Sequence[Rails]) -> float | None:
    """The share of the peers (those with known rails) whose rails match the candidate's; None
    when no peer's rails are known."""
    known = [p for p in peers if p]
    if not known:
        return None
    return sum(rails_match(candidate, p) for p in known) / len(known)
