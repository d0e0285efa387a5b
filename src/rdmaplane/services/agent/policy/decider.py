"""The agent's decider: what its node's state means, with no I/O.

The service (`rdmaplane.services.agent.root`) reads sysfs, the kubelet and the API server and keeps
what it read in a `NodeState`; what follows from it is decided here: the facts of a topology
(the pools' GID index and netns problem, the ports in service), what a health flip or a pool
problem is announced as, and whether the desired state's inputs changed (`PublishInputs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rdmaplane.core import netns
from rdmaplane.core.allocation import Allocations
from rdmaplane.core.fabric import NOTHING, NodeFabric
from rdmaplane.core.model import NetnsMode, NodeTopology
from rdmaplane.core.poolplan import pool_gid_index, pool_members
from rdmaplane.core.porthealth import PortKey
from rdmaplane.core.selectors import compute_ports
from rdmaplane.core.settings.deviceplugin import Pool
from rdmaplane.services.agent.policy import desired
from rdmaplane.services.agent.policy.health import HcaHealth, HealthState, Transition
from rdmaplane.services.agent.policy.inventory import Offered


@dataclass(slots=True)
class NodeReading:
    """What the agent knows of its node: the last discovery and poll, the health monitor's
    state, the kubelet's allocations. Times are monotonic seconds."""

    topo: NodeTopology | None = None
    fingerprint: tuple[object, ...] | None = None  # the last reading's
    port_states: tuple[object, ...] | None = None  # at the last poll (the state check's)
    discovered_at: float = 0.0
    polled_at: float = 0.0
    health: HealthState = field(default_factory=HealthState)
    allocations: Allocations = field(default_factory=Allocations)
    allocations_at: float | None = None  # the last PodResources answer
    fabric: NodeFabric = NOTHING


@dataclass(frozen=True, slots=True)
class PoolFacts:
    """What the device plugin's pools make of a topology: the gid-index label and a mismatch
    between pools (`desired.gid_label`), and why exclusive netns mode blocks shared pools."""

    gid_index: int | None
    gid_problem: str | None
    netns_problem: str | None


@dataclass(frozen=True, slots=True)
class TopologyFacts:
    """What follows from one topology alone (computed once per discovery)."""

    topo: NodeTopology
    pools: PoolFacts
    ports_in_service: frozenset[PortKey]  # those a pool (or the DRA driver) offers


def pool_facts(topo: NodeTopology, pools: Sequence[Pool]) -> PoolFacts:
    """`PoolFacts` from the pools' own Allocate plans and members, whichever process serves
    them."""
    gids = [desired.PoolGid(p.resource_name, *pool_gid_index(topo, p)) for p in pools]
    shared = [(p.resource_name, pool_members(topo, p)) for p in pools if p.shared]
    gid_index, gid_problem = desired.gid_label(gids)
    return PoolFacts(gid_index, gid_problem, netns.shared_pools_blocked(topo.netns_mode, shared))


def ports_in_service(
    topo: NodeTopology, pools: Sequence[Pool], dra_hcas: Sequence[str] | None
) -> frozenset[PortKey]:
    """The ports offered to pods: every port of the DRA driver's HCAs when it runs, else the
    pools' compute ports (with the ports seen up, those in service:
    `rdmaplane.services.agent.policy.health`)."""
    if dra_hcas is not None:
        hcas = [h for n in dra_hcas if (h := topo.hca(n)) is not None]
        return frozenset((h.name, p.number) for h in hcas for p in h.ports)
    return frozenset(
        (h.name, p.number) for pool in pools for h, p in compute_ports(topo, pool.selectors)
    )


@dataclass(frozen=True, slots=True)
class Announcement:
    """Something worth a log line and, with a `reason`, a Node Event (Normal when `good`)."""

    good: bool
    reason: str | None
    message: str


def health_flip(t: Transition) -> tuple[str, Announcement]:
    """A health flip's direction (the metric's label: gone, healthy, unhealthy) and what is
    said of it."""
    if t.after is None:
        return "gone", Announcement(False, "RDMADeviceGone", f"{t.hca} disappeared")
    if t.after.healthy:
        return "healthy", Announcement(True, "RDMADeviceHealthy", f"{t.hca} is healthy")
    problems = "; ".join(map(str, t.after.problems))
    return "unhealthy", Announcement(False, "RDMADeviceUnhealthy", f"{t.hca}: {problems}")


def pool_changes(before: PoolFacts | None, after: PoolFacts, mode: NetnsMode) -> list[Announcement]:
    """What is said when the pools' GID indexes start (or stop) disagreeing — an Event, as the
    condition stays True — and when exclusive netns mode starts (or stops) blocking the shared
    pools: a log line only, the RDMAReady condition's flip carries the Event. Nothing is said
    of first facts without a problem."""
    said = []
    gid, netns_problem = after.gid_problem, after.netns_problem
    if gid != (before.gid_problem if before else None):
        if gid is None:
            agree = "the device plugin pools agree on the GID"
            said.append(Announcement(True, "RDMAGidIndexAgrees", agree))
        else:
            said.append(Announcement(False, "RDMAGidIndexMismatch", f"{gid}; no gid-index label"))
    if netns_problem != (before.netns_problem if before else None):
        if netns_problem is not None:
            said.append(Announcement(False, None, netns_problem))
        else:
            again = f"the shared pools are served again (RDMA netns mode {mode})"
            said.append(Announcement(True, None, again))
    return said


@dataclass(frozen=True, slots=True)
class PublishInputs:
    """What the desired state is computed from: the same inputs, the same desired state, so
    it is recomputed only when these change (the topology compares by identity: cheap)."""

    topo: NodeTopology
    health: Mapping[str, HcaHealth]
    allocations: Allocations
    offered: Sequence[Offered]
    fabric: NodeFabric
    faulty_since: float | None
