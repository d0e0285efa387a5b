"""The published contract between the node agent and the scheduler extender.

A node's GPU/RDMA topology travels as an upstream-compatible `NodeResourceTopology` object
(`topology.node.k8s.io/v1alpha2`, cluster-scoped, named after the node):

- top-level `attributes`: `topologyManagerPolicy`, `topologyManagerScope` (the kubelet's
  settings) and `rdmaplane.io/accounted-pods`, the sorted `namespace/name` list of pods whose
  devices were subtracted when `available` was computed; the scheduler subtracts any other bound
  pod itself, so two pods decided in a row never both count on the same free devices.
- one zone per NUMA node (`node-<id>`, type `Node`, `costs` = NUMA distances) with
  `capacity/allocatable/available` of `nvidia.com/gpu`, `rdmaplane.io/hca` (exclusive HCAs) and
  `rdmaplane.io/hca-shared` (shared slots); a node whose NUMA is unknown publishes `node-0`.
- below each NUMA zone, one zone per PCIe root complex holding GPUs or HCAs (`pci0000:17`, type
  `PCIeRoot`, `parent: node-<id>`) with the GPUs and exclusive HCAs on that root. Shared slots
  belong to no root (each grants the whole pool), so a root zone states how many of the shared
  pool's HCAs sit on it in the zone attribute `rdmaplane.io/shared-hcas` instead.
- one zone per HCA whose uplink is known (`mlx5_0`, type `HCA`, `parent` its PCIe root zone, or
  its NUMA zone), without resources, with the zone attributes `rdmaplane.io/tier-0-switch` (the
  switch it plugs into), `rdmaplane.io/rail` and, when known, `rdmaplane.io/switch-port`. Readers
  that look only at `Node` zones (the upstream NodeResourceTopology plugin) never see them.

Quantities are strings of integers on the wire. Everything here is pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any, Literal, get_args

from rdmaplane import model
from rdmaplane.errors import InputError
from rdmaplane.selectors import compute_ports

API_VERSION = "topology.node.k8s.io/v1alpha2"
KIND = "NodeResourceTopology"
GROUP = "topology.node.k8s.io"

GPU = "nvidia.com/gpu"
HCA = "rdmaplane.io/hca"
HCA_SHARED = "rdmaplane.io/hca-shared"

ATTR_POLICY = "topologyManagerPolicy"
ATTR_SCOPE = "topologyManagerScope"
ATTR_ACCOUNTED_PODS = "rdmaplane.io/accounted-pods"
ZONE_ATTR_SHARED_HCAS = "rdmaplane.io/shared-hcas"
ZONE_ATTR_TIER0_SWITCH = "rdmaplane.io/tier-0-switch"
ZONE_ATTR_RAIL = "rdmaplane.io/rail"
ZONE_ATTR_SWITCH_PORT = "rdmaplane.io/switch-port"

ZONE_NUMA = "Node"
ZONE_PCIE_ROOT = "PCIeRoot"
ZONE_HCA = "HCA"

# The kubelet's Topology Manager policies and scopes, as the NRT attributes name them.
TopologyPolicy = Literal["none", "best-effort", "restricted", "single-numa-node"]
TopologyScope = Literal["container", "pod"]
POLICIES: tuple[str, ...] = get_args(TopologyPolicy)
SCOPES: tuple[str, ...] = get_args(TopologyScope)

LABEL_RDMA = "rdmaplane.io/rdma"
LABEL_LINK_LAYER = "rdmaplane.io/link-layer"
LABEL_RATE_GBPS = "rdmaplane.io/rate-gbps"
LABEL_GID_INDEX = "rdmaplane.io/gid-index"
LABEL_RDMA_NETNS = "rdmaplane.io/rdma-netns"
CONDITION_RDMA_READY = "RDMAReady"

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


@dataclass(frozen=True)
class Attribute:
    name: str
    value: str


@dataclass(frozen=True)
class Cost:
    name: str
    value: int


@dataclass(frozen=True)
class ZoneResource:
    name: str
    capacity: int
    allocatable: int
    available: int


@dataclass(frozen=True)
class Zone:
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
        """Shared-pool HCAs on this PCIe root (0 when the attribute is absent or not a number)."""
        value = self.attribute(ZONE_ATTR_SHARED_HCAS)
        return int(value) if value is not None and value.isdigit() else 0


@dataclass(frozen=True)
class Uplink:
    """Where one HCA plugs into the fabric: its tier-0 switch, rail and the switch's port."""

    hca: str
    switch: str
    rail: int | None = None
    switch_port: str = ""
    numa: int = -1  # where the HCA sits on the node, to hang its zone below the right one
    pcie_root: str | None = None


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

    def numa_zones(self) -> tuple[Zone, ...]:
        return tuple(z for z in self.zones if z.type == ZONE_NUMA)

    def pcie_roots(self, numa_zone: str) -> tuple[Zone, ...]:
        return tuple(z for z in self.zones if z.type == ZONE_PCIE_ROOT and z.parent == numa_zone)

    def uplinks(self) -> tuple[Uplink, ...]:
        """The HCA zones' uplinks (tier-0 switch, rail), in zone order; malformed ones skipped."""
        found = []
        for z in self.zones:
            switch, rail = z.attribute(ZONE_ATTR_TIER0_SWITCH), z.attribute(ZONE_ATTR_RAIL)
            if z.type == ZONE_HCA and switch:
                number = int(rail) if rail is not None and rail.isdigit() else None
                port = z.attribute(ZONE_ATTR_SWITCH_PORT) or ""
                found.append(Uplink(z.name, switch, number, port))
        return tuple(found)

    def _policy_and_scope(self) -> tuple[str, str]:
        policy, scope = self.attribute(ATTR_POLICY), self.attribute(ATTR_SCOPE)
        if policy is None and self.topology_policies:
            legacy = _LEGACY_POLICIES.get(self.topology_policies[0], ("none", "container"))
            return legacy if scope is None else (legacy[0], scope)
        return policy or "none", scope or "container"


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
    """One schedulable device as the agent sees it: a GPU, an exclusive HCA or a shared slot."""

    resource: str
    numa: int  # -1 when the kernel does not know
    pcie_root: str | None = None
    healthy: bool = True
    in_use: bool = False


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
    shared_pool_hcas: Iterable[tuple[int, str | None]] = (),
    uplinks: Iterable[Uplink] = (),
) -> NodeResourceTopology:
    """The NRT for a node: NUMA zones with totals, PCIe-root zones below them, HCA zones for
    the HCAs whose uplink is known.

    `shared_pool_hcas` lists (numa, pcie_root) of the HCAs behind the shared slots, so a
    scheduler can tell which roots have a pool NIC next to their GPUs.
    """
    if policy not in POLICIES:
        raise NrtError(f"policy {policy!r} is not one of {', '.join(POLICIES)}")
    if scope not in SCOPES:
        raise NrtError(f"scope {scope!r} is not one of {', '.join(SCOPES)}")
    devs = list(devices)
    pool = list(shared_pool_hcas)
    numa_ids = sorted(
        {max(d.numa, 0) for d in devs} | {max(n, 0) for n, _ in pool} | set(distances or {})
    )
    zones: list[Zone] = []
    for numa in numa_ids:
        here = [d for d in devs if max(d.numa, 0) == numa]
        costs = tuple(
            Cost(numa_zone_name(j), int(v))
            for j, v in sorted((distances or {}).get(numa, {}).items())
        )
        zones.append(Zone(numa_zone_name(numa), ZONE_NUMA, costs=costs, resources=_count(here)))
    for numa in numa_ids:
        here = [d for d in devs if max(d.numa, 0) == numa and d.resource != HCA_SHARED]
        pool_here = [r for n, r in pool if max(n, 0) == numa and r]
        for root in sorted({d.pcie_root for d in here if d.pcie_root} | set(pool_here)):
            on_root = [d for d in here if d.pcie_root == root]
            n_pool = sum(1 for r in pool_here if r == root)
            attrs = (Attribute(ZONE_ATTR_SHARED_HCAS, str(n_pool)),) if n_pool else ()
            zones.append(
                Zone(
                    root,
                    ZONE_PCIE_ROOT,
                    parent=numa_zone_name(numa),
                    attributes=attrs,
                    resources=_count(on_root),
                )
            )
    zones += _uplink_zones(uplinks, {z.name for z in zones})
    attributes = (
        Attribute(ATTR_POLICY, policy),
        Attribute(ATTR_SCOPE, scope),
        Attribute(ATTR_ACCOUNTED_PODS, ",".join(sorted(set(accounted_pods)))),
    )
    return NodeResourceTopology(node_name, tuple(zones), attributes)


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


def _count(devices: list[Device]) -> tuple[ZoneResource, ...]:
    out = []
    for name in (GPU, HCA, HCA_SHARED):
        mine = [d for d in devices if d.resource == name]
        if mine:
            healthy = [d for d in mine if d.healthy]
            free = sum(1 for d in healthy if not d.in_use)
            out.append(ZoneResource(name, len(mine), len(healthy), free))
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


def from_object(obj: Any) -> NodeResourceTopology:
    """Parse and check an NRT object; `NrtError` names the first bad field."""
    if not isinstance(obj, Mapping):
        raise NrtError("NodeResourceTopology: expected an object")
    api_version = obj.get("apiVersion", API_VERSION)
    if not isinstance(api_version, str) or not api_version.startswith(GROUP + "/"):
        raise NrtError(f"apiVersion: {api_version!r} is not in group {GROUP}")
    metadata = _mapping(obj.get("metadata"), "metadata")
    name = _string(metadata.get("name"), "metadata.name")
    if not name:
        raise NrtError("metadata.name: must not be empty")
    attributes = _attributes(obj.get("attributes"), "attributes")
    policies = _list(obj.get("topologyPolicies"), "topologyPolicies")
    topology_policies = tuple(_string(p, f"topologyPolicies[{i}]") for i, p in enumerate(policies))
    zones = tuple(_zone(z, f"zones[{i}]") for i, z in enumerate(_list(obj.get("zones"), "zones")))
    nrt = NodeResourceTopology(name, zones, attributes, topology_policies)
    for key, allowed in ((ATTR_POLICY, POLICIES), (ATTR_SCOPE, SCOPES)):
        value = nrt.attribute(key)
        if value is not None and value not in allowed:
            raise NrtError(f"attributes[{key}]: {value!r} is not one of {', '.join(allowed)}")
    names = [z.name for z in zones]
    if len(set(names)) != len(names):
        raise NrtError("zones: zone names must be unique")
    return nrt


def _zone(obj: Any, where: str) -> Zone:
    zone = _mapping(obj, where)
    name = _string(zone.get("name"), f"{where}.name")
    if not name:
        raise NrtError(f"{where}.name: must not be empty")
    costs = []
    for i, c in enumerate(_list(zone.get("costs"), f"{where}.costs")):
        cost = _mapping(c, f"{where}.costs[{i}]")
        costs.append(
            Cost(
                _string(cost.get("name"), f"{where}.costs[{i}].name"),
                _integer(cost.get("value"), f"{where}.costs[{i}].value"),
            )
        )
    resources = []
    for i, r in enumerate(_list(zone.get("resources"), f"{where}.resources")):
        res = _mapping(r, f"{where}.resources[{i}]")
        at = f"{where}.resources[{i}]"
        resources.append(
            ZoneResource(
                _string(res.get("name"), f"{at}.name"),
                _quantity(res.get("capacity"), f"{at}.capacity"),
                _quantity(res.get("allocatable"), f"{at}.allocatable"),
                _quantity(res.get("available"), f"{at}.available"),
            )
        )
    return Zone(
        name=name,
        type=_string(zone.get("type"), f"{where}.type"),
        parent=_string(zone.get("parent", ""), f"{where}.parent"),
        costs=tuple(costs),
        attributes=_attributes(zone.get("attributes"), f"{where}.attributes"),
        resources=tuple(resources),
    )


def _attributes(obj: Any, where: str) -> tuple[Attribute, ...]:
    out = []
    for i, a in enumerate(_list(obj, where)):
        attr = _mapping(a, f"{where}[{i}]")
        out.append(
            Attribute(
                _string(attr.get("name"), f"{where}[{i}].name"),
                _string(attr.get("value"), f"{where}[{i}].value"),
            )
        )
    return tuple(out)


def _mapping(obj: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise NrtError(f"{where}: expected an object, got {type(obj).__name__}")
    return obj


def _list(obj: Any, where: str) -> list[Any]:
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise NrtError(f"{where}: expected a list, got {type(obj).__name__}")
    return obj


def _string(obj: Any, where: str) -> str:
    if not isinstance(obj, str):
        raise NrtError(f"{where}: expected a string, got {type(obj).__name__}")
    return obj


def _integer(obj: Any, where: str) -> int:
    if isinstance(obj, bool) or not isinstance(obj, int):
        raise NrtError(f"{where}: expected an integer, got {obj!r}")
    return obj


def _quantity(obj: Any, where: str) -> int:
    """A non-negative quantity (int-or-string on the wire), fractions rounded up: ours are whole
    device counts; others (a producer's `cpu: 500m`) are carried, never read."""
    value = parse_quantity(obj)
    if value is None or value < 0:
        raise NrtError(f"{where}: expected a non-negative Kubernetes quantity, got {obj!r}")
    return int(value.to_integral_value(rounding=ROUND_CEILING))


_QUANTITY = re.compile(
    r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:([eE][+-]?[0-9]+)|(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))?$"
)
_SUFFIX = {"m": Decimal("0.001"), "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9)}
_SUFFIX |= {"T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18)}
_SUFFIX |= {
    s: Decimal(2 ** (10 * (i + 1))) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))
}


def parse_quantity(obj: Any) -> Decimal | None:
    """A Kubernetes quantity ("8", "1.5", "500m", "64Gi", "1e3", a JSON integer), else None."""
    if isinstance(obj, bool):
        return None
    if isinstance(obj, int):
        return Decimal(obj) if abs(obj) < 2**63 else None
    if not isinstance(obj, str):
        return None
    match = _QUANTITY.match(obj.strip())
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    value = Decimal(number)
    if exponent:
        if abs(int(exponent[1:])) > 30:  # beyond what Kubernetes stores; never build such a number
            return None
        value = value.scaleb(int(exponent[1:]))
    value = value * _SUFFIX[suffix] if suffix else value
    return value if abs(value) < 2**63 else None
