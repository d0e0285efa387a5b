"""The GID index: which entry of a port's GID table NCCL should use, per port, per node and
across a cluster.

Pure. `select_gid` restates, in our own words, what NCCL ≥ 2.21 does when `NCCL_IB_GID_INDEX`
is unset (-1, automatic), as read in NCCL's `src/transport/net_ib` (`ncclIbGetGidIndex`,
`ncclUpdateGidIndex`, `ncclIbRoceGetVersionNum`):

- InfiniBand ports use index 0, unless the entry at `NCCL_IB_ROUTABLE_FLID_GID_INDEX` (default 1)
  carries a non-zero FLID (bytes 4–5 of the GID), which NCCL then prefers for routing across IB
  subnets. No address family or RoCE version is involved.
- RoCE ports: NCCL walks the table upwards from index 0 comparing each entry with the best one
  so far. An entry can win only if it is configured (non-zero), not link-local (NCCL tests
  `fe80::/64`; we treat all of `fe80::/10` as link-local), of the address family
  `NCCL_IB_ADDR_FAMILY` (AF_INET by default; IPv4 GIDs are IPv4-mapped) and inside
  `NCCL_IB_ADDR_RANGE` when that is set. Among those the lowest index whose type
  matches `NCCL_IB_ROCE_VERSION_NUM` (default 2) wins. Ties never move the choice, so with
  several good entries (VLANs, bonds, second addresses) the first one counts.
- When no entry of the wanted version exists, the result depends on the family: for AF_INET the
  first IPv4 entry is taken whatever its version (NCCL reaches it through its "different family"
  step, which skips the version check); for AF_INET6 NCCL never leaves a link-local index 0 for
  an entry of the other version. We return the same answers.
- When nothing qualifies NCCL stays at index 0 (link-local or empty: cross-node traffic then
  times out). We return no index and say why.

Where we deliberately differ: entries whose type cannot be read (EINVAL, e.g. a torn-down
address or a container whose sysfs lacks the entry) are skipped. NCCL before 2.26 aborts on them;
later versions skip them as candidates but can still land on one through the family step.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rdmaplane.core.model import Gid, GidType, Hca, LinkLayer, NodeTopology, Port
from rdmaplane.core.selectors import Selectors, compute_ports, port_key
from rdmaplane.core.settings import setting
from rdmaplane.core.untrusted import FieldError

AF_INET = 4
AF_INET6 = 6
ROUTABLE_FLID_GID_INDEX = 1  # NCCL_IB_ROUTABLE_FLID_GID_INDEX's default
_ROCE_VERSION = {GidType.ROCE_V1: 1, GidType.ROCE_V2: 2}
_FAMILY_NAME = {AF_INET: "IPv4", AF_INET6: "IPv6"}
_LINK_LOCAL_TOP_BITS = 0xFE80 >> 6  # fe80::/10


@dataclass(frozen=True)
class GidPolicy:
    """NCCL's knobs for automatic GID selection."""

    family: int = setting(AF_INET, "NCCL_IB_ADDR_FAMILY: 4 or 6", key="addrFamily")
    roce_version: int = setting(2, "NCCL_IB_ROCE_VERSION_NUM")
    cidr: str | None = setting(
        None, "NCCL_IB_ADDR_RANGE, a CIDR of the family; null: any", key="addrRange"
    )

    def __post_init__(self) -> None:
        if self.family not in (AF_INET, AF_INET6):
            raise FieldError("family", f"{self.family!r} is not 4 (IPv4) or 6 (IPv6)")
        if self.roce_version not in (1, 2):
            raise FieldError("roce_version", f"{self.roce_version!r} is not 1 or 2")
        if self.cidr is not None:
            try:
                net = ipaddress.ip_network(self.cidr, strict=False)
            except ValueError as e:
                raise FieldError("cidr", f"{self.cidr!r} is not a CIDR range") from e
            if net.version != self.family:
                raise FieldError(
                    "cidr", f"{self.cidr!r} is IPv{net.version}, the family is IPv{self.family}"
                )

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
        return None if self.cidr is None else _network(self.cidr)

    def in_range(self, gid: Gid) -> bool:
        return self.contains(_as_int(gid.raw))

    def contains(self, address: int) -> bool:
        """Is a GID of the policy's family (as a 128-bit int) inside the range, if one is set?"""
        net = self.network
        if net is None:
            return True
        if net.version == AF_INET:
            address &= 0xFFFFFFFF
        return address & int(net.netmask) == int(net.network_address)


@functools.cache
def _network(cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(cidr, strict=False)


@dataclass(frozen=True)
class GidChoice:
    """The index chosen for one port (None when no GID is usable), and why."""

    hca: str
    port: int
    index: int | None
    reason: str
    gid: Gid | None
    link_layer: LinkLayer = LinkLayer.ETHERNET

    @property
    def roce(self) -> bool:
        return self.link_layer != LinkLayer.INFINIBAND

    @property
    def name(self) -> str:
        return f"{self.hca}:{self.port}"


def roce_version(gid: Gid) -> int | None:
    return _ROCE_VERSION.get(gid.type) if gid.type is not None else None


def is_candidate(gid: Gid, policy: GidPolicy) -> bool:
    """Could NCCL pick this entry at all (any version)? Works on the GID as one integer: this
    runs for every entry of every port at allocation time and for every node in an audit."""
    if gid.type is None:
        return False
    address = _as_int(gid.raw)
    if address == 0 or address >> 118 == _LINK_LOCAL_TOP_BITS:
        return False
    family = AF_INET if address >> 32 == 0xFFFF else AF_INET6
    return family == policy.family and policy.contains(address)


def _as_int(raw: str) -> int:
    """The kernel's full form (`0000:…:ffff:0a63:5b27`) without building an IPv6Address."""
    if len(raw) == 39:
        with contextlib.suppress(ValueError):
            return int(raw.replace(":", ""), 16)
    return int(ipaddress.IPv6Address(raw))


def select_gid(hca: Hca, port: Port, policy: GidPolicy = GidPolicy()) -> GidChoice:
    """The GID index NCCL ≥ 2.21 picks on its own for this port (see the module docstring)."""
    if port.link_layer == LinkLayer.INFINIBAND:
        return _infiniband_choice(hca, port)
    if port.link_layer != LinkLayer.ETHERNET:
        return GidChoice(
            hca.name,
            port.number,
            None,
            "link layer unknown: neither InfiniBand nor RoCE",
            None,
            port.link_layer,
        )
    found = [g for g in sorted(port.gids, key=lambda g: g.index) if is_candidate(g, policy)]
    wanted = [g for g in found if roce_version(g) == policy.roce_version]
    if wanted:
        return _chosen(hca, port, wanted[0], "")
    if found and policy.family == AF_INET:
        note = f" (no RoCE v{policy.roce_version} GID)"
        return _chosen(hca, port, found[0], note)
    return GidChoice(hca.name, port.number, None, _why_none(port, policy), None, port.link_layer)


def gid_problem(gid: Gid | None, policy: GidPolicy = GidPolicy()) -> str | None:
    """Why this entry cannot carry NCCL's RoCE traffic when an index forces it (a fixed
    `NCCL_IB_GID_INDEX`), or None when it can."""
    if gid is None or gid.is_zero:
        return "is empty"
    if gid.type is None:
        return f"has unreadable attributes ({gid.attrs_error or 'EINVAL'})"
    if gid.is_link_local:
        return "is link-local (fe80::)"
    if gid.family != policy.family:
        return f"is IPv{gid.family}, not IPv{policy.family}"
    if roce_version(gid) != policy.roce_version:
        return f"is RoCE v{roce_version(gid)}, not v{policy.roce_version}"
    if not policy.in_range(gid):
        return f"is outside {policy.cidr}"
    return None


def gid_note(gid: Gid, choice: GidChoice, policy: GidPolicy = GidPolicy()) -> str:
    """Why this entry of a RoCE port was or was not chosen, in a few words (for explain)."""
    if gid.index == choice.index:
        return "chosen"
    if not choice.roce:
        return ""
    if gid.is_link_local:
        return "link-local"
    if gid.type is None:
        return f"skipped: {gid.attrs_error or 'type unreadable'}"
    if gid.family != policy.family:
        return f"IPv{gid.family}, not IPv{policy.family}"
    if not policy.in_range(gid):
        return f"outside {policy.cidr}"
    if roce_version(gid) != policy.roce_version:
        return f"RoCE v{roce_version(gid)}, not v{policy.roce_version}"
    return f"GID {choice.index} comes first"


def _infiniband_choice(hca: Hca, port: Port) -> GidChoice:
    routable = next((g for g in port.gids if g.index == ROUTABLE_FLID_GID_INDEX), None)
    if routable is not None and routable.address.packed[4:6] != b"\0\0":
        reason = f"InfiniBand: GID {routable.index} carries a routable FLID"
        return GidChoice(hca.name, port.number, routable.index, reason, routable, port.link_layer)
    gid0 = next((g for g in port.gids if g.index == 0), None)
    reason = "InfiniBand: GID 0 (no RoCE selection on IB ports)"
    return GidChoice(hca.name, port.number, 0, reason, gid0, port.link_layer)


def _chosen(hca: Hca, port: Port, gid: Gid, note: str) -> GidChoice:
    on = f" on {gid.netdev}" if gid.netdev else ""
    reason = f"GID {gid.index}: RoCE v{roce_version(gid)}, {gid.ip}{on}{note}"
    return GidChoice(hca.name, port.number, gid.index, reason, gid, port.link_layer)


def _why_none(port: Port, policy: GidPolicy) -> str:
    fam = _FAMILY_NAME[policy.family]
    valid = [g for g in port.gids if not g.is_zero and not g.is_link_local]
    readable = [g for g in valid if g.type is not None]
    of_family = [g for g in readable if g.family == policy.family]
    if not port.gids:
        return "GID table is empty"
    if not valid:
        return "only link-local GIDs"
    if not readable:
        errors = "; ".join(sorted({g.attrs_error or "unknown type" for g in valid}))
        return f"only GIDs whose attributes cannot be read ({errors})"
    if not of_family:
        others = ", ".join(sorted({_FAMILY_NAME.get(g.family or 0, "?") for g in readable}))
        return f"no {fam} GID (only {others})"
    if not any(policy.in_range(g) for g in of_family):
        outside = ", ".join(str(g.ip) for g in of_family)
        return f"no {fam} GID in {policy.cidr} ({outside} outside)"
    have = ", ".join(sorted({f"v{roce_version(g)}" for g in of_family}))
    return (
        f"no RoCE v{policy.roce_version} GID with an {fam} address (only {have}); "
        "NCCL does not fall back to another RoCE version for IPv6"
    )


# ----------------------------------------------------------------- one node


@dataclass(frozen=True)
class NodeGidPlan:
    """The choice per port of a set, and whether one index holds for all its RoCE ports.

    `uniform_index` is that index (None when the RoCE ports disagree, one has no usable GID, or
    the set has no RoCE port). `majority_index` is the most common RoCE index (ties: the lowest),
    and `divergent` the RoCE choices that differ from it, including those without an index.
    InfiniBand ports never diverge: they need no GID index setting.
    """

    choices: tuple[GidChoice, ...]
    uniform_index: int | None
    divergent: tuple[GidChoice, ...]
    majority_index: int | None = None

    @property
    def roce_choices(self) -> tuple[GidChoice, ...]:
        return tuple(c for c in self.choices if c.roce)

    @property
    def uniform(self) -> bool:
        """Nothing to unify: every RoCE port agrees (or there is none)."""
        return not self.divergent


def plan_node(
    topo: NodeTopology, ports: Sequence[tuple[Hca, Port]], policy: GidPolicy = GidPolicy()
) -> NodeGidPlan:
    """Choices for `ports` (which must belong to `topo`), in natural HCA order."""
    for hca, _ in ports:
        if topo.hca(hca.name) is None:
            node = topo.hostname or topo.source or "the node"
            raise ValueError(f"{hca.name} is not an HCA of {node}")
    unique = {(h.name, p.number): (h, p) for h, p in ports}
    ordered = sorted(unique.values(), key=port_key)
    return plan_choices(tuple(select_gid(h, p, policy) for h, p in ordered))


def plan_choices(choices: tuple[GidChoice, ...]) -> NodeGidPlan:
    roce = [c for c in choices if c.roce]
    majority = majority_index(roce)
    divergent = tuple(c for c in roce if c.index is None or c.index != majority)
    uniform = majority if roce and not divergent else None
    return NodeGidPlan(choices, uniform, divergent, majority)


def majority_index(choices: Sequence[GidChoice]) -> int | None:
    counts = Counter(c.index for c in choices if c.index is not None)
    if not counts:
        return None
    return min(counts, key=lambda i: (-counts[i], i))


# ----------------------------------------------------------------- a cluster


@dataclass(frozen=True)
class Deviation:
    """One node's port whose index differs from the cluster's (majority) index."""

    node: str
    choice: GidChoice
    expected: int | None

    @property
    def why(self) -> str:
        has = "no usable GID" if self.choice.index is None else f"index {self.choice.index}"
        want = "" if self.expected is None else f", cluster uses {self.expected}"
        return f"{self.node} {self.choice.name}: {has}{want} ({self.choice.reason})"


@dataclass(frozen=True)
class NodeAudit:
    node: str
    plan: NodeGidPlan
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterAudit:
    """`cluster_index` is the one index every RoCE compute port of every node uses, if any."""

    cluster_index: int | None
    majority_index: int | None
    nodes: tuple[NodeAudit, ...]
    deviations: tuple[Deviation, ...]

    @property
    def uniform(self) -> bool:
        return not self.deviations


def audit(
    nodes: Sequence[NodeTopology],
    selectors: Selectors | None = None,
    policy: GidPolicy = GidPolicy(),
) -> ClusterAudit:
    """Plan every node's compute ports and compare them with the cluster's majority index."""
    names = _node_names(nodes)
    audits = []
    for name, topo in zip(names, nodes, strict=True):
        ports = compute_ports(topo, selectors)
        plan = plan_node(topo, ports, policy)
        notes = []
        if not ports:
            notes.append("no compute ports")
        elif not plan.roce_choices:
            notes.append("InfiniBand only: GID index 0, nothing to unify")
        audits.append(NodeAudit(name, plan, tuple(notes)))
    roce = [(a.node, c) for a in audits for c in a.plan.roce_choices]
    majority = majority_index([c for _, c in roce])
    deviations = tuple(
        Deviation(node, c, majority) for node, c in roce if c.index is None or c.index != majority
    )
    cluster = majority if roce and not deviations else None
    return ClusterAudit(cluster, majority, tuple(audits), deviations)


def _node_names(nodes: Sequence[NodeTopology]) -> list[str]:
    """Hostnames (else sources), made unique with a `#2` suffix in input order."""
    names: list[str] = []
    for i, topo in enumerate(nodes):
        base = topo.hostname or topo.source or f"node-{i}"
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}#{n}"
        names.append(name)
    return names
