"""The resource manager: one pool's devices, their health and what allocating them means.

Kept apart from the gRPC server (as NVIDIA's k8s-device-plugin does) so it can be tested and
benchmarked without sockets: it takes a `NodeTopology`, answers with plain data, and keeps only
one piece of state, the devices it has announced, so a device that disappears is reported
Unhealthy instead of silently dropped (the kubelet then stops handing it out).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rdmaplane.config import PoolConfig
from rdmaplane.deviceplugin.alloc import Candidate, preferred_allocation
from rdmaplane.model import Hca, LinkLayer, NodeTopology, Port
from rdmaplane.nccl import PlanError, nccl_env
from rdmaplane.selectors import compute_ports

DEV_DIR = "/dev/infiniband"


@dataclass(frozen=True, slots=True)
class PluginDevice:
    """One device as the kubelet sees it: an HCA (exclusive) or a slot of the pool (shared)."""

    id: str
    healthy: bool
    numa_nodes: tuple[int, ...] = ()  # empty when unknown: the kubelet then ignores NUMA
    hcas: tuple[str, ...] = ()
    problem: str | None = None  # why it is unhealthy


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """What a container gets: device node paths (the node's real /dev paths), env, CDI names."""

    device_nodes: tuple[str, ...]
    envs: dict[str, str]
    cdi_devices: tuple[str, ...] = ()


class AllocateError(Exception):
    """An allocation the plugin refuses; `kind` picks the gRPC status."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "not_found" | "unhealthy" | "plan"


@dataclass
class _Member:
    hca: Hca
    ports: list[Port] = field(default_factory=list)
    fault: str | None = None  # judged outside the plugin (the agent's error counters)

    @property
    def up_ports(self) -> list[Port]:
        return [p for p in self.ports if p.is_up]

    @property
    def problem(self) -> str | None:
        if self.fault:
            return f"{self.hca.name}: {self.fault}"
        if self.up_ports:
            return None
        states = ", ".join(
            f"port {p.number} {p.state.name}/{p.phys_state.name}" for p in self.ports
        )
        return f"{self.hca.name}: no port ACTIVE and LinkUp ({states})"

    @property
    def rate_gbps(self) -> float:
        return sum(p.rate_gbps or 0.0 for p in self.up_ports)


def device_id(hca: Hca) -> str:
    """Stable across reboots: the PCI address; software devices have only their name."""
    return hca.pci.address if hca.pci else hca.name


class ResourceManager:
    """The devices of one pool on the current topology."""

    def __init__(
        self, pool: PoolConfig, *, dev_root: str = "/dev", cdi_kind: str | None = None
    ) -> None:
        self.pool = pool
        self.dev_root = dev_root
        self.cdi_kind = cdi_kind
        self.topo = NodeTopology()
        self._members: dict[str, _Member] = {}  # by HCA name
        self._devices: dict[str, PluginDevice] = {}  # by device ID, everything ever announced
        self._settings = pool.nccl.settings()

    @property
    def shared(self) -> bool:
        return self.pool.mode == "shared"

    @property
    def devices(self) -> list[PluginDevice]:
        return list(self._devices.values())

    @property
    def members(self) -> list[Hca]:
        return [m.hca for m in self._members.values()]

    def update(self, topo: NodeTopology, faults: Mapping[str, str] | None = None) -> bool:
        """Take a new topology and the faults found elsewhere (HCA name → why; the plugin
        judges port states itself); True when the device list the kubelet sees changed."""
        faults = faults or {}
        members: dict[str, _Member] = {}
        for hca, port in compute_ports(topo, self.pool.selectors.selectors()):
            member = members.setdefault(hca.name, _Member(hca, fault=faults.get(hca.name)))
            member.ports.append(port)
        self.topo, self._members = topo, members
        fresh = self._shared_slots() if self.shared else self._exclusive()
        devices = dict(self._devices)
        for dev_id, dev in devices.items():
            if dev_id not in fresh:
                gone = f"{', '.join(dev.hcas) or dev_id}: device is gone"
                fresh[dev_id] = PluginDevice(dev_id, False, dev.numa_nodes, dev.hcas, gone)
        changed = fresh != devices
        self._devices = dict(sorted(fresh.items()))
        return changed

    def _exclusive(self) -> dict[str, PluginDevice]:
        out = {}
        for m in self._members.values():
            numa = (m.hca.numa,) if m.hca.numa is not None else ()
            dev_id = device_id(m.hca)
            out[dev_id] = PluginDevice(dev_id, m.problem is None, numa, (m.hca.name,), m.problem)
        return out

    def _shared_slots(self) -> dict[str, PluginDevice]:
        if not self._members:
            return {}
        numa = tuple(sorted({n for m in self._members.values() if (n := m.hca.numa) is not None}))
        hcas = tuple(self._members)
        problems = [m.problem for m in self._members.values() if m.problem]
        healthy = len(problems) < len(self._members)
        problem = None if healthy else "; ".join(problems)
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

    def pool_gid_index(self) -> tuple[bool, int | None]:
        """(the pool has RoCE ports up, the NCCL_IB_GID_INDEX Allocate gives a pod holding the
        whole pool): the same plan Allocate makes, so the node's gid-index label and the pods'
        environment cannot disagree. None when no one index holds (NCCL ≥ 2.21 then picks by
        address) or no plan is possible."""
        members = list(self._members.values())
        if not any(p.link_layer == LinkLayer.ETHERNET for m in members for p in m.up_ports):
            return False, None
        try:
            index = self._envs(members).get("NCCL_IB_GID_INDEX")
        except AllocateError:
            return True, None
        return True, None if index is None else int(index)

    # --- Allocate
    def allocate(self, ids: Sequence[str]) -> ContainerAllocation:
        """Device nodes, env and CDI names for one container's devices."""
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
        members = [self._members[n] for n in names]
        envs = self._envs(members)
        if self.cdi_kind:
            cdi = tuple(f"{self.cdi_kind}={m.hca.name}" for m in members)
            return ContainerAllocation((), envs, cdi)
        return ContainerAllocation(self._device_nodes(members), envs)

    def _envs(self, members: list[_Member]) -> dict[str, str]:
        ports = [(m.hca, p) for m in members for p in m.up_ports]
        try:
            envs = dict(nccl_env(self.topo, ports, self._settings))
        except PlanError as e:
            names = ", ".join(m.hca.name for m in members)
            raise AllocateError("plan", f"no NCCL plan for {names}: {e}") from e
        return envs

    def _device_nodes(self, members: list[_Member]) -> tuple[str, ...]:
        nodes: list[str] = []
        for m in members:
            uverbs = m.hca.uverbs
            if uverbs is None or not self._present(uverbs):
                raise AllocateError(
                    "unhealthy",
                    f"{m.hca.name}: no verbs device node {DEV_DIR}/{uverbs or 'uverbs?'} "
                    f"(looked under {self.dev_root})",
                )
            nodes.append(uverbs)
            for p in m.ports:
                nodes += [n for n in (p.umad, p.issm) if n and self._present(n)]
        if self._present("rdma_cm"):
            nodes.append("rdma_cm")
        return tuple(f"{DEV_DIR}/{n}" for n in nodes)

    def _present(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.dev_root, "infiniband", name))

    def cdi_spec(self) -> dict[str, object]:
        """A CDI spec naming every member HCA's device nodes (written when CDI is on)."""
        devices = []
        for m in self._members.values():
            nodes = [m.hca.uverbs] + [n for p in m.ports for n in (p.umad, p.issm)]
            devices.append(
                {
                    "name": m.hca.name,
                    "containerEdits": {
                        "deviceNodes": [
                            {"path": f"{DEV_DIR}/{n}", "permissions": "rw"}
                            for n in nodes
                            if n and self._present(n)
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
