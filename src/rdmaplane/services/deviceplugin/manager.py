"""The resource manager: one pool's devices, their health and what allocating them means.

Kept apart from the gRPC server (as NVIDIA's k8s-device-plugin does) so it can be tested and
benchmarked without sockets: it takes a `NodeTopology`, answers with plain data, and keeps only
one piece of state, the devices it has announced, so a device that disappears is reported
Unhealthy instead of silently dropped (the kubelet then stops handing it out).

A device the plugin could not hand out is never reported Healthy: whether an HCA is usable is
decided by the one rule the DRA driver applies too (`rdmaplane.core.usability`), which gives a short
reason word and a message, and from there reaches ListAndWatch (Unhealthy), Allocate's refusal,
the log and the agent's metrics alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rdmaplane.adapters.discovery.devnodes import device_nodes
from rdmaplane.core import paths
from rdmaplane.core.errors import RdmaplaneError
from rdmaplane.core.model import Hca, NodeTopology, Port
from rdmaplane.core.nccl import NcclPlanError, nccl_env, rails_env
from rdmaplane.core.selectors import compute_ports
from rdmaplane.core.settings.deviceplugin import Pool
from rdmaplane.core.usability import (
    DEV_DIR,
    DEVICE_GONE,
    NO_NCCL_PLAN,
    NO_VERBS_DEVICE,
    Unusable,
    plan_failure,
    why_unusable,
)
from rdmaplane.services.deviceplugin.policy.alloc import Candidate, preferred_allocation


@dataclass(frozen=True, slots=True)
class PluginDevice:
    """One device as the kubelet sees it: an HCA (exclusive) or a slot of the pool (shared)."""

    id: str
    healthy: bool
    numa_nodes: tuple[int, ...] = ()  # empty when unknown: the kubelet then ignores NUMA
    hcas: tuple[str, ...] = ()
    problem: Unusable | None = None  # why it is unhealthy


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class ContainerAllocation:
    """What a container gets: device node paths (the node's real /dev paths), env, CDI names.

    One object per grant, kept until the next update and compared by identity: the gRPC
    server keeps its encoded answer beside it for as long as the grant lives."""

    device_nodes: tuple[str, ...]
    envs: dict[str, str]
    cdi_devices: tuple[str, ...] = ()


class AllocateError(RdmaplaneError):
    """An allocation the plugin refuses; `kind` picks the gRPC status."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "not_found" | "unhealthy" | "plan"


@dataclass
class _Member:
    hca: Hca
    ports: list[Port] = field(default_factory=list)
    fault: str | None = None  # judged outside the plugin (the agent's error counters)
    unusable: Unusable | None = None  # set by `ResourceManager._judge`

    @property
    def up_ports(self) -> list[Port]:
        return [p for p in self.ports if p.is_up]

    @property
    def rate_gbps(self) -> float:
        return sum(p.rate_gbps or 0.0 for p in self.up_ports)


def device_id(hca: Hca) -> str:
    """Stable across reboots: the PCI address; software devices have only their name."""
    return hca.pci.address if hca.pci else hca.name


class ResourceManager:
    """The devices of one pool on the current topology."""

    def __init__(
        self, pool: Pool, *, dev_root: str = paths.DEV, cdi_kind: str | None = None
    ) -> None:
        self.pool = pool
        self.dev_root = dev_root
        self.cdi_kind = cdi_kind
        self.topo = NodeTopology()
        self._faults: Mapping[str, str] = {}
        self._rails: Mapping[str, int] = {}  # HCA name → its rail, where the fabric says
        self._nodes: frozenset[str] = frozenset()  # what <dev_root>/infiniband holds
        self._members: dict[str, _Member] = {}  # by HCA name
        self._devices: dict[str, PluginDevice] = {}  # by device ID, everything ever announced
        self._granted: dict[tuple[str, ...], ContainerAllocation] = {}  # by HCA names

    @property
    def shared(self) -> bool:
        return self.pool.shared

    @property
    def devices(self) -> list[PluginDevice]:
        return list(self._devices.values())

    @property
    def members(self) -> list[Hca]:
        return [m.hca for m in self._members.values()]

    def update(
        self,
        topo: NodeTopology,
        faults: Mapping[str, str] | None = None,
        rails: Mapping[str, int] | None = None,
    ) -> bool:
        """Take a new topology, the faults found elsewhere (HCA name → why; the plugin judges
        port states and device nodes itself) and the HCAs' rails where the node's fabric is
        known (for `RDMAPLANE_RAILS`); True when the device list the kubelet sees changed."""
        faults = faults or {}
        self._rails = rails or {}
        self._granted.clear()  # what an allocation grants is worked out again on this state
        self._nodes = device_nodes(self.dev_root)
        members: dict[str, _Member] = {}
        for hca, port in compute_ports(topo, self.pool.selectors):
            member = members.setdefault(hca.name, _Member(hca, fault=faults.get(hca.name)))
            member.ports.append(port)
        self.topo, self._faults = topo, faults
        for member in members.values():
            member.unusable = self._judge(member)
        self._members = members
        fresh = self._shared_slots() if self.shared else self._exclusive()
        devices = dict(self._devices)
        for dev_id, dev in devices.items():
            if dev_id not in fresh:
                gone = Unusable(DEVICE_GONE, f"{', '.join(dev.hcas) or dev_id}: device is gone")
                fresh[dev_id] = PluginDevice(dev_id, False, dev.numa_nodes, dev.hcas, gone)
        changed = fresh != devices
        self._devices = dict(sorted(fresh.items()))
        return changed

    def recheck(self) -> bool:
        """Look at the device nodes again (a driver loaded late, a mount fixed); True when the
        device list the kubelet sees changed. One directory listing when nothing did."""
        if device_nodes(self.dev_root) == self._nodes:
            return False
        return self.update(self.topo, self._faults, self._rails)

    def _judge(self, m: _Member) -> Unusable | None:
        """Whether an HCA can be handed out, and if not why (`usability.why_unusable`: its
        selected ports, the pool's NCCL plan and mode, the device nodes, a reported fault)."""
        return why_unusable(
            self.topo,
            m.hca,
            m.ports,
            self.pool.nccl,
            device_nodes=self._nodes,
            dev_root=self.dev_root,
            fault=m.fault,
            shared=self.shared,
        )

    def _exclusive(self) -> dict[str, PluginDevice]:
        out = {}
        for m in self._members.values():
            numa = (m.hca.numa,) if m.hca.numa is not None else ()
            dev_id = device_id(m.hca)
            healthy = m.unusable is None
            out[dev_id] = PluginDevice(dev_id, healthy, numa, (m.hca.name,), m.unusable)
        return out

    def _shared_slots(self) -> dict[str, PluginDevice]:
        if not self._members:
            return {}
        numa = tuple(sorted({n for m in self._members.values() if (n := m.hca.numa) is not None}))
        hcas = tuple(self._members)
        problems = [m.unusable for m in self._members.values() if m.unusable]
        healthy = len(problems) < len(self._members)
        reasons = sorted({p.reason for p in problems})
        problem = (
            None
            if healthy
            else Unusable(
                reasons[0] if len(reasons) == 1 else "+".join(reasons),
                "; ".join(p.message for p in problems),
            )
        )
        prefix = self.pool.resource_name.rsplit("/", 1)[-1][:50]
        return {
            f"{prefix}-{i:04d}": PluginDevice(f"{prefix}-{i:04d}", healthy, numa, hcas, problem)
            for i in range(self.pool.slots)
        }

    # --- GetPreferredAllocation
    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """The preferred `size` of `available` (see `alloc`); slots are all alike."""
        candidates = [self._candidate(i) for i in dict.fromkeys(available)]
        return preferred_allocation(candidates, must_include, size)

    def _candidate(self, dev_id: str) -> Candidate:
        dev = self._devices.get(dev_id)
        member = self._members.get(dev.hcas[0]) if dev and dev.hcas and not self.shared else None
        if dev is None or member is None:
            return Candidate(dev_id, healthy=dev.healthy if dev else False)
        return Candidate(
            dev_id, member.hca.numa, member.hca.pcie_root, dev.healthy, member.rate_gbps
        )

    # --- Allocate
    def allocate(self, ids: Sequence[str]) -> ContainerAllocation:
        """Device nodes, env and CDI names for one container's devices. Worked out once per
        set of HCAs until the next update: every slot of a shared pool grants the same."""
        names: dict[str, None] = {}
        for dev_id in ids:
            dev = self._devices.get(dev_id)
            if dev is None:
                known = ", ".join(list(self._devices)[:8]) or "none"
                raise AllocateError(
                    "not_found",
                    f"{self.pool.resource_name}: unknown device ID {dev_id!r} (known: {known})",
                )
            if not dev.healthy:
                raise AllocateError(
                    "unhealthy",
                    f"{self.pool.resource_name}: device {dev_id} is unhealthy: {dev.problem}",
                )
            names.update(dict.fromkeys(dev.hcas))
        key = tuple(names)
        if key not in self._granted:
            self._granted[key] = self._grant(key)
        return self._granted[key]

    def _grant(self, names: tuple[str, ...]) -> ContainerAllocation:
        members = [self._members[n] for n in names]
        if self.shared:  # a slot grants the pool's HCAs it can: a device node, a plan
            members = [m for m in members if not _cannot_be_granted(m)]
        envs = self._envs(members)
        if self.cdi_kind:
            cdi = tuple(f"{self.cdi_kind}={m.hca.name}" for m in members)
            return ContainerAllocation((), envs, cdi)
        return ContainerAllocation(self._device_nodes(members), envs)

    def _envs(self, members: list[_Member]) -> dict[str, str]:
        ports = [(m.hca, p) for m in members for p in m.up_ports]
        try:
            envs = dict(nccl_env(self.topo, ports, self.pool.nccl))
        except NcclPlanError as e:
            raise AllocateError("plan", f"{plan_failure([m.hca for m in members])}: {e}") from e
        return envs | rails_env(envs, self._rails)

    def _device_nodes(self, members: list[_Member]) -> tuple[str, ...]:
        """Each HCA's verbs node (there: `_judge` saw it), its ports' umad/issm nodes that
        exist, and rdma_cm."""
        nodes = [n for m in members for n in _node_names(m) if self._present(n)]
        if self._present("rdma_cm"):
            nodes.append("rdma_cm")
        return tuple(f"{DEV_DIR}/{n}" for n in nodes)

    def _present(self, name: str | None) -> bool:
        return name is not None and name in self._nodes

    def cdi_spec(self) -> dict[str, object]:
        """A CDI spec naming every member HCA's device nodes (written when CDI is on)."""
        devices = []
        for m in self._members.values():
            nodes = _node_names(m)
            devices.append(
                {
                    "name": m.hca.name,
                    "containerEdits": {
                        "deviceNodes": [
                            {"path": f"{DEV_DIR}/{n}", "permissions": "rw"}
                            for n in nodes
                            if self._present(n)
                        ]
                    },
                }
            )
        edits = [{"path": f"{DEV_DIR}/rdma_cm", "permissions": "rw"}]
        return {
            "cdiVersion": "0.6.0",
            "kind": self.cdi_kind,
            "devices": devices,
            "containerEdits": {"deviceNodes": edits if self._present("rdma_cm") else []},
        }


def _node_names(m: _Member) -> list[str | None]:
    return [m.hca.uverbs, *(n for p in m.ports for n in (p.umad, p.issm))]


def _cannot_be_granted(m: _Member) -> bool:
    return m.unusable is not None and m.unusable.reason in (NO_VERBS_DEVICE, NO_NCCL_PLAN)
