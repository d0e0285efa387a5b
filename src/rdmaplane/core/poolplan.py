"""What a device plugin pool is on a topology, whichever process serves it: its member HCAs
and the GID index its Allocate plan gives (the node agent labels the node with it)."""

from __future__ import annotations

from rdmaplane.core.model import LinkLayer, NodeTopology
from rdmaplane.core.nccl import NcclPlanError, nccl_env
from rdmaplane.core.selectors import compute_ports
from rdmaplane.core.settings.deviceplugin import Pool


def pool_gid_index(topo: NodeTopology, pool: Pool) -> tuple[bool, int | None]:
    """(the pool has RoCE ports up, the NCCL_IB_GID_INDEX Allocate gives a pod holding the
    whole pool): the same plan Allocate makes, so the node's gid-index label and the pods'
    environment cannot disagree. None when no one index holds (NCCL ≥ 2.21 then picks by
    address) or no plan is possible. Pure: the agent asks it of pools another process serves."""
    ports = [(h, p) for h, p in compute_ports(topo, pool.selectors) if p.is_up]
    if not any(p.link_layer == LinkLayer.ETHERNET for _, p in ports):
        return False, None
    try:
        index = nccl_env(topo, ports, pool.nccl).get("NCCL_IB_GID_INDEX")
    except NcclPlanError:
        return True, None
    return True, None if index is None else int(index)


def pool_members(topo: NodeTopology, pool: Pool) -> list[str]:
    """The names of the HCAs with a compute port the pool's selectors match, in order."""
    return list(dict.fromkeys(h.name for h, _ in compute_ports(topo, pool.selectors)))
