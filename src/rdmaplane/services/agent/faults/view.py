"""What the fault actor knows of the node before it acts: how fresh its view is (the API server
reachable, PodResources recent), and which HCAs each device grants (so which pods a fault hurts)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rdmaplane.core.model import NodeTopology
from rdmaplane.services.agent.policy.inventory import Offered


@dataclass(frozen=True, slots=True)
class Freshness:
    """How fresh the agent's knowledge is: consecutive failed publish cycles, and when
    PodResources last answered (monotonic; None: never)."""

    api_failures: int
    podresources_at: float | None
    podresources_interval_s: float


def stale_view(view: Freshness, now: float) -> str | None:
    """Why the view cannot be trusted for acting on pods, or None when it can. The texts stay
    the same while the cause does, so a hold is logged once."""
    if view.api_failures:
        return "API server unreachable"
    if view.podresources_at is None:
        return "PodResources never answered"
    limit = 2 * view.podresources_interval_s
    if now - view.podresources_at > limit:
        return f"PodResources older than two intervals ({limit:g} s)"
    return None


def device_hcas(
    offered: Sequence[Offered], topo: NodeTopology, resources: Iterable[str]
) -> dict[tuple[str, str], tuple[str, ...]]:
    """The HCAs each device grants: the embedded plugin's devices (a shared slot grants its
    pool); without it (a standalone plugin), exclusive devices by PCI address in `resources`."""
    if offered:
        return {(o.resource, o.device_id): o.hcas for o in offered}
    return {
        (r, h.pci.address): (h.name,) for r in resources for h in topo.hcas if h.pci is not None
    }
