"""The NCCL/UCX environment for a set of HCA ports: what the device plugin injects.

Pure. The rules, and the NCCL behaviour behind each (NCCL's `env.rst` and `net_ib`):

- `NCCL_IB_HCA=` + `=mlx5_0:1,mlx5_3:1`: the leading `=` makes NCCL match names exactly;
  without it every entry is a prefix, so `mlx5_1` would also pick up `mlx5_10`…`mlx5_19`. Each
  entry names its port so a second port of a dual-port card stays out. Natural order
  (`mlx5_2` before `mlx5_10`), so the same set always gives the same bytes.
- RoCE ports: `NCCL_IB_GID_INDEX=N` only when one index holds for every RoCE port of the set
  (NCCL takes one number for all HCAs). Otherwise the address-based selection NCCL ≥ 2.21 does
  on its own, steered by `NCCL_IB_ROCE_VERSION_NUM`, `NCCL_IB_ADDR_FAMILY` (`AF_INET` or
  `AF_INET6`) and `NCCL_IB_ADDR_RANGE` when a CIDR is set. Older NCCL defaults to index 0, so a
  target older than 2.21 without one common index is a `NcclPlanError`.
- InfiniBand-only sets get nothing GID-related (NCCL uses index 0 on IB ports).
- A set mixing InfiniBand and RoCE ports is a `NcclPlanError`: NCCL cannot use them as one (the
  doctor's `nccl-env` check and its NCCL log rule `mixed-link-layers` say the same).
- `NCCL_SOCKET_IFNAME` (the bootstrap / out-of-band interface) when known; `NCCL_IB_TC` and
  `NCCL_IB_SL` when configured; `UCX_NET_DEVICES=mlx5_0:1,…` (UCX names devices `hca:port`).

The same set also gets what KV-cache transfer frameworks read (prefill → decode):
- `UCX_NET_DEVICES` is what NIXL (vLLM's NixlConnector, Dynamo) passes to UCX; `NCCL_IB_*` do
  not apply there.
- `MC_GID_INDEX` (Mooncake, SGLang's default transfer backend): one index for every device. The
  unified index when every port of the set is RoCE and agrees, 0 for an InfiniBand-only set;
  left out when no single index is right (Mooncake then uses its own default, 3), since a wrong
  one fails ("GID is NULL") where a missing one may work.
- `RDMAPLANE_HCAS=mlx5_0,mlx5_3`: the granted HCA names, for SGLang's
  `--disaggregation-ib-device "$RDMAPLANE_HCAS"`.
- `RDMAPLANE_RAILS=0,3`: the rail of each of those HCAs, in the same order (`rails_env`), when
  the node's fabric names every one's rail (docs/fabric.md): a stack pairing two pods' NICs by
  rail keeps every transfer on a rail switch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rdmaplane.core.errors import RdmaplaneError
from rdmaplane.core.gid import AF_INET, GidPolicy, NodeGidPlan, plan_node
from rdmaplane.core.model import Hca, LinkLayer, NetdevKind, NodeTopology, Port
from rdmaplane.core.selectors import natural_key
from rdmaplane.core.settings import setting
from rdmaplane.core.untrusted import FieldError

AUTO_GID_SINCE = (2, 21)  # NCCL_IB_GID_INDEX defaults to -1 (automatic) from 2.21 on
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)*(?:[-+].*)?$")
_NAME_BREAKERS = re.compile(r"[\s,:=^]")  # would change the meaning of a NCCL/UCX list
_VIRTUAL_PREFIXES = (
    "docker", "veth", "virbr", "cni", "flannel", "cali", "tunl", "vxlan", "br-", "kube", "lxc",
    "weave", "genev", "cilium", "tap", "tun", "dummy",
)  # fmt: skip


class NcclPlanError(RdmaplaneError):
    """No environment can be given for this set, and why (e.g. NCCL < 2.21 with GID indexes
    that differ between ports); `unusable`: the ports (`mlx5_3:1`) that must be left out."""

    def __init__(self, message: str, unusable: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.unusable = unusable


@dataclass(frozen=True)
class NcclSettings:
    """What the environment plan is for: optional knobs, GID policy and target NCCL (a pool's
    `nccl` section in a DevicePluginConfig, a claim's RdmaDeviceConfig)."""

    # NCCL_SOCKET_IFNAME verbatim, e.g. "=eth0" or "^docker"
    socket_ifname: str | None = setting(None, "NCCL_SOCKET_IFNAME, verbatim")
    ib_tc: int | None = setting(None, "NCCL_IB_TC (0-255)", key="trafficClass", ge=0, le=255)
    ib_sl: int | None = setting(None, "NCCL_IB_SL (0-15)", key="serviceLevel", ge=0, le=15)
    gid_policy: GidPolicy = setting(factory=GidPolicy, doc="GID selection", key="gid")
    nccl_version: str | None = setting(  # target, e.g. "2.18"; None = 2.21 or later
        None, "the NCCL the pods run; before 2.21 the GID index must be one number"
    )

    def __post_init__(self) -> None:
        if self.nccl_version is not None:
            parse_nccl_version(self.nccl_version)
        if self.ib_tc is not None and not 0 <= self.ib_tc <= 255:
            raise FieldError("ib_tc", f"{self.ib_tc} is not in 0–255")
        if self.ib_sl is not None and not 0 <= self.ib_sl <= 15:
            raise FieldError("ib_sl", f"{self.ib_sl} is not in 0–15")
        if self.socket_ifname is not None and not self.socket_ifname.strip():
            raise FieldError("socket_ifname", "empty")

    @property
    def auto_gid(self) -> bool:
        """Does the target NCCL pick GIDs by address on its own?"""
        return self.nccl_version is None or parse_nccl_version(self.nccl_version) >= AUTO_GID_SINCE


def parse_nccl_version(text: str) -> tuple[int, int]:
    """`2.18`, `2.21.5`, `v2.26.2-1` → (major, minor); ValueError otherwise."""
    m = _VERSION.match(text.strip())
    if not m:
        raise FieldError("nccl_version", f"{text!r} is not a version like 2.21")
    return int(m.group(1)), int(m.group(2))


def nccl_env(
    topo: NodeTopology,
    ports: Sequence[tuple[Hca, Port]],
    settings: NcclSettings = NcclSettings(),
) -> dict[str, str]:
    """The environment for exactly these ports (see the module docstring); NcclPlanError if none
    can be right."""
    if not ports:
        raise NcclPlanError("no HCA ports given: nothing to point NCCL at")
    for hca, _ in ports:
        if _NAME_BREAKERS.search(hca.name):
            raise NcclPlanError(f"HCA name {hca.name!r} cannot be written into NCCL_IB_HCA")
    mix = link_layer_mix(ports)
    if mix is not None:
        raise NcclPlanError(mix)
    try:
        plan = plan_node(topo, ports, settings.gid_policy)
    except ValueError as e:
        raise NcclPlanError(str(e)) from e
    devices = ",".join(c.name for c in plan.choices)
    env = {"NCCL_IB_HCA": f"={devices}"}
    env.update(_gid_env(plan, settings))
    if settings.socket_ifname is not None:
        env["NCCL_SOCKET_IFNAME"] = settings.socket_ifname
    if settings.ib_tc is not None:
        env["NCCL_IB_TC"] = str(settings.ib_tc)
    if settings.ib_sl is not None:
        env["NCCL_IB_SL"] = str(settings.ib_sl)
    env["UCX_NET_DEVICES"] = devices
    env.update(_kv_env(plan))
    return env


def link_layer_mix(ports: Sequence[tuple[Hca, Port]]) -> str | None:
    """Why NCCL cannot use these ports together, when they mix InfiniBand and RoCE: it cannot
    connect or merge devices of different link layers (it fails with "merge incompatible
    devices" or "device is incompatible with the local"); None when they are of one."""
    by_layer: dict[LinkLayer, list[str]] = {}
    for hca, port in ports:
        if port.link_layer in _LAYER_WORD:
            by_layer.setdefault(port.link_layer, []).append(f"{hca.name}:{port.number}")
    if len(by_layer) < 2:
        return None
    parts = [f"{_LAYER_WORD[layer]} {', '.join(names)}" for layer, names in by_layer.items()]
    return (
        f"InfiniBand and RoCE ports together ({'; '.join(parts)}): NCCL cannot use both link "
        "layers in one job"
    )


_LAYER_WORD = {LinkLayer.INFINIBAND: "InfiniBand", LinkLayer.ETHERNET: "RoCE"}
MC_GID_INDEX = "MC_GID_INDEX"
HCAS_ENV = "RDMAPLANE_HCAS"


RAILS_ENV = "RDMAPLANE_RAILS"


def rails_env(env: Mapping[str, str], rails: Mapping[str, int]) -> dict[str, str]:
    """`RDMAPLANE_RAILS` for an environment holding `RDMAPLANE_HCAS`: each HCA's rail
    (`rails`: HCA name → rail), in its order; nothing when one of them has no known rail (a
    partial list would pair the wrong NICs)."""
    hcas = [h for h in env.get(HCAS_ENV, "").split(",") if h]
    if not hcas or any(h not in rails for h in hcas):
        return {}
    return {RAILS_ENV: ",".join(str(rails[h]) for h in hcas)}


def _kv_env(plan: NodeGidPlan) -> dict[str, str]:
    env = {HCAS_ENV: ",".join(dict.fromkeys(c.hca for c in plan.choices))}
    roce = plan.roce_choices
    if not roce:
        env[MC_GID_INDEX] = "0"  # InfiniBand ports: the port GID sits at index 0
    elif len(roce) == len(plan.choices) and plan.uniform_index is not None:
        env[MC_GID_INDEX] = str(plan.uniform_index)
    return env


def _gid_env(plan: NodeGidPlan, settings: NcclSettings) -> dict[str, str]:
    if not plan.roce_choices:
        return {}
    if plan.uniform_index is not None:
        return {"NCCL_IB_GID_INDEX": str(plan.uniform_index)}
    broken = [c for c in plan.divergent if c.index is None]
    if broken:
        why = "; ".join(f"{c.name}: {c.reason}" for c in broken)
        raise NcclPlanError(
            f"no usable GID on {why}; leave these ports out of the set",
            tuple(c.name for c in broken),
        )
    if not settings.auto_gid:
        why = ", ".join(f"{c.name} → {c.index}" for c in plan.roce_choices)
        raise NcclPlanError(
            f"NCCL {settings.nccl_version} needs one NCCL_IB_GID_INDEX for all HCAs, but the "
            f"GID indexes differ ({why}); use NCCL ≥ 2.21 or give the ports the same GID layout"
        )
    policy = settings.gid_policy
    env = {
        "NCCL_IB_ROCE_VERSION_NUM": str(policy.roce_version),
        "NCCL_IB_ADDR_FAMILY": "AF_INET" if policy.family == AF_INET else "AF_INET6",
    }
    if policy.cidr is not None:
        env["NCCL_IB_ADDR_RANGE"] = policy.cidr
    return env


def default_socket_ifname(topo: NodeTopology, ports: Sequence[tuple[Hca, Port]]) -> str | None:
    """`=<netdev>` for NCCL's bootstrap traffic on this node (host network), or None.

    A netdev that is up, not loopback or virtual (docker, veth, CNI…), not a bond slave, and not
    carrying one of `ports` (nor a VLAN on top of one). Netdevs with no RDMA device behind them
    come first (the front-end NIC), then physical before bond before VLAN before IPoIB, then by
    name. Inside a pod, whose interfaces differ from the host's, set it explicitly instead.
    """
    rdma = {p.netdev for h in topo.hcas for p in h.ports if p.netdev}
    rdma |= {h.parent_netdev for h in topo.hcas if h.parent_netdev}
    rdma_pci = {h.pci.address for h in topo.hcas if h.pci}
    used = {p.netdev for _, p in ports if p.netdev}
    rank = {NetdevKind.PHYSICAL: 0, NetdevKind.BOND: 1, NetdevKind.VLAN: 2, NetdevKind.IPOIB: 3}
    candidates = [
        n
        for n in topo.netdevs
        if n.operstate == "up"
        and n.kind in rank
        and n.name != "lo"
        and not n.name.startswith(_VIRTUAL_PREFIXES)
        and n.master is None
        and n.name not in used
        and not used.intersection(n.lower if n.kind == NetdevKind.VLAN else ())
    ]
    if not candidates:
        return None
    best = min(
        candidates,
        key=lambda n: (
            n.name in rdma or bool(rdma.intersection(n.lower)) or n.pci in rdma_pci,
            rank[n.kind],
            natural_key(n.name),
        ),
    )
    return f"={best.name}"
