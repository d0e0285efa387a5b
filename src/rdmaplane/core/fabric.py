"""The fabric between nodes: switches in tiers, and which node (or which HCA of it) plugs into
which tier-0 switch. Pure: documents in, model out; no I/O.

Tiers count from the node outwards: tier-0 is the switch a NIC plugs into (a leaf, a ToR, or in
a rail-optimised fabric the rail's leaf), tier-1 the spine above it, tier-2 the core or block
above that. A node's *location* is one id per tier, closest first. When a node's HCAs plug into
several tier-0 switches (one per rail), its tier-0 id stands for that set of switches: the
switches' common `group` when the fabric file names one, else `rails-<hash>` of their names, the
same on every node cabled to the same set. Higher tiers collapse the same way.

Sources, each an adapter that ends up here:
- node labels clusters already carry (`location_from_labels`, schemes below, configurable);
- the operator's fabric file (`config.fabric.fabric_from_document`: `kind: Fabric`, switches,
  nodes, links, checked here by `build_fabric`);
- LLDP on the node (`discovery.lldp`: per netdev the switch it plugs into).

Everything that compares two nodes (`hops`, `closeness`) works on locations only, so nodes
placed by different sources can be compared as long as their ids agree.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rdmaplane.core import nrt
from rdmaplane.core.errors import InputError

TOPOGRAPH_TIER = "fabric.topograph.run/tier-{}"
# What the agent writes by default: the topograph tier-N scheme, three tiers.
DEFAULT_TIER_LABELS: tuple[str, ...] = tuple(TOPOGRAPH_TIER.format(i) for i in range(3))
HOSTNAME_LABEL = "kubernetes.io/hostname"

# Node label schemes clusters already carry, each closest tier first. A node takes the scheme
# it has the most keys of (the first on a tie); keys it lacks are skipped, so its closest present
# key is its tier-0 (EKS adds a fourth, most selective layer on some instance types only).
DEFAULT_LABEL_SCHEMES: tuple[tuple[str, ...], ...] = (
    tuple(TOPOGRAPH_TIER.format(i) for i in range(4)),  # topograph ≥ 1.0, and our agent
    tuple(f"network.topology.nvidia.com/{t}" for t in ("leaf", "spine", "core")),
    tuple(f"network.topology.nvidia.com/{t}" for t in ("block", "spine", "datacenter")),
    ("cloud.google.com/gce-topology-subblock", "cloud.google.com/gce-topology-block"),
    tuple(f"topology.k8s.aws/network-node-layer-{i}" for i in (4, 3, 2, 1)),
    tuple(
        f"oci.oraclecloud.com/rdma.{k}"
        for k in ("local_block_id", "network_block_id", "hpc_island_id")
    ),
)

MAX_TIERS = 8
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


class FabricError(InputError):
    """A fabric description that cannot be right; the message names where and what."""


# ---------------------------------------------------------------------------------------------
# Locations and distances


@dataclass(frozen=True, slots=True)
class Location:
    """Where a node sits: one id per tier, closest first; per HCA its rail and tier-0 switch."""

    tiers: tuple[str, ...]
    rails: tuple[tuple[int, str], ...] = ()  # (rail, tier-0 switch), sorted by rail

    @property
    def tier0(self) -> str | None:
        return self.tiers[0] if self.tiers else None


def _meeting(a: Location, b: Location) -> tuple[int, int] | None:
    """(i, j): the closest common id, a's tier i = b's tier j (the least i + j), or None."""
    best: tuple[int, int] | None = None
    index = {t: j for j, t in reversed(list(enumerate(b.tiers)))}
    for i, t in enumerate(a.tiers):
        j = index.get(t)
        if j is not None and (best is None or i + j < sum(best)):
            best = (i, j)
    return best


def hops(a: Location, b: Location) -> float:
    """Switches a message crosses between the two nodes: 1 under one tier-0 switch, 3 through
    a tier-1, 5 through a tier-2; with no common id, as if through one more tier above both.

    When both name their rails and share tier-0, each common rail counts on its own (a rail
    whose switches differ goes through the spine: 3), and the result is the mean over rails.
    """
    meet = _meeting(a, b)
    if meet is None:
        return float(len(a.tiers) + len(b.tiers) + 1)
    if meet == (0, 0) and a.rails and b.rails:
        theirs = dict(b.rails)
        common = [(s, theirs[r]) for r, s in a.rails if r in theirs]
        if common:
            return sum(1.0 if x == y else 3.0 for x, y in common) / len(common)
    return float(meet[0] + meet[1] + 1)


def closeness(a: Location, b: Location) -> float:
    """1 under one tier-0 switch, halved with every tier the path climbs (0.5 through a spine)."""
    return float(2.0 ** (-(hops(a, b) - 1) / 2))


# ---------------------------------------------------------------------------------------------
# Label values and names


def _digest(text: str, length: int = 10) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def label_value(name: str) -> str:
    """`name` as a node label value: itself when valid (≤ 63 of `[-A-Za-z0-9_.]`, alphanumeric
    at both ends); else a readable part plus a hash of the whole, so distinct names stay
    distinct (LLDP chassis ids are MACs with colons)."""
    if name and _LABEL_VALUE.match(name):
        return name
    cleaned = re.sub(r"[^-A-Za-z0-9_.]+", "-", name).strip("-_.")[:50].strip("-_.")
    return f"{cleaned}-{_digest(name)}" if cleaned else f"x-{_digest(name)}"


def object_name(prefix: str, name: str) -> str:
    """A DNS-1123 label for an object standing for `name` (`prefix-name`, lower case), with a
    hash suffix whenever the name had to change."""
    cleaned = _DNS_LABEL.sub("-", name.lower()).strip("-")
    plain = f"{prefix}-{cleaned}"
    if cleaned and cleaned == name and len(plain) <= 63:
        return plain
    return f"{plain[:52].rstrip('-')}-{_digest(name)}"


def collapse(ids: Iterable[str], group: str | None = None) -> str:
    """One id for a set of switches: the only one, the group they share, or a stable hash."""
    unique = sorted(set(ids))
    if len(unique) == 1:
        return unique[0]
    if group:
        return group
    return f"rails-{_digest(','.join(unique))}"


def tier_labels(location: Location, keys: Sequence[str]) -> dict[str, str]:
    """The node labels for a location: `keys[i]` = tier i's id as a label value."""
    return {key: label_value(t) for key, t in zip(keys, location.tiers, strict=False)}


def location_from_labels(
    labels: Mapping[str, str], schemes: Sequence[Sequence[str]] = DEFAULT_LABEL_SCHEMES
) -> Location | None:
    """A node's tiers from its labels (see `DEFAULT_LABEL_SCHEMES` for the rule)."""
    keys = scheme_of(labels, schemes)
    return Location(tuple(labels[k] for k in keys)) if keys else None


def scheme_of(
    labels: Mapping[str, str], schemes: Sequence[Sequence[str]] = DEFAULT_LABEL_SCHEMES
) -> tuple[str, ...] | None:
    """The label keys (closest first) a node's location comes from, None when it has none."""
    best: tuple[str, ...] = ()
    for scheme in schemes:
        present = tuple(k for k in scheme if labels.get(k))
        if len(present) > len(best):
            best = present
    return best or None


# ---------------------------------------------------------------------------------------------
# The fabric file


@dataclass(frozen=True, slots=True)
class Switch:
    name: str = field(metadata={"min_length": 1})
    tier: int = field(metadata={"ge": 0, "lt": MAX_TIERS})
    parent: str | None = None
    rail: int | None = field(default=None, metadata={"ge": 0})
    group: str | None = None


@dataclass(frozen=True, slots=True)
class Link:
    """A cable: a node's HCA port (or the whole node, `hca` "") into a tier-0 switch port."""

    node: str = field(metadata={"min_length": 1})
    switch: str = field(metadata={"min_length": 1})
    hca: str = ""
    port: int = field(default=1, metadata={"ge": 1})
    switch_port: str = ""
    rail: int | None = field(default=None, metadata={"ge": 0})


@dataclass(frozen=True)
class Fabric:
    switches: Mapping[str, Switch]
    links: tuple[Link, ...]
    nodes: tuple[str, ...]
    _by_node: Mapping[str, tuple[Link, ...]] = field(default_factory=dict, repr=False)

    def ancestors(self, switch: str) -> tuple[str, ...]:
        """The switch, its parent, the parent's parent… (validated: no loop)."""
        chain = [switch]
        while (parent := self.switches[chain[-1]].parent) is not None:
            chain.append(parent)
        return tuple(chain)

    def links_of(self, node: str) -> tuple[Link, ...]:
        return self._by_node.get(node, ())

    def location(self, node: str) -> Location | None:
        """The node's tiers and rails, from its links (None for a node with none)."""
        links = self.links_of(node)
        if not links:
            return None
        chains = [self.ancestors(link.switch) for link in links]
        tiers: list[str] = []
        for level in range(max(len(c) for c in chains)):
            ids = [c[level] for c in chains if level < len(c)]
            groups = {self.switches[i].group for i in ids}
            tiers.append(collapse(ids, groups.pop() if len(groups) == 1 else None))
        return Location(tuple(tiers), rails_of(links, self.switches))

    def locations(self) -> dict[str, Location]:
        found = {n: self.location(n) for n in self.nodes}
        return {n: loc for n, loc in found.items() if loc is not None}


def hca_rails(links: Sequence[Link], switches: Mapping[str, Switch]) -> dict[str, int]:
    """Per linked HCA its rail: the link's, else its switch's, else the HCA's position among the
    node's linked HCAs in natural name order (NIC k on rail k, the rail-optimised convention)."""
    per_hca = sorted(
        {link.hca: link for link in links if link.hca}.values(), key=lambda x: _natural(x.hca)
    )
    rails = {}
    for k, link in enumerate(per_hca):
        switch = switches.get(link.switch)
        given = link.rail if link.rail is not None else (switch.rail if switch else None)
        rails[link.hca] = k if given is None else given
    return rails


def rails_of(links: Sequence[Link], switches: Mapping[str, Switch]) -> tuple[tuple[int, str], ...]:
    """(rail, tier-0 switch) of a node's linked HCAs (see `hca_rails`)."""
    rails = hca_rails(links, switches)
    return tuple(sorted({(rails[x.hca], x.switch) for x in links if x.hca}))


def _natural(name: str) -> tuple[tuple[int, object], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p)


def build_fabric(
    switches: Sequence[Switch], links: Sequence[Link], nodes: Sequence[str], where: str = "fabric"
) -> Fabric:
    """Check a fabric and index it: unique names, known parents, no loop, each parent one tier
    up; links from listed nodes into tier-0 switches, one switch per HCA port and one HCA port
    per switch port. `FabricError` names the first problem."""
    table: dict[str, Switch] = {}
    for i, s in enumerate(switches):
        if s.name in table:
            raise FabricError(f"{where}: switches[{i}]: switch {s.name!r} is listed twice")
        table[s.name] = s
    for i, s in enumerate(switches):
        if s.parent is not None and s.parent not in table:
            raise FabricError(
                f"{where}: switches[{i}] ({s.name}): parent {s.parent!r} is not a switch here"
            )
    _check_loops(table, where)
    for i, s in enumerate(switches):
        parent = table[s.parent] if s.parent is not None else None
        if parent is not None and parent.tier != s.tier + 1:
            raise FabricError(
                f"{where}: switches[{i}] ({s.name}): parent {parent.name} is tier {parent.tier};"
                f" the parent of a tier-{s.tier} switch must be tier {s.tier + 1}"
            )
    listed = list(dict.fromkeys(nodes))
    _check_links(table, links, set(listed), where)
    by_node: dict[str, list[Link]] = {}
    for link in links:
        by_node.setdefault(link.node, []).append(link)
    return Fabric(table, tuple(links), tuple(listed), {n: tuple(v) for n, v in by_node.items()})


def _check_loops(table: Mapping[str, Switch], where: str) -> None:
    done: set[str] = set()
    for start in table:
        path: list[str] = []
        current: str | None = start
        while current is not None and current not in done:
            if current in path:
                loop = [*path[path.index(current) :], current]
                raise FabricError(f"{where}: switches: loop {' → '.join(loop)}")
            path.append(current)
            current = table[current].parent
        done.update(path)


def _check_links(
    table: Mapping[str, Switch], links: Sequence[Link], nodes: set[str], where: str
) -> None:
    ports: dict[tuple[str, str, int], tuple[int, Link]] = {}
    cabled: dict[tuple[str, str], tuple[int, Link]] = {}
    whole: dict[str, int] = {}
    per_hca: dict[str, int] = {}
    for i, link in enumerate(links):
        at = f"{where}: links[{i}]"
        if link.node not in nodes:
            raise FabricError(f"{at}: unknown node {link.node!r} (not listed under nodes)")
        switch = table.get(link.switch)
        if switch is None:
            raise FabricError(f"{at}: unknown switch {link.switch!r}")
        if switch.tier != 0:
            raise FabricError(
                f"{at}: {link.switch} is a tier-{switch.tier} switch; nodes plug into tier-0"
            )
        (whole if not link.hca else per_hca)[link.node] = i
        if link.node in whole and link.node in per_hca:
            raise FabricError(f"{at}: {link.node} has both a whole-node link and per-HCA links")
        key = (link.node, link.hca, link.port)
        seen = ports.get(key)
        if seen is not None and seen[1].switch != link.switch:
            what = f"{link.node} {link.hca} port {link.port}" if link.hca else link.node
            raise FabricError(
                f"{at}: {what} plugs into {link.switch}, but links[{seen[0]}] plugs it into "
                f"{seen[1].switch}: two tier-0 switches for one port"
            )
        ports.setdefault(key, (i, link))
        if link.switch_port:
            other = cabled.get((link.switch, link.switch_port))
            if other is not None and (other[1].node, other[1].hca) != (link.node, link.hca):
                raise FabricError(
                    f"{at}: {link.switch} port {link.switch_port} is already cabled to "
                    f"{other[1].node} {other[1].hca} (links[{other[0]}])"
                )
            cabled.setdefault((link.switch, link.switch_port), (i, link))


# ---------------------------------------------------------------------------------------------
# The tree formed by many nodes' locations (labels, or a fabric file)


@dataclass(frozen=True)
class TierTree:
    """Tier ids above each other as the nodes' locations say: parent of (tier, id), members."""

    depth: int
    parents: Mapping[tuple[int, str], str]
    nodes_under: Mapping[str, tuple[str, ...]]  # tier-0 id → nodes, sorted
    problems: tuple[str, ...]

    def ids(self, tier: int) -> list[str]:
        found = {i for (t, i) in self.parents if t == tier}
        if tier == 0:
            found |= set(self.nodes_under)
        else:
            found |= {p for (t, _), p in self.parents.items() if t == tier - 1}
        return sorted(found)

    def children(self, tier: int, name: str) -> list[str]:
        return sorted(i for (t, i), p in self.parents.items() if t == tier - 1 and p == name)


def tree(locations: Mapping[str, Location]) -> TierTree:
    """Fold locations into a tree. A node that contradicts what earlier nodes said (an id with
    two parents, or seen at two tiers) is left out and named in `problems`."""
    parents: dict[tuple[int, str], str] = {}
    tier_of: dict[str, int] = {}
    under: dict[str, list[str]] = {}
    problems: list[str] = []
    for node in sorted(locations):
        tiers = locations[node].tiers
        why = _contradiction(node, tiers, parents, tier_of)
        if why:
            problems.append(why)
            continue
        for level, name in enumerate(tiers):
            tier_of[name] = level
            if level + 1 < len(tiers):
                parents[(level, name)] = tiers[level + 1]
        if tiers:
            under.setdefault(tiers[0], []).append(node)
    depth = max((len(locations[n].tiers) for n in locations), default=0)
    return TierTree(depth, parents, {k: tuple(v) for k, v in under.items()}, tuple(problems))


def _contradiction(
    node: str,
    tiers: tuple[str, ...],
    parents: Mapping[tuple[int, str], str],
    tier_of: Mapping[str, int],
) -> str | None:
    for level, name in enumerate(tiers):
        if tier_of.get(name, level) != level:
            return f"{node}: {name} is tier {level} here but tier {tier_of[name]} elsewhere"
        up = tiers[level + 1] if level + 1 < len(tiers) else None
        known = parents.get((level, name))
        if up is not None and known is not None and known != up:
            return f"{node}: tier-{level} {name} sits under {up} here but under {known} elsewhere"
    return None


@dataclass(frozen=True)
class NodeFabric:
    """What the agent publishes about its place on the fabric."""

    labels: dict[str, str]
    uplinks: tuple[nrt.Uplink, ...]
    source: str  # "file", "lldp" or "" (nothing known)

    @property
    def rails(self) -> dict[str, int]:
        """Each cabled HCA's rail (what the device plugin tells pods: `RDMAPLANE_RAILS`)."""
        return nrt.rail_by_hca(self.uplinks)


NOTHING = NodeFabric({}, (), "")
