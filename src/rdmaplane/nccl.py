"""TEMPORARY shim of the `gid` branch's NCCL plan (issue 3); removed when it lands on main."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rdmaplane.gid import GidPolicy
from rdmaplane.model import Hca, LinkLayer, NodeTopology, Port


class PlanError(ValueError):
    pass


@dataclass(frozen=True)
class NcclSettings:
    gid_policy: GidPolicy = field(default_factory=GidPolicy)
    nccl_version: str | None = None
    socket_ifname: str | None = None
    ib_tc: int | None = None
    ib_sl: int | None = None

    def __post_init__(self) -> None:
        if self.nccl_version is not None and not self.nccl_version[:1].isdigit():
            raise ValueError(f"nccl settings nccl_version: {self.nccl_version!r} is not a version")


def nccl_env(
    topo: NodeTopology, ports: Sequence[tuple[Hca, Port]], settings: NcclSettings
) -> dict[str, str]:
    if not ports:
        raise PlanError("no RDMA ports to plan for")
    env = {"NCCL_IB_HCA": "=" + ",".join(f"{h.name}:{p.number}" for h, p in ports)}
    if any(p.link_layer == LinkLayer.ETHERNET for _, p in ports):
        env["NCCL_IB_GID_INDEX"] = "-1"
    if settings.socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = settings.socket_ifname
    return env
