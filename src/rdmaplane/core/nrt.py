"""The published contract between the node agent and the scheduler extender.

A node's GPU/RDMA topology travels as an upstream-compatible `NodeResourceTopology` object
(`topology.node.k8s.io/v1alpha2`, cluster-scoped, named after the node):

- top-level `attributes`: `topologyManagerPolicy`, `topologyManagerScope` (the kubelet's
  settings) and `rdmaplane.io/accounted-pods`, the sorted `namespace/name` list of pods whose
  devices were subtracted when `available` was computed; the scheduler subtracts any other bound
  pod itself, so two pods decided in a row never both count on the same free devices. When the
  node names a resource the defaults do not, `rdmaplane.io/resources` says which resources are
  GPUs, exclusive HCA pools and shared pools (`rdmaplane.core.resources`:
  `amd.com/gpu=gpu,example.com/ib=exclusive,rdma/hca_shared_devices_a=shared`); an NRT
  without it (default names, or an older agent) is read with the reader's own names. For the
  fleet audit (`rdmaplane.core.audit`): `rdmaplane.io/hca-firmware` (each HCA's firmware) and, when
  a link trained short, `rdmaplane.io/pcie-downtrained`.
- one zone per NUMA node (`node-<id>`, type `Node`, `costs` = NUMA distances) with
  `capacity/allocatable/available` of each of those resources (by default `nvidia.com/gpu`,
  `rdmaplane.io/hca` and `rdmaplane.io/hca-shared`), GPUs first, then exclusive pools, then
  shared ones; a node whose NUMA is unknown publishes `node-0`.
- below each NUMA zone, one zone per PCIe root complex holding GPUs or HCAs (`pci0000:17`, type
  `PCIeRoot`, `parent: node-<id>`) with the GPUs and exclusive HCAs on that root. Shared slots
  belong to no root (each grants the whole pool), so a root zone states how many of a shared
  pool's HCAs sit on it in the zone attribute `rdmaplane.io/shared-hcas` instead: a number when
  the node has one shared pool, else `pool=count` pairs.
- one zone per HCA whose uplink is known (`mlx5_0`, type `HCA`, `parent` its PCIe root zone, or
  its NUMA zone), without resources, with the zone attributes `rdmaplane.io/tier-0-switch` (the
  switch it plugs into), `rdmaplane.io/rail` and, when known, `rdmaplane.io/switch-port`. Readers
  that look only at `Node` zones (the upstream NodeResourceTopology plugin) never see them.

Quantities are strings of integers on the wire. The zones are the wire's own shape, decoded by
the model layer (`rdmaplane.core.decoding`). Everything here is pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import msgspec

from rdmaplane.core import model, names
from rdmaplane.core.decoding import DecodeError, Quantity, convert
from rdmaplane.core.decoding import parse_quantity as parse_quantity  # for the NRT's readers
from rdmaplane.core.errors import InputError
from rdmaplane.core.resources import DEFAULT, Vocabulary, VocabularyError
from rdmaplane.core.resources import GPU as GPU  # the default names, for the NRT's readers
from rdmaplane.core.resources import HCA as HCA
from rdmaplane.core.resources import HCA_SHARED as HCA_SHARED
from rdmaplane.core.selectors import compute_ports

API_VERSION = "topology.node.k8s.io/v1alpha2"
KIND = "NodeResourceTopology"
GROUP = "topology.node.k8s.io"

ATTR_POLICY = "topologyManagerPolicy"
ATTR_SCOPE = "topologyManagerScope"
ATTR_ACCOUNTED_PODS = names.ACCOUNTED_PODS_ATTR
ATTR_HCA_FIRMWARE = names.HCA_FIRMWARE_ATTR
ATTR_PCIE_DOWNTRAINED = names.PCIE_DOWNTRAINED_ATTR
ATTR_RESOURCES = names.RESOURCES_ATTR
ZONE_ATTR_SHARED_HCAS = names.SHARED_HCAS_ATTR
ZONE_ATTR_TIER0_SWITCH = names.TIER0_SWITCH_ATTR
ZONE_ATTR_RAIL = names.RAIL_ATTR
ZONE_ATTR_SWITCH_PORT = names.SWITCH_PORT_ATTR

ZONE_NUMA = "Node"
ZONE_PCIE_ROOT = "PCIeRoot"
ZONE_HCA = "HCA"

# The kubelet's Topology Manager policies and scopes, as the NRT attributes name them.
TopologyPolicy = Literal["none", "best-effort", "restricted", "single-numa-node"]
TopologyScope = Literal["container", "pod"]
POLICIES: tuple[str, ...] = get_args(TopologyPolicy)
SCOPES: tuple[str, ...] = get_args(TopologyScope)

LABEL_RDMA = names.RDMA_LABEL
LABEL_LINK_LAYER = names.LINK_LAYER_LABEL
LABEL_RATE_GBPS = names.RATE_GBPS_LABEL
LABEL_GID_INDEX = names.GID_INDEX_LABEL
LABEL_RDMA_NETNS = names.RDMA_NETNS_LABEL
CONDITION_RDMA_READY = names.READY_CONDITION

# The deprecated v1alpha1-style `topologyPolicies` values, read when the attributes are absent.
_LEGACY_POLICIES = {
    "None": ("none", "container"),
    "BestEffort": ("best-effort", "container"),
    "Restricted": ("restricted", "container"),
    "SingleNUMANodeContainerLevel": ("single-numa-node", "container"),
    "SingleNUMANodePodLevel": ("single-numa-node", "pod"),
}


class NrtError(InputError):
    """A malformed NodeResourceTopology object; the message names the bad field."""


class Attribute(msgspec.Struct, frozen=True):
    name: str
    value: str


class Cost(msgspec.Struct, frozen=True):
    name: str
    value: int


class ZoneResource(msgspec.Struct, frozen=True):
    name: str
    capacity: Quantity
    allocatable: Quantity
    available: Quantity


class Zone(msgspec.Struct, frozen=True):
    name: str
    type: str
    parent: str = ""
    costs: tuple[Cost, ...] = ()
    attributes: tuple[Attribute, ...] = ()
    resources: tuple[ZoneResource, ...] = ()

    def resource(self, name: str) -> ZoneResource | None:
        return next((r for r in self.resources if r.name == name), None)

    def available(self, name: str) -> int:
        res = self.resource(name)
        return res.available if res else 0

    def allocatable(self, name: str) -> int:
        res = self.resource(name)
        return res.allocatable if res else 0

    def capacity(self, name: str) -> int:
        res = self.resource(name)
        return res.capacity if res else 0

    def attribute(self, name: str) -> str | None:
        return next((a.value for a in self.attributes if a.name == name), None)

    @property
    def shared_hcas(self) -> int:
        """Shared-pool HCAs on this PCIe root, every pool together (0 when none or malformed)."""
        value = self.attribute(ZONE_ATTR_SHARED_HCAS) or ""
        counts = [value] if value.isdigit() else [p.rpartition("=")[2] for p in value.split(",")]
        return sum(int(c) for c in counts if c.isdigit())

    def pool_hcas(self, pools: Iterable[str]) -> dict[str, int]:
        """HCAs of each of the shared `pools` on this PCIe root (0 where the attribute is absent
        or malformed; a bare number counts for every pool: the form of a node with one)."""
        value = self.attribute(ZONE_ATTR_SHARED_HCAS) or ""
        if value.isdigit():
            return dict.fromkeys(pools, int(value))
        counts = dict(p.rpartition("=")[::2] for p in value.split(","))
        return {p: int(c) if (c := counts.get(p, "")).isdigit() else 0 for p in pools}


@dataclass(frozen=True)
class Uplink:
    """Where one HCA plugs into the fabric: its tier-0 switch, rail and the switch's port."""

    hca: str
    switch: str
    rail: int | None = None
    switch_port: str = ""
    numa: int = -1  # where the HCA sits on the node, to hang its zone below the right one
    pcie_root: str | None = None


def rail_by_hca(uplinks: Iterable[Uplink]) -> dict[str, int]:
    """Each HCA's rail, for the uplinks that name one."""
    return {u.hca: u.rail for u in uplinks if u.rail is not None}


@dataclass(frozen=True)
class NodeResourceTopology:
    name: str
    zones: tuple[Zone, ...]
    attributes: tuple[Attribute, ...] = ()
    topology_policies: tuple[str, ...] = ()

    def attribute(self, name: str) -> str | None:
        return next((a.value for a in self.attributes if a.name == name), None)

    @property
    def policy(self) -> str:
        return self._policy_and_scope()[0]

    @property
    def scope(self) -> str:
        return self._policy_and_scope()[1]

    @property
    def accounted_pods(self) -> frozenset[str]:
        value = self.attribute(ATTR_ACCOUNTED_PODS) or ""
        return frozenset(p for p in value.split(",") if p)

    def vocabulary(self, default: Vocabulary = DEFAULT) -> Vocabulary:
        """The node's resource names as its agent published them, then the reader's own
        `default` for what they do not name (an older agent, or one on the default names,
        says nothing: then `default` alone). A pod asking for one of the reader's names the
        node does not have is refused there for want of it, not waved through."""
        value = self.attribute(ATTR_RESOURCES)
        if value is None:
            return default
        return Vocabulary.from_attribute(value).with_defaults(default)

    def numa_zones(self) -> tuple[Zone, ...]:
        return tuple(z for z in self.zones if z.type == ZONE_NUMA)

    def pcie_roots(self, numa_zone: str) -> tuple[Zone, ...]:
        return tuple(z for z in self.zones if z.type == ZONE_PCIE_ROOT and z.parent == numa_zone)

    def uplinks(self) -> tuple[Uplink, ...]:
        """The HCA zones' uplinks (tier-0 switch, rail, the PCIe root zone they hang below), in
        zone order; malformed ones skipped."""
        roots = {z.name for z in self.zones if z.type == ZONE_PCIE_ROOT}
        found = []
        for z in self.zones:
            switch, rail = z.attribute(ZONE_ATTR_TIER0_SWITCH), z.attribute(ZONE_ATTR_RAIL)
            if z.type == ZONE_HCA and switch:
                number = int(rail) if rail is not None and rail.isdigit() else None
                port = z.attribute(ZONE_ATTR_SWITCH_PORT) or ""
                root = z.parent if z.parent in roots else None
                found.append(Uplink(z.name, switch, number, port, pcie_root=root))
        return tuple(found)

    def _policy_and_scope(self) -> tuple[str, str]:
        policy, scope = self.attribute(ATTR_POLICY), self.attribute(ATTR_SCOPE)
        if policy is None and self.topology_policies:
            legacy = _LEGACY_POLICIES.get(self.topology_policies[0], ("none", "container"))
            return legacy if scope is None else (legacy[0], scope)
        return policy or "none", scope or "container"


def frees(before: NodeResourceTopology, after: NodeResourceTopology) -> bool:
    """Whether `after` has more of some resource free in some zone than `before` had: a pod
    refused for want of it may fit now, and someone must say so to kube-scheduler, which looks
    at an extender-refused pod again on Pod and Node events only, never on an NRT's."""
    was = {(z.name, r.name): r.available for z in before.zones for r in z.resources}
    return any(r.available > was.get((z.name, r.name), 0) for z in after.zones for r in z.resources)


def free_by_numa(nrt: NodeResourceTopology) -> dict[str, dict[str, int]]:
    """Available quantity of each resource per NUMA zone, as published."""
    return {z.name: {r.name: r.available for r in z.resources} for z in nrt.numa_zones()}


def free_by_root(nrt: NodeResourceTopology, numa_zone: str) -> dict[str, dict[str, int]]:
    """Available quantity of each resource per PCIe root below one NUMA zone."""
    return {z.name: {r.name: r.available for r in z.resources} for z in nrt.pcie_roots(numa_zone)}


# ---------------------------------------------------------------------------------------------
# Building the object from an inventory (what the agent publishes)


@dataclass(frozen=True)
class Device:
    """One schedulable device as the agent sees it: a GPU, an exclusive HCA or a shared slot,
    by its resource name (its kind is the vocabulary's)."""

    resource: str
    numa: int  # -1 when the kernel does not know
    pcie_root: str | None = None
    healthy: bool = True
    in_use: bool = False


@dataclass(frozen=True)
class PoolHca:
    """An HCA behind a shared pool's slots: which pool, and where the HCA sits."""

    pool: str
    numa: int
    pcie_root: str | None


def devices_from_topology(
    topology: model.NodeTopology, hcas: Iterable[str] | None = None
) -> list[Device]:
    """GPUs and exclusive HCAs of a discovered node, for `build`.

    `hcas` names the HCAs the device plugin offers (the agent passes its own set); by default
    the HCAs with a compute port (`selectors.compute_ports`: the fastest link class, up), which
    leaves storage and front-end NICs out. HCAs without a PCI function (rxe, siw) never count.
    """
    chosen = set(hcas) if hcas is not None else {h.name for h, _ in compute_ports(topology)}
    devices = [Device(GPU, _numa(g.pci.numa), g.pci.root) for g in topology.gpus]
    devices += [
        Device(HCA, _numa(h.pci.numa), h.pcie_root)
        for h in topology.hcas
        if h.pci and h.name in chosen
    ]
    return devices


def node_labels(
    topology: model.NodeTopology, hcas: Iterable[str] | None = None, gid_index: int | None = None
) -> dict[str, str]:
    """The node labels the agent sets: `rdma=true` when there is an RDMA HCA to offer, the link
    layer and rate when every offered port agrees, the GID index when one holds for all, the
    RDMA netns mode (`shared` or `exclusive`) when known."""
    chosen = set(hcas) if hcas is not None else {h.name for h, _ in compute_ports(topology)}
    ports = [p for h in topology.hcas if h.pci and h.name in chosen for p in h.ports]
    if not ports:
        return {}
    labels = {LABEL_RDMA: "true"}
    layers = {p.link_layer for p in ports}
    if len(layers) == 1 and model.LinkLayer.UNKNOWN not in layers:
        labels[LABEL_LINK_LAYER] = layers.pop().value
    rates = {p.rate_gbps for p in ports}
    if len(rates) == 1 and (rate := rates.pop()) is not None:
        labels[LABEL_RATE_GBPS] = f"{rate:g}"
    if gid_index is not None:
        labels[LABEL_GID_INDEX] = str(gid_index)
    if topology.netns_mode is not model.NetnsMode.UNKNOWN:
        labels[LABEL_RDMA_NETNS] = topology.netns_mode.value
    return labels


def numa_distances(topology: model.NodeTopology) -> dict[int, dict[int, int]]:
    """NUMA distances as `build` takes them (the kernel lists them in node id order)."""
    ids = [n.id for n in topology.numa_nodes]
    return {
        n.id: dict(zip(ids, n.distances, strict=False)) for n in topology.numa_nodes if n.distances
    }


def _numa(numa: int | None) -> int:
    return -1 if numa is None else numa


def numa_zone_name(numa: int) -> str:
    return f"node-{max(numa, 0)}"


def build(
    node_name: str,
    devices: Iterable[Device],
    *,
    policy: str = "none",
    scope: str = "container",
    accounted_pods: Iterable[str] = (),
    distances: Mapping[int, Mapping[int, int]] | None = None,
    shared_pool_hcas: Iterable[PoolHca] = (),
    uplinks: Iterable[Uplink] = (),
    vocabulary: Vocabulary = DEFAULT,
) -> NodeResourceTopology:
    """The NRT for a node: NUMA zones with totals, PCIe-root zones below them, HCA zones for
    the HCAs whose uplink is known; every device's resource is one of `vocabulary`'s.

    `shared_pool_hcas` lists the HCAs behind the shared slots, so a scheduler can tell which
    roots have a pool NIC next to their GPUs.
    """
    if policy not in POLICIES:
        raise NrtError(f"policy {policy!r} is not one of {', '.join(POLICIES)}")
    if scope not in SCOPES:
        raise NrtError(f"scope {scope!r} is not one of {', '.join(SCOPES)}")
    devs = list(devices)
    pool = list(shared_pool_hcas)
    unknown = {d.resource for d in devs} - set(vocabulary.names)
    unknown |= {h.pool for h in pool} - set(vocabulary.shared)
    if unknown:
        raise NrtError(f"resources {', '.join(sorted(unknown))}: not in the vocabulary")
    numa_ids = sorted(
        {max(d.numa, 0) for d in devs} | {max(h.numa, 0) for h in pool} | set(distances or {})
    )
    zones: list[Zone] = []
    for numa in numa_ids:
        here = [d for d in devs if max(d.numa, 0) == numa]
        costs = tuple(
            Cost(numa_zone_name(j), int(v))
            for j, v in sorted((distances or {}).get(numa, {}).items())
        )
        zones.append(
            Zone(
                numa_zone_name(numa),
                ZONE_NUMA,
                costs=costs,
                resources=_count(here, vocabulary.names),
            )
        )
    for numa in numa_ids:
        here = [d for d in devs if max(d.numa, 0) == numa and d.resource in vocabulary.rooted]
        pool_here = [h for h in pool if max(h.numa, 0) == numa and h.pcie_root]
        for root in sorted({d.pcie_root for d in here if d.pcie_root} | _roots(pool_here)):
            on_root = [d for d in here if d.pcie_root == root]
            attrs = _pool_attribute([h.pool for h in pool_here if h.pcie_root == root], vocabulary)
            zones.append(
                Zone(
                    root,
                    ZONE_PCIE_ROOT,
                    parent=numa_zone_name(numa),
                    attributes=attrs,
                    resources=_count(on_root, vocabulary.rooted),
                )
            )
    zones += _uplink_zones(uplinks, {z.name for z in zones})
    attributes: tuple[Attribute, ...] = (
        Attribute(ATTR_POLICY, policy),
        Attribute(ATTR_SCOPE, scope),
        Attribute(ATTR_ACCOUNTED_PODS, ",".join(sorted(set(accounted_pods)))),
    )
    if not vocabulary.within(DEFAULT):  # the default names go without saying
        attributes += (Attribute(ATTR_RESOURCES, vocabulary.to_attribute()),)
    return NodeResourceTopology(node_name, tuple(zones), attributes)


def _roots(pool: Iterable[PoolHca]) -> set[str]:
    return {h.pcie_root for h in pool if h.pcie_root}


def _pool_attribute(pools: list[str], vocabulary: Vocabulary) -> tuple[Attribute, ...]:
    """`rdmaplane.io/shared-hcas` of a root with these pool HCAs (one entry per HCA)."""
    if not pools:
        return ()
    if len(vocabulary.shared) == 1:
        return (Attribute(ZONE_ATTR_SHARED_HCAS, str(len(pools))),)
    counts = ",".join(f"{p}={pools.count(p)}" for p in vocabulary.shared if p in pools)
    return (Attribute(ZONE_ATTR_SHARED_HCAS, counts),)


def _uplink_zones(uplinks: Iterable[Uplink], taken: set[str]) -> list[Zone]:
    zones = []
    for up in sorted(uplinks, key=lambda u: u.hca):
        if up.hca in taken:
            raise NrtError(f"HCA zone {up.hca!r}: the name is already a zone")
        taken.add(up.hca)
        attrs = [Attribute(ZONE_ATTR_TIER0_SWITCH, up.switch)]
        if up.rail is not None:
            attrs.append(Attribute(ZONE_ATTR_RAIL, str(up.rail)))
        if up.switch_port:
            attrs.append(Attribute(ZONE_ATTR_SWITCH_PORT, up.switch_port))
        parent = up.pcie_root if up.pcie_root in taken else numa_zone_name(up.numa)
        zones.append(Zone(up.hca, ZONE_HCA, parent=parent, attributes=tuple(attrs)))
    return zones


def _count(devices: list[Device], names: Iterable[str]) -> tuple[ZoneResource, ...]:
    out = []
    for name in names:
        mine = [d for d in devices if d.resource == name]
        if mine:
            healthy = [d for d in mine if d.healthy]
            free = sum(1 for d in healthy if not d.in_use)
            out.append(
                ZoneResource(name, Quantity(len(mine)), Quantity(len(healthy)), Quantity(free))
            )
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Wire form


def to_object(nrt: NodeResourceTopology) -> dict[str, Any]:
    """The Kubernetes object (dict) for an NRT; quantities as strings of integers."""
    obj: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": nrt.name},
        "attributes": [{"name": a.name, "value": a.value} for a in nrt.attributes],
        "zones": [_zone_to_object(z) for z in nrt.zones],
    }
    if nrt.topology_policies:
        obj["topologyPolicies"] = list(nrt.topology_policies)
    return obj


# The fields of an NRT that say something about the node (its metadata aside).
CONTENT_FIELDS = ("f:zones", "f:attributes", "f:topologyPolicies")


def other_writers(obj: Mapping[str, Any], ours: str) -> list[str]:
    """The field managers other than `ours` that own some of the NRT's content (zones,
    attributes, policies) by `metadata.managedFields`, sorted: another program writing the same
    object (NFD's topology-updater, a scheduler-plugins exporter). A manager that owns only
    metadata (a label, an annotation) is not one. A full update takes every field it writes
    from the others, so a manager still listed with content wrote it after `ours` last did."""
    meta = obj.get("metadata")
    entries = meta.get("managedFields") if isinstance(meta, Mapping) else None
    found = set()
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, Mapping) or entry.get("subresource"):
            continue
        manager, fields = entry.get("manager"), entry.get("fieldsV1")
        writes_content = isinstance(fields, Mapping) and any(f in fields for f in CONTENT_FIELDS)
        if isinstance(manager, str) and manager != ours and writes_content:
            found.add(manager)
    return sorted(found)


def _zone_to_object(zone: Zone) -> dict[str, Any]:
    out: dict[str, Any] = {"name": zone.name, "type": zone.type}
    if zone.parent:
        out["parent"] = zone.parent
    if zone.costs:
        out["costs"] = [{"name": c.name, "value": c.value} for c in zone.costs]
    if zone.attributes:
        out["attributes"] = [{"name": a.name, "value": a.value} for a in zone.attributes]
    out["resources"] = [
        {
            "name": r.name,
            "capacity": str(r.capacity),
            "allocatable": str(r.allocatable),
            "available": str(r.available),
        }
        for r in zone.resources
    ]
    return out


class _Metadata(msgspec.Struct, frozen=True):
    name: str


class _Object(msgspec.Struct, frozen=True, rename={"api_version": "apiVersion"}):
    """The NodeResourceTopology object as the API server serves it (the fields read here)."""

    metadata: _Metadata
    api_version: str = API_VERSION
    attributes: tuple[Attribute, ...] | None = None
    zones: tuple[Zone, ...] | None = None
    topology_policies: tuple[str, ...] | None = msgspec.field(default=None, name="topologyPolicies")


def from_object(obj: Any) -> NodeResourceTopology:
    """Parse and check an NRT object; `NrtError` names the first bad field."""
    try:
        wire = convert(obj, _Object)
    except DecodeError as e:
        raise NrtError(str(e) if e.path else f"NodeResourceTopology: {e}") from None
    if not wire.api_version.startswith(GROUP + "/"):
        raise NrtError(f"apiVersion: {wire.api_version!r} is not in group {GROUP}")
    if not wire.metadata.name:
        raise NrtError("metadata.name: must not be empty")
    zones = wire.zones or ()
    nrt = NodeResourceTopology(
        wire.metadata.name, zones, wire.attributes or (), wire.topology_policies or ()
    )
    for key, allowed in ((ATTR_POLICY, POLICIES), (ATTR_SCOPE, SCOPES)):
        value = nrt.attribute(key)
        if value is not None and value not in allowed:
            raise NrtError(f"attributes[{key}]: {value!r} is not one of {', '.join(allowed)}")
    try:
        nrt.vocabulary()
    except VocabularyError as e:
        raise NrtError(f"attributes[{ATTR_RESOURCES}]: {e}") from None
    names = [z.name for z in zones]
    if "" in names:
        raise NrtError(f"zones[{names.index('')}].name: must not be empty")
    if len(set(names)) != len(names):
        raise NrtError("zones: zone names must be unique")
    return nrt
