"""Where a GPU/RDMA pod fits on a node, and how well: the scheduler extender's policy.

Pure: it takes a node's published topology (`rdmaplane.core.nrt`) and a pod's requests and predicts
what the node's kubelet will do with them, following the kubelet's own code (Topology Manager
and device manager, v1.37) and checked against it (tests/kubelet):

- containers are admitted in the kubelet's order (init containers and sidecars, then apps);
  scope `container` asks for a hint per container, scope `pod` one for the pod's effective
  request, which every container then gets;
- per requested device resource, the device manager's hints (`resource_hints`): the sets of
  the NUMA zones holding that resource that have enough free devices (and every device the
  container may reuse from the pod's init containers), preferred when no smaller set has that
  many installed;
- the Topology Manager's merge (`merge_hints`): preferred only when every resource's hint is
  preferred and they are the same zones; `single-numa-node` keeps one-zone hints only,
  `restricted` and `single-numa-node` refuse a hint that is not preferred, `best-effort` admits
  it, `none` gives no affinity at all;
- the device manager's allocation (`allocate`): reusable devices first, then every free device
  inside the affinity before any other.

Which devices inside the affinity is the device plugins' choice; the prediction takes the ones
that pair every GPU with a NIC on its PCIe root where possible (the *best achievable* pairing:
the kubelet itself knows only NUMA), and scores the node 0-10 from that alignment and a packing
term that keeps whole NUMA zones and whole nodes free for large jobs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from rdmaplane.core import nrt as nrtmod
from rdmaplane.core.decoding import DecodeError, convert, parse_quantity
from rdmaplane.core.errors import InputError
from rdmaplane.core.resources import DEFAULT, NONE, Amounts, Vocabulary, is_extended
from rdmaplane.core.settings.scheduler import Weights

MAX_MASK_ZONES = 8  # the Topology Manager's own default limit on NUMA nodes


class RequestError(InputError):
    """A pod whose requests cannot be read; the message names the field."""


@dataclass(frozen=True)
class Policy:
    """How nodes are scored, and the cluster's resource names: what a node's NRT is read with
    when it does not name its own (`nrt.NodeResourceTopology.vocabulary`)."""

    weights: Weights = field(default_factory=Weights)
    vocabulary: Vocabulary = DEFAULT


# ---------------------------------------------------------------------------------------------
# Pod requests

KINDS = ("init", "sidecar", "app")


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container's devices by resource name: a regular init container, a sidecar (an init
    container with `restartPolicy: Always`) or an app container."""

    kind: str
    devices: Amounts
    zero: tuple[str, ...] = ()  # resources its limits name with a count of 0 (see kubelet_hint)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """Extended-resource requests of a pod, as the scheduler and the kubelet count them. Read
    without a vocabulary (a pod is one request on every node); `on` keeps what a node's
    vocabulary names."""

    steps: tuple[ContainerRequest, ...]  # containers naming devices, in the kubelet's order
    total: Amounts  # the effective pod request (max of the app sum and each init container)
    zero: tuple[str, ...] = ()  # resources named by some container, 0 in total

    @classmethod
    def of(cls, *devices: Mapping[str, int]) -> PodRequest:
        """A pod of app containers only."""
        units = [Amounts(d) for d in devices]
        steps = tuple(ContainerRequest("app", d) for d in units if d)
        total = NONE
        for d in units:
            total = total + d
        return cls(steps, total)

    @property
    def containers(self) -> tuple[Amounts, ...]:
        """Devices of the containers that run alongside each other: sidecars and apps."""
        return tuple(s.devices for s in self.steps if s.kind != "init")

    @property
    def init(self) -> tuple[Amounts, ...]:
        return tuple(s.devices for s in self.steps if s.kind == "init")

    @property
    def wants_devices(self) -> bool:
        return bool(self.total)

    def on(self, vocabulary: Vocabulary) -> PodRequest:
        """The request as a node with `vocabulary` sees it: the resources it names alone
        (others are not devices there; kube-scheduler's own fit checks count them)."""
        known = vocabulary.kind
        if all(known(n) for n in self.total) and all(known(n) for n in self.zero):
            return self
        names = vocabulary.names
        steps = []
        for s in self.steps:
            devices, zero = s.devices.only(names), tuple(n for n in s.zero if known(n))
            if devices or zero:
                steps.append(ContainerRequest(s.kind, devices, zero))
        return PodRequest(
            tuple(steps), self.total.only(names), tuple(n for n in self.zero if known(n))
        )


class DeviceCounts(dict[str, int]):
    """A container's `limits` or `requests` as the device manager reads them: the count of
    each extended resource (0 too: naming one matters), whole and non-negative; the other
    resources (cpu, memory) are not devices and are left out."""

    expected = "an object"

    @classmethod
    def from_wire(cls, value: Any) -> DeviceCounts:
        if not isinstance(value, dict):
            raise ValueError("expected an object")
        return cls(
            (name, parse_count(count, f"[{name}]"))
            for name, count in value.items()
            if isinstance(name, str) and is_extended(name)
        )


class ResourceRequirements(msgspec.Struct, frozen=True):
    limits: DeviceCounts | None = None
    requests: DeviceCounts | None = None


class Container(msgspec.Struct, frozen=True, rename="camel"):
    resources: ResourceRequirements | None = None
    restart_policy: str | None = None  # "Always" makes an init container a sidecar


class SchedulingGroup(msgspec.Struct, frozen=True, rename="camel"):
    pod_group_name: str | None = None  # the PodGroup (scheduling.k8s.io) of a gang


class PodSpec(msgspec.Struct, frozen=True, rename="camel"):
    containers: tuple[Container, ...] | None = None
    init_containers: tuple[Container, ...] | None = None
    node_name: str | None = None
    scheduling_group: SchedulingGroup | None = None


class ObjectMeta(msgspec.Struct, frozen=True, rename="camel"):
    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    creation_timestamp: str | None = None
    resource_version: str | None = None  # where a watch resumes


class PodStatus(msgspec.Struct, frozen=True):
    phase: str | None = None


class Pod(msgspec.Struct, frozen=True):
    """A v1 Pod as the extender reads it: who it is, what each container asks for, where it
    is bound; every other field is skipped when decoding."""

    metadata: ObjectMeta = ObjectMeta()
    spec: PodSpec | None = None
    status: PodStatus | None = None

    @property
    def key(self) -> str:
        """namespace/name"""
        return f"{self.metadata.namespace or 'default'}/{self.metadata.name}"


def read_pod(obj: Pod | Mapping[str, Any]) -> Pod:
    """A Pod object (decoded JSON/YAML) through the model; `RequestError` names the field."""
    if isinstance(obj, Pod):
        return obj
    try:
        return convert(obj, Pod, "Pod")
    except DecodeError as e:
        raise RequestError(str(e)) from None


def pod_request(pod: Pod | Mapping[str, Any]) -> PodRequest:
    """The extended-resource requests of a Pod (requests, else limits), in the order the
    kubelet admits containers: init containers and sidecars as listed, then apps."""
    spec = read_pod(pod).spec
    if spec is None:
        raise RequestError("Pod.spec: expected an object")
    steps: list[ContainerRequest] = []
    sidecars = total = NONE
    named: set[str] = set()
    for c in spec.init_containers or ():
        vec, names_here = _container_request(c)
        kind = "sidecar" if c.restart_policy == "Always" else "init"
        steps.append(ContainerRequest(kind, vec, tuple(r for r in names_here if not vec[r])))
        named.update(names_here)
        if kind == "sidecar":
            sidecars = sidecars + vec
        else:
            total = total | (vec + sidecars)
    apps = sidecars
    for c in spec.containers or ():
        vec, names_here = _container_request(c)
        steps.append(ContainerRequest("app", vec, tuple(r for r in names_here if not vec[r])))
        named.update(names_here)
        apps = apps + vec
    total = total | apps
    return PodRequest(
        tuple(s for s in steps if s.devices or s.zero),
        total,
        tuple(r for r in sorted(named) if not total[r]),
    )


def _container_request(container: Container) -> tuple[Amounts, tuple[str, ...]]:
    """The container's extended resources, and which of them it names at all (0 too)."""
    if container.resources is None:
        return NONE, ()
    amounts = {**(container.resources.limits or {}), **(container.resources.requests or {})}
    return Amounts(amounts), tuple(sorted(amounts))  # requests win when both are set


def parse_count(value: Any, where: str) -> int:
    """A device count: a whole, non-negative Kubernetes quantity ("2", 2, "1k")."""
    if type(value) is str and value.isascii() and value.isdigit():
        return int(value)  # the form nearly every pod uses, read without a Decimal
    quantity = parse_quantity(value)
    if quantity is None or quantity < 0 or quantity != quantity.to_integral_value():
        raise RequestError(f"{where}: expected a whole number of devices, got {value!r}")
    return int(quantity)


# ---------------------------------------------------------------------------------------------
# Node state


@dataclass(frozen=True, slots=True)
class RootState:
    """A PCIe root complex: its GPUs and exclusive HCAs by resource (allocatable, free) and the
    HCAs of each shared pool on it.

    The root named "" holds a NUMA zone's devices that no published root claims; it never pairs.
    """

    name: str
    devices: Amounts
    free: Amounts
    pool_hcas: Amounts = NONE
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_hash", hash((self.name, self.devices, self.free, self.pool_hcas))
        )

    def __hash__(self) -> int:  # once: node states are interned, and share their roots
        return self._hash


@dataclass(frozen=True, slots=True)
class ZoneState:
    name: str
    capacity: Amounts  # allocatable: the healthy devices
    free: Amounts
    roots: tuple[RootState, ...]
    pool_hcas: Amounts = NONE  # HCAs of each shared pool in this zone
    installed: Amounts | None = None  # every device the plugins registered, unhealthy ones too
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = (self.name, self.capacity, self.free, self.roots, self.pool_hcas, self.installed)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash

    @property
    def registered(self) -> Amounts:
        """What the kubelet's hints count (its `allDevices`): unhealthy devices too."""
        return self.capacity if self.installed is None else self.installed


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the policy needs of a node; hashable, so decisions can be memoised per state."""

    policy: str
    scope: str
    zones: tuple[ZoneState, ...]
    vocabulary: Vocabulary = DEFAULT  # which of its resources are GPUs, HCA pools, shared pools

    def fresh(self) -> NodeState:
        """The same node with nothing allocated (tells unresolvable from merely full)."""
        zones = tuple(
            replace(z, free=z.capacity, roots=tuple(replace(r, free=r.devices) for r in z.roots))
            for z in self.zones
        )
        return replace(self, zones=zones)


def node_state(
    topology: nrtmod.NodeResourceTopology, vocabulary: Vocabulary = DEFAULT
) -> NodeState:
    """Summarise a published NRT for the policy (zones in NUMA id order), by the names it
    publishes, else `vocabulary`."""
    names = topology.vocabulary(vocabulary)
    rooted = names.rooted
    zones = []
    for zone in sorted(topology.numa_zones(), key=_numa_order):
        cap = Amounts((n, zone.allocatable(n)) for n in names.names)
        installed = Amounts((n, zone.capacity(n)) for n in names.names)
        free = Amounts((n, min(zone.available(n), cap[n])) for n in names.names)
        roots = [
            RootState(
                r.name,
                Amounts((n, r.allocatable(n)) for n in rooted),
                Amounts((n, min(r.available(n), r.allocatable(n))) for n in rooted),
                Amounts(r.pool_hcas(names.shared)),
            )
            for r in sorted(topology.pcie_roots(zone.name), key=lambda r: r.name)
        ]
        rest = RootState(
            "",
            Amounts((n, max(cap[n] - sum(r.devices[n] for r in roots), 0)) for n in rooted),
            Amounts((n, max(free[n] - sum(r.free[n] for r in roots), 0)) for n in rooted),
        )
        if rest.devices:
            roots.append(rest)
        pool = Amounts(
            (s, sum(r.pool_hcas[s] for r in roots) or (1 if cap[s] else 0)) for s in names.shared
        )
        zones.append(ZoneState(zone.name, cap, free, tuple(roots), pool, installed))
    return NodeState(topology.policy, topology.scope, tuple(zones), names)


def _numa_order(zone: nrtmod.Zone) -> tuple[int, str]:
    match = re.fullmatch(r"node-(\d+)", zone.name)
    return (int(match.group(1)) if match else 1 << 30, zone.name)


# ---------------------------------------------------------------------------------------------
# The kubelet's choice of NUMA zones

Roots = tuple[tuple[Amounts, ...], ...]  # per zone, per root: GPUs and exclusive HCAs by name


@dataclass(frozen=True, slots=True)
class Hint:
    """A Topology Manager hint: a set of NUMA zones (a bitmask of zone indices) and whether it
    is preferred."""

    mask: int
    preferred: bool


@dataclass(frozen=True, slots=True)
class UnitPlacement:
    """Where one container's devices land on a node (the kubelet allocates per container, in
    both scopes; under scope `pod` every container gets the pod's affinity)."""

    unit: Amounts
    zones: tuple[int, ...]  # the NUMA affinity the Topology Manager picks; () for none at all
    preferred: bool
    taken: Roots  # devices newly allocated
    shared_taken: Amounts  # shared slots newly allocated (each spans the pool's NUMA zones)
    pcie_pairs: int  # GPUs with a NIC of theirs on the same PCIe root
    numa_pairs: int  # ... on the same NUMA zone (includes pcie_pairs)
    needed: int  # pairs a perfect placement would make
    kind: str = "app"  # init | sidecar | app
    reused: Roots = ()  # devices taken over from the pod's init containers (() for none)
    shared_reused: Amounts = NONE

    @property
    def devices(self) -> Roots:
        """All of the container's GPUs and HCAs: reused and newly taken."""
        return _plus(self.taken, self.reused, 1) if self.reused else self.taken

    @property
    def spilled(self) -> tuple[int, ...]:
        """Zones outside the affinity that devices came from. The Topology Manager can merge
        hints into an affinity narrower than the request (GPUs on {1,3} and NICs on {1,5} give
        {1}, not preferred); the device manager then takes the rest from anywhere."""
        if not self.zones:
            return ()
        return tuple(
            z for z, roots in enumerate(self.devices) if z not in self.zones and any(roots)
        )

    @property
    def aligned(self) -> bool:
        """The kubelet promises this container's NUMA alignment: a preferred affinity, nothing
        outside it."""
        return self.preferred and bool(self.zones) and not self.spilled


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str


@dataclass(frozen=True, slots=True)
class Reusable:
    """Devices a pod's regular init containers hold: the device manager hands them to the
    pod's later containers first, and a later container's hints must cover their zones."""

    roots: Roots
    shared: Amounts = NONE  # slots of each shared pool
    holds_devices: bool = field(init=False, repr=False, compare=False)  # on some root

    def __post_init__(self) -> None:
        object.__setattr__(self, "holds_devices", any(any(zone) for zone in self.roots))

    def count(self, name: str) -> int:
        if not self.holds_devices:
            return self.shared[name]
        return self.shared[name] + sum(held[name] for zone in self.roots for held in zone)

    def mask(self, name: str) -> int:
        """Zones holding reusable devices of `name` (slots: none, they span the pool)."""
        if not self.holds_devices:
            return 0
        return sum(1 << z for z, zone in enumerate(self.roots) if any(h[name] for h in zone))

    def after(self, placed: UnitPlacement) -> Reusable:
        """A regular init container adds what it holds; a sidecar or an app container takes
        what it reused away (upstream: add/removeContainerAllocatedResources)."""
        if placed.kind == "init":
            return Reusable(_plus(self.roots, placed.taken, 1), self.shared + placed.shared_taken)
        if not placed.reused and not placed.shared_reused:
            return self
        roots = _plus(self.roots, placed.reused, -1) if placed.reused else self.roots
        return Reusable(roots, self.shared - placed.shared_reused)


def _no_devices(state: NodeState) -> Roots:
    return tuple(tuple(NONE for _ in z.roots) for z in state.zones)


def _plus(a: Roots, b: Roots, sign: int) -> Roots:
    return tuple(
        tuple(_moved(x, y, sign) for x, y in zip(za, zb, strict=True))
        for za, zb in zip(a, b, strict=True)
    )


def _moved(a: Amounts, b: Amounts, sign: int) -> Amounts:
    return a + b if sign > 0 else a - b


def _mask_sums(values: Sequence[int]) -> list[int]:
    sums = [0] * (1 << len(values))
    for m in range(1, len(sums)):
        low = m & -m
        sums[m] = sums[m ^ low] + values[low.bit_length() - 1]
    return sums


def _mask_maxes(values: Sequence[int]) -> list[int]:
    maxes = [0] * (1 << len(values))
    for m in range(1, len(maxes)):
        low = m & -m
        maxes[m] = max(maxes[m ^ low], values[low.bit_length() - 1])
    return maxes


def _narrowness(mask: int) -> tuple[int, int]:
    """Upstream's `IsNarrowerThan`: fewer NUMA zones, then the lower bitmask."""
    return (mask.bit_count(), mask)


def resource_hints(state: NodeState, name: str, want: int, reusable: Reusable) -> list[Hint]:
    """The device manager's hints for `want` devices of resource `name` (upstream
    `generateDeviceTopologyHints`): every set of the NUMA zones that have devices of it which
    holds all reusable ones and enough of them with the free ones; preferred when no smaller
    set of those zones has that many devices installed (unhealthy ones count: the kubelet counts
    every registered device). Shared slots span their pool's zones: a set touching the pool
    holds every slot."""
    n = len(state.zones)
    combine = _mask_maxes if state.vocabulary.kind(name) == "shared" else _mask_sums
    installed = combine([z.registered[name] for z in state.zones])
    free = combine([z.free[name] for z in state.zones])
    bearing = sum(1 << i for i, z in enumerate(state.zones) if z.registered[name])
    width = bearing.bit_count()
    must, reused = reusable.mask(name), reusable.count(name)
    masks = [m for m in range(1, 1 << n) if not m & ~bearing]
    for m in masks:
        if installed[m] >= want:
            width = min(width, m.bit_count())
    return [
        Hint(m, m.bit_count() == width) for m in masks if not must & ~m and reused + free[m] >= want
    ]


def merge_hints(state: NodeState, hints: Sequence[Sequence[Hint]]) -> Hint:
    """The Topology Manager's merge of the resources' hints (upstream `HintMerger`): a merged
    hint (the AND of one hint per resource) is preferred only when every hint in it is
    preferred and all their zones are equal; the best is the narrowest preferred one, else the
    non-preferred one closest below or at the largest of the resources' narrowest widths
    (`BestNonPreferredAffinityCount`), else the narrowest. A resource with no hint counts as
    `{any, not preferred}`; single-numa-node keeps only preferred one-zone hints first."""
    full = (1 << len(state.zones)) - 1
    if state.policy == "single-numa-node":
        hints = [[h for h in hs if h.preferred and h.mask.bit_count() == 1] for hs in hints]
        if any(not hs for hs in hints):
            return Hint(full, False)
    common: set[int] | None = None
    for hs in hints:
        preferred = {h.mask for h in hs if h.preferred}
        common = preferred if common is None else common & preferred
    if common:
        return Hint(min(common, key=_narrowness), True)
    merged = {full}
    for hs in hints:
        masks = {h.mask for h in hs} or {full}
        merged = {a & m for a in merged for m in masks}
    merged.discard(0)
    if not merged:
        return Hint(full, False)
    target = max((min(h.mask.bit_count() for h in hs) for hs in hints if hs), default=0)
    at = [m for m in merged if m.bit_count() == target]
    below = [m for m in merged if m.bit_count() < target]
    if at:
        return Hint(min(at, key=_narrowness), False)
    if below:
        top = max(m.bit_count() for m in below)
        return Hint(min(m for m in below if m.bit_count() == top), False)
    return Hint(min(merged, key=_narrowness), False)


def kubelet_hint(
    state: NodeState, unit: Amounts, reusable: Reusable, zero: Iterable[str] = ()
) -> tuple[Hint, bool] | None:
    """The affinity the Topology Manager gives a unit and whether it admits it; None under
    policy `none` (no hints, no affinity). Beyond 8 NUMA zones the kubelet refuses to start
    with a policy (`max-allowable-numa-nodes`): treated as no alignment at all.

    A resource named with a count of 0 (`rdmaplane.io/hca: "0"`) still gets hints upstream:
    every set of its zones, the one-zone sets preferred. So it can spoil a merge: 8 GPUs (both
    zones, preferred) next to `hca: 0` (both zones: not preferred) is refused by restricted."""
    if state.policy == "none" or not state.zones:
        return None
    full = (1 << len(state.zones)) - 1
    if len(state.zones) > MAX_MASK_ZONES:
        return Hint(full, False), state.policy not in ("restricted", "single-numa-node")
    named = set(unit) | {n for n in zero if any(z.registered[n] for z in state.zones)}
    hints = [
        resource_hints(state, n, unit[n], reusable) for n in state.vocabulary.names if n in named
    ]
    if not hints:  # no device asked for: the providers have no preference
        return Hint(full, True), True
    best = merge_hints(state, hints)
    admit = best.preferred or state.policy == "best-effort"
    return best, admit


def _misfit_reason(state: NodeState, unit: Amounts, reusable: Reusable | None = None) -> str:
    short = _short_of(state, unit, reusable)
    if short is not None:
        return f"insufficient {short}"
    wants = " + ".join(f"{unit[n]} {n}" for n in state.vocabulary.names if unit[n])
    if state.policy == "single-numa-node":
        return f"single-numa-node: no NUMA zone can hold {wants}"
    if state.policy == "restricted":
        return f"restricted: {wants} cannot be placed on the fewest NUMA zones possible"
    return f"insufficient free devices for {wants}"


@dataclass(slots=True)
class _Pool:
    """Devices of one resource, per zone and root, and what one container took of them."""

    free: list[list[int]]
    took: list[list[int]]

    @classmethod
    def of(cls, counts: Sequence[Sequence[int]]) -> _Pool:
        return cls([list(row) for row in counts], [[0] * len(row) for row in counts])

    def take(self, z: int, i: int, count: int) -> int:
        step = min(self.free[z][i], count)
        self.free[z][i] -= step
        self.took[z][i] += step
        return step

    def take_in_zone(self, z: int, count: int, partners: Sequence[_Pool]) -> int:
        """Up to `count` from zone z, first from roots where the partner kind (HCAs for GPUs,
        GPUs for HCAs) has none free, so roots that can still make a pair stay whole."""
        got = 0
        order = sorted(range(len(self.free[z])), key=lambda i: any(p.free[z][i] for p in partners))
        for i in order:
            got += self.take(z, i, count - got)
        return got


@dataclass(frozen=True, slots=True)
class _Pairing:
    """What one container pairs: its GPU resources with its exclusive HCAs, or (asking for
    shared slots and no exclusive HCA) with the HCAs of its shared pools."""

    gpus: tuple[str, ...]
    hcas: tuple[str, ...]
    pools: tuple[str, ...]  # the shared pools whose HCAs its GPUs pair with

    @classmethod
    def of(cls, vocabulary: Vocabulary, unit: Amounts) -> _Pairing:
        hcas = tuple(n for n in vocabulary.exclusive if unit[n])
        pools = () if hcas else tuple(n for n in vocabulary.shared if unit[n])
        return cls(tuple(n for n in vocabulary.gpus if unit[n]), hcas, pools)

    def near_pool(self, pool_hcas: Amounts) -> bool:
        return any(pool_hcas[p] for p in self.pools)


def _free(state: NodeState) -> Roots:
    return tuple(tuple(r.free for r in z.roots) for z in state.zones)


def _pools(devices: Roots, names: Iterable[str]) -> dict[str, _Pool]:
    return {n: _Pool.of([[held[n] for held in zone] for zone in devices]) for n in names}


def _take_pairs(
    state: NodeState,
    pools: Mapping[str, _Pool],
    need: dict[str, int],
    order: Sequence[int],
    pairing: _Pairing,
) -> Roots:
    """Take GPUs and HCAs from `pools` in the zones in `order`: pairs on one PCIe root first,
    then pairs within a zone, then the rest; `need` goes down by what was taken. With shared
    slots instead of HCAs a GPU pairs with any HCA of the pool, so GPUs on roots with pool HCAs
    go first."""
    vocab = state.vocabulary
    partners = {
        n: [pools[p] for p in (vocab.exclusive if n in vocab.gpus else vocab.gpus)] for n in pools
    }
    for z in order:  # 1. pairs on one PCIe root
        for i, root in enumerate(state.zones[z].roots):
            if not root.name:
                continue
            if pairing.pools and pairing.near_pool(root.pool_hcas):
                for g in pairing.gpus:
                    need[g] -= pools[g].take(z, i, need[g])
            for g in pairing.gpus:
                for h in pairing.hcas:
                    step = min(pools[g].free[z][i], pools[h].free[z][i], need[g], need[h])
                    need[g] -= pools[g].take(z, i, step)
                    need[h] -= pools[h].take(z, i, step)
    for z in order:  # 2. pairs within a NUMA zone
        if pairing.pools and pairing.near_pool(state.zones[z].pool_hcas):
            for g in pairing.gpus:
                need[g] -= pools[g].take_in_zone(z, need[g], partners[g])
        for g in pairing.gpus:
            for h in pairing.hcas:
                pairs = min(sum(pools[g].free[z]), sum(pools[h].free[z]), need[g], need[h])
                need[g] -= pools[g].take_in_zone(z, pairs, partners[g])
                need[h] -= pools[h].take_in_zone(z, pairs, partners[h])
    for z in order:  # 3. whatever is left
        for n in (*pairing.gpus, *pairing.hcas):
            need[n] -= pools[n].take_in_zone(z, need[n], partners[n])
    return tuple(
        tuple(Amounts((n, p.took[z][i]) for n, p in pools.items()) for i in range(len(zone.roots)))
        for z, zone in enumerate(state.zones)
    )


def _plan_zones(state: NodeState, unit: Amounts, reusable: Reusable) -> tuple[int, ...]:
    """Without an affinity the plugins choose; assume the narrowest set of zones that holds
    the container (the best case), for the score only: nothing is promised."""
    n = len(state.zones)
    rooted = [r for r in state.vocabulary.rooted if unit[r]]
    frees = {
        r: _mask_sums(
            [z.free[r] + sum(p[r] for p in reusable.roots[i]) for i, z in enumerate(state.zones)]
        )
        for r in rooted
    }
    for m in sorted(range(1, 1 << n), key=_narrowness):
        if all(frees[r][m] >= unit[r] for r in rooted):
            return tuple(i for i in range(n) if m >> i & 1)
    return tuple(range(n))


def _short_of(state: NodeState, unit: Amounts, reusable: Reusable | None) -> str | None:
    """The first resource the node (free plus the pod's reusable devices) has too few of."""
    for name in state.vocabulary.names:
        if not unit[name]:
            continue
        if state.vocabulary.kind(name) == "shared":
            free = max((z.free[name] for z in state.zones if z.capacity[name]), default=0)
        else:
            free = sum(z.free[name] for z in state.zones)
        if unit[name] > free + (reusable.count(name) if reusable else 0):
            return name
    return None


def _none_healthy(state: NodeState, named: Iterable[str]) -> str | None:
    """Why the kubelet refuses a container that names (a count of 0 too) a resource whose
    devices are all unhealthy: `devicesToAllocate` checks health before the count."""
    for name in named:
        if any(z.registered[name] for z in state.zones) and not any(
            z.capacity[name] for z in state.zones
        ):
            return f"no healthy {name} (every one registered is unhealthy)"
    return None


def allocate(
    state: NodeState,
    step: ContainerRequest,
    affinity: tuple[int, ...],
    preferred: bool,
    reusable: Reusable,
) -> UnitPlacement | Rejection:
    """The devices one container gets (upstream `devicesToAllocate`): its pod's reusable
    devices first, then free ones inside the affinity, and only when those run short the rest
    from other zones. Which ones inside the affinity is up to the device plugins; this takes
    the best achievable pairing (GPU + NIC on one PCIe root, else on one zone)."""
    unit = step.devices
    dead = _none_healthy(state, (*unit, *step.zero))
    if dead is not None:
        return Rejection(dead)
    short = _short_of(state, unit, reusable)
    if short is not None:
        return Rejection(f"insufficient {short}")
    plan = affinity or _plan_zones(state, unit, reusable)
    rest = tuple(z for z in range(len(state.zones)) if z not in plan)
    rooted = state.vocabulary.rooted
    need = {n: unit[n] for n in rooted}
    pairing = _Pairing.of(state.vocabulary, unit)
    reused: Roots = ()  # nothing, unless earlier init containers left devices to hand on
    if reusable.holds_devices:
        reused = _take_pairs(state, _pools(reusable.roots, rooted), need, (*plan, *rest), pairing)
    free = _pools(_free(state), rooted)
    _take_pairs(state, free, need, plan, pairing)  # every aligned device before any other
    taken = _take_pairs(state, free, need, rest, pairing)
    slots = unit.only(state.vocabulary.shared)
    shared_reused = Amounts((s, min(c, reusable.shared[s])) for s, c in slots.items())
    placed = UnitPlacement(
        unit,
        affinity,
        preferred,
        taken,
        slots - shared_reused,
        0,
        0,
        0,
        step.kind,
        reused,
        shared_reused,
    )
    return _with_pairs(state, placed)


def _with_pairs(state: NodeState, p: UnitPlacement) -> UnitPlacement:
    """Count the container's GPU-NIC pairs on one PCIe root and on one NUMA zone."""
    vocab, devices = state.vocabulary, p.devices
    pairing = _Pairing.of(vocab, p.unit)
    gpus = sum(p.unit[n] for n in vocab.gpus)
    hcas = sum(p.unit[n] for n in vocab.exclusive)
    needed = min(gpus, hcas) if hcas else (gpus if pairing.pools else 0)
    pcie = numa = 0
    for z, zone in enumerate(state.zones):
        in_zone = [0, 0]
        for root, held in zip(zone.roots, devices[z], strict=True):
            g, h = sum(held[n] for n in vocab.gpus), sum(held[n] for n in vocab.exclusive)
            in_zone = [in_zone[0] + g, in_zone[1] + h]
            if root.name:
                pcie += _pairs(pairing, g, h, root.pool_hcas)
        numa += _pairs(pairing, in_zone[0], in_zone[1], zone.pool_hcas)
    return replace(p, pcie_pairs=min(pcie, needed), numa_pairs=min(numa, needed), needed=needed)


def _pairs(pairing: _Pairing, gpus: int, hcas: int, pool_hcas: Amounts) -> int:
    """Pairs among `gpus` and `hcas` held in one place (a root, a zone) with `pool_hcas`."""
    if pairing.pools:
        return gpus if pairing.near_pool(pool_hcas) else 0
    return min(gpus, hcas)


def apply(state: NodeState, placement: UnitPlacement) -> NodeState:
    """The node after a placement's devices are taken."""
    return _shift(state, placement, -1)


def release(state: NodeState, placement: UnitPlacement) -> NodeState:
    """The node after a placement's devices are given back."""
    return _shift(state, placement, 1)


def _shift(state: NodeState, placement: UnitPlacement, sign: int) -> NodeState:
    """Shared slots span every zone of their pool, as the NRT counts them."""
    zones = []
    for z, zone in enumerate(state.zones):
        moved = Amounts((s, c) for s, c in placement.shared_taken.items() if zone.capacity[s])
        for held in placement.taken[z]:
            moved = moved + held
        if not moved:  # untouched: the same zone, its hash already known
            zones.append(zone)
            continue
        roots = tuple(
            replace(root, free=_moved(root.free, held, sign)) if held else root
            for root, held in zip(zone.roots, placement.taken[z], strict=True)
        )
        zones.append(replace(zone, roots=roots, free=_moved(zone.free, moved, sign)))
    return replace(state, zones=tuple(zones))


# ---------------------------------------------------------------------------------------------
# Verdict and score


MAX_SCORE = 10  # a node's best score: kube-scheduler's extenderv1.MaxExtenderPriority


@dataclass(frozen=True, slots=True)
class Verdict:
    fits: bool
    unresolvable: bool  # no amount of freeing devices on this node would help
    reason: str  # why it does not fit, or how it fits
    score: int  # 0..MAX_SCORE
    alignment: str  # pcie | numa | cross | none (nothing to align) | "" (does not fit)
    placements: tuple[UnitPlacement, ...] = ()
    state_after: NodeState | None = None


PASS_THROUGH = Verdict(True, False, "pod requests no GPU or RDMA device", 0, "none")


def evaluate(state: NodeState, request: PodRequest, policy: Policy = Policy()) -> Verdict:
    """Can the node hold the pod under its Topology Manager policy, and how well (0-10)?
    Only the resources the node's vocabulary names are its devices."""
    request = request.on(state.vocabulary)
    if not request.wants_devices:
        dead = _none_healthy(state, request.zero)
        return PASS_THROUGH if dead is None else Verdict(False, True, dead, 0, "")
    outcome = place_pod(state, request)
    if isinstance(outcome, Rejection):
        on_empty = place_pod(state.fresh(), request)
        if isinstance(on_empty, Rejection):  # what makes it impossible, not what is in use now
            return Verdict(False, True, on_empty.reason, 0, "")
        return Verdict(False, False, outcome.reason, 0, "")
    placements, after = outcome
    align = _alignment(placements, policy.weights)
    pack = _packing(state, after, request, policy.weights)
    w = policy.weights
    total = w.alignment + w.packing
    score = round(MAX_SCORE * (w.alignment * align + w.packing * pack) / total) if total > 0 else 0
    level = alignment_level(placements)
    return Verdict(
        True,
        False,
        describe(state, placements),
        max(0, min(MAX_SCORE, score)),
        level,
        placements,
        after,
    )


def place_pod(
    state: NodeState, request: PodRequest
) -> tuple[tuple[UnitPlacement, ...], NodeState] | Rejection:
    """Each container's devices and the node afterwards, or why the kubelet refuses the pod.

    As the kubelet admits (upstream topologymanager scopes + devicemanager.Allocate): scope
    `container` asks for a hint per container, in order, each seeing what the ones before took;
    scope `pod` one hint for the pod's effective request, then every container is allocated
    within it. Either way, what regular init containers hold is handed to later containers
    first."""
    request = request.on(state.vocabulary)
    pod_hint: tuple[Hint, bool] | None = None
    if state.scope == "pod":
        pod_hint = kubelet_hint(state, request.total, Reusable(_no_devices(state)), request.zero)
        if pod_hint is not None and not pod_hint[1]:
            return Rejection(_misfit_reason(state, request.total))
    placements = []
    reusable = Reusable(_no_devices(state))
    for step in request.steps:
        if state.scope == "pod":
            decided = pod_hint
        else:
            decided = kubelet_hint(state, step.devices, reusable, step.zero)
        affinity: tuple[int, ...] = ()
        preferred = False
        if decided is not None:
            hint, admit = decided
            if not admit:
                why = _misfit_reason(state, step.devices, reusable)
                return Rejection(_prefix(step) + why)
            affinity = tuple(i for i in range(len(state.zones)) if hint.mask >> i & 1)
            preferred = hint.preferred
        placed = allocate(state, step, affinity, preferred, reusable)
        if isinstance(placed, Rejection):
            return Rejection(_prefix(step) + placed.reason)
        placements.append(placed)
        state = apply(state, placed)
        reusable = reusable.after(placed)
    return tuple(placements), state


def _prefix(step: ContainerRequest) -> str:
    return "" if step.kind == "app" else f"{step.kind} container: "


def _kept(placements: tuple[UnitPlacement, ...]) -> tuple[UnitPlacement, ...]:
    """The containers that run: sidecars and apps (init containers' devices pass to them)."""
    return tuple(p for p in placements if p.kind != "init") or placements


def _unit_alignment(p: UnitPlacement, w: Weights) -> float:
    """pcie when every GPU has a NIC on its root, numa when on its zone; a unit with any GPU
    whose NIC is across zones ranks below every fully NUMA-aligned one."""
    if not p.needed:
        value = w.pcie
    elif p.numa_pairs == p.needed:
        value = w.numa + (w.pcie - w.numa) * p.pcie_pairs / p.needed
    else:
        value = w.cross + (w.numa - w.cross) * p.numa_pairs / p.needed / 2
    return value if p.aligned else value * w.not_preferred


def _alignment(placements: tuple[UnitPlacement, ...], w: Weights) -> float:
    placements = _kept(placements)
    top = max(w.pcie, w.numa, w.cross) or 1.0
    weights = [max(1, p.unit.total()) for p in placements]
    total = sum(_unit_alignment(p, w) * k for p, k in zip(placements, weights, strict=True))
    return total / (sum(weights) * top) if weights else 1.0


def _packing(before: NodeState, after: NodeState, request: PodRequest, w: Weights) -> float:
    r = next(n for n in before.vocabulary.names if request.total[n])
    touched = [
        i
        for i, (b, a) in enumerate(zip(before.zones, after.zones, strict=True))
        if b.free[r] != a.free[r]
    ]
    cap_zones = sum(before.zones[i].capacity[r] for i in touched)
    free_zones = sum(after.zones[i].free[r] for i in touched)
    cap_node = sum(z.capacity[r] for z in before.zones)
    free_node = sum(z.free[r] for z in after.zones)
    zone_fill = 1 - free_zones / cap_zones if cap_zones else 1.0
    node_fill = 1 - free_node / cap_node if cap_node else 1.0
    total = w.zone_fill + w.node_fill
    return (w.zone_fill * zone_fill + w.node_fill * node_fill) / total if total > 0 else 0.0


def alignment_level(placements: tuple[UnitPlacement, ...]) -> str:
    placements = _kept(placements)
    if all(p.needed == 0 for p in placements):
        return "none" if all(p.aligned for p in placements) else "cross"
    if all(p.aligned and p.pcie_pairs == p.needed for p in placements):
        return "pcie"
    if all(p.aligned and p.numa_pairs == p.needed for p in placements):
        return "numa"
    return "cross"


def describe(state: NodeState, placements: Iterable[UnitPlacement]) -> str:
    """One line per node for people: the zones picked and the pairs made."""
    parts = []
    for p in placements:
        zones = ",".join(state.zones[z].name for z in p.zones) or "-"
        pairs = (
            f", {p.pcie_pairs}/{p.needed} PCIe pairs, {p.numa_pairs}/{p.needed} NUMA pairs"
            if p.needed
            else ""
        )
        if not p.zones:
            note = " (no NUMA affinity: policy none, the device plugins choose)"
        elif not p.preferred:
            note = " (affinity not preferred: alignment not promised)"
        else:
            note = ""
        if p.spilled:
            spill = ",".join(state.zones[z].name for z in p.spilled)
            note += f" (kubelet affinity {zones} too small: rest from {spill}, unaligned)"
        parts.append(f"{zones}{pairs}{note}")
    return "; ".join(parts)
