"""Whether an HCA's ports can be handed out to a pod, and if not why: the one rule. Pure.

The device plugin applies it to an HCA and the ports its pool selects (the device is Unhealthy
when it fails), the DRA driver to each offered port alone (the device is tainted when it
fails), so both ways of serving a node refuse the same ports for the same reason. A port that
cannot carry traffic fails whatever its link class: down, no verbs device node for the
container, or no NCCL plan (a RoCE port without a usable GID; the kernel derives RoCE GIDs from
the port's netdev and drops them with it, so a port whose netdev is gone has none).

Every reason is a short word (a metrics label and a taint value, so few) and a message.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from rdmaplane.core.model import Hca, NetnsMode, NodeTopology, Port
from rdmaplane.core.nccl import NcclPlanError, NcclSettings, nccl_env
from rdmaplane.core.netns import NETNS_EXCLUSIVE, device_blocked

DEV_DIR = "/dev/infiniband"  # where a container finds the device nodes it is given

DEVICE_GONE = "DeviceGone"  # announced once, no longer found
REPORTED_FAULT = "ReportedFault"  # judged outside (the agent's error counters)
NO_VERBS_DEVICE = "NoVerbsDevice"  # no /dev/infiniband/uverbsN to give the container
PORT_DOWN = "PortDown"  # no port ACTIVE and LinkUp
NO_NCCL_PLAN = "NoNcclPlan"  # its up ports give NCCL nothing right (e.g. only link-local GIDs)
# NETNS_EXCLUSIVE: a shared pool's HCA on a node in exclusive RDMA netns mode (rdmaplane.core.netns)


@dataclass(frozen=True, slots=True)
class Unusable:
    """Why ports cannot be handed out: `reason`, one of the words above; `message`, for people."""

    reason: str
    message: str

    def __str__(self) -> str:
        return self.message


def why_unusable(
    topo: NodeTopology,
    hca: Hca,
    ports: Sequence[Port],
    settings: NcclSettings,
    *,
    device_nodes: Collection[str],
    dev_root: str,
    fault: str | None = None,
    shared: bool = False,
) -> Unusable | None:
    """None when `ports` of `hca` can be handed out (at least one up, and a plan for those up),
    else the first reason they cannot.

    In order: a shared pool on a node in exclusive RDMA netns mode (its pods, each in its own
    network namespace, would see no HCA), a `fault` reported from outside, no verbs device node
    among `device_nodes` (what `<dev_root>/infiniband` holds: the container could not be given
    its device), no port up, no NCCL plan for the up ports with `settings` (the device plugin's
    Allocate would refuse it after the kubelet admitted the pod; a DRA claim would fail to
    prepare)."""
    name = hca.name
    if shared and topo.netns_mode is NetnsMode.EXCLUSIVE:
        return Unusable(NETNS_EXCLUSIVE, device_blocked(name))
    if fault:
        return Unusable(REPORTED_FAULT, f"{name}: {fault}")
    if hca.uverbs is None or hca.uverbs not in device_nodes:
        where = f"{DEV_DIR}/{hca.uverbs or 'uverbs?'}"
        return Unusable(
            NO_VERBS_DEVICE, f"{name}: no verbs device node {where} (looked under {dev_root})"
        )
    up = [p for p in ports if p.is_up]
    if not up:
        states = ", ".join(f"port {p.number} {p.state.name}/{p.phys_state.name}" for p in ports)
        return Unusable(PORT_DOWN, f"{name}: no port ACTIVE and LinkUp ({states})")
    try:
        nccl_env(topo, [(hca, p) for p in up], settings)
    except NcclPlanError as e:
        return Unusable(NO_NCCL_PLAN, f"{plan_failure([hca])}: {e}")
    return None


def plan_failure(hcas: Sequence[Hca]) -> str:
    """The start of the message when no NCCL plan holds for these HCAs' ports."""
    return f"no NCCL plan for {', '.join(h.name for h in hcas)}"
