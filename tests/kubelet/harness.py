"""The kubelet's own admission as a judge: the Go harness with real device plugins registered.

`KubeletHarness` is one node: in the Go harness `upstream/kubelet-harness` (built by
`scripts/build-k8s.sh kubelet-harness`), the kubelet's `devicemanager.ManagerImpl` and Topology
Manager from k8s.io/kubernetes for a sample node, policy and scope, serving in a kubelet folder
of its own under /tmp (no root, no mount namespace); and registered with it, from an event loop
in a thread of its own:

- rdmaplane's device plugin exactly as the agent embeds it (`agent.plugin.EmbeddedPlugin`) on the
  sample's materialised sysfs tree: `rdmaplane.io/hca` (exclusive) and `rdmaplane.io/hca-shared`
  (a pool of `shared_slots` slots) over the compute HCAs;
- the GPU plugin stand-in (`gpu_plugin`), `nvidia.com/gpu` with the sample's GPU UUIDs and NUMA
  nodes.

`names` renames those three resources (another GPU vendor, renamed pools): the node then runs
and publishes them under those names, as an agent configured so would.

`admit(pod)` asks the kubelet's Topology Manager to admit a v1 Pod (which allocates, calling the
plugins' GetPreferredAllocation and Allocate as a kubelet does) and returns what it decided,
which devices each container got and the environment the device manager gives it from the
plugins' answers; `delete(uid)` ends a pod. `published()` is the NodeResourceTopology the agent
would publish from those real allocations. Its compute HCAs are cabled rail-optimised (`cabled`:
HCA k on rail k), and the plugin is told their rails as the agent's fabric source tells it.

A node starts its own Go process and event loop, or shares a `Backend` (one Go process, one
plugin loop, one temporary folder) with many others: bench/placement.py runs a cluster so.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rdmaplane.adapters.discovery import samples
from rdmaplane.adapters.discovery.sysfs import read_node
from rdmaplane.core import nrt
from rdmaplane.core.allocation import Allocations, merge_containers
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.selectors import Selectors, compute_ports, natural_key
from rdmaplane.core.settings.deviceplugin import PluginSettings, Pool
from rdmaplane.services.agent.deviceplugin import EmbeddedPlugin
from rdmaplane.services.agent.policy.health import HcaHealth
from rdmaplane.services.agent.policy.inventory import Offered, gpu_ids, nrt_object
from tests.integration.kubelet_standin import device_nodes
from tests.kubelet.gpu_plugin import RESOURCE as GPU
from tests.kubelet.gpu_plugin import Gpu, GpuPluginStandIn

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-k8s.sh"
HCA, HCA_SHARED = nrt.HCA, nrt.HCA_SHARED
RESOURCES = (GPU, HCA, HCA_SHARED)
REPLY_TIMEOUT_S = 120.0  # generous: the machine is shared; a healthy reply takes milliseconds
T = TypeVar("T")


class HarnessMissing(RuntimeError):
    """The harness binary has not been built."""


class HarnessError(RuntimeError):
    """The harness died, did not answer, or answered an error."""


def harness_binary() -> Path:
    """`RDMAPLANE_KUBELET_HARNESS` (set by `make test`), else where the build script puts it."""
    configured = os.environ.get("RDMAPLANE_KUBELET_HARNESS")
    if configured:
        path = Path(configured)
    else:
        out = subprocess.run(
            [str(BUILD_SCRIPT), "kubelet-harness", "--path"], capture_output=True, text=True
        )
        path = Path(out.stdout.strip())
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise HarnessMissing(
            f"kubelet harness {path} missing: run `make k8s-bins` (or "
            f"{BUILD_SCRIPT.relative_to(REPO)} kubelet-harness), or leave this tier out with "
            "-m 'not kubelet'"
        )
    return path


# ---------------------------------------------------------------------------------------------
# The node


@dataclass(frozen=True, slots=True)
class DeviceFact:
    """A device as the node has it: resource, NUMA nodes (empty: unknown), PCIe root."""

    resource: str
    id: str
    numa: tuple[int, ...]
    root: str | None


@dataclass(frozen=True)
class SampleNode:
    """A bundled sample, materialised: its sysfs tree and what discovery reads from it."""

    name: str
    sysfs: Path
    topology: NodeTopology

    @property
    def numa_ids(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.topology.numa_nodes) or (0,)

    def gpus(self) -> list[Gpu]:
        ids = gpu_ids(self.topology)
        return [Gpu(ids[g.index], g.pci.numa) for g in self.topology.gpus]

    def gpu_roots(self) -> dict[str, str | None]:
        ids = gpu_ids(self.topology)
        return {ids[g.index]: g.pci.root for g in self.topology.gpus}


@contextmanager
def sample_node(name: str) -> Iterator[SampleNode]:
    """The sample's sysfs tree in a temporary folder, read back through the real reader."""
    with samples.materialised(name) as root:
        yield SampleNode(name, root, read_node(str(root)))


def plugin_config(
    topology: NodeTopology, shared_slots: int, hca: str = HCA, hca_shared: str = HCA_SHARED
) -> PluginSettings:
    """Both pools over the compute HCAs (the fastest class that is up), as a site's selectors
    would pick them; the storage and front-end NICs stay out."""
    compute = Selectors(hca_names=tuple(sorted({h.name for h, _ in compute_ports(topology)})))
    return PluginSettings(
        pools=[
            Pool(resource_name=hca, selectors=compute),
            Pool(resource_name=hca_shared, mode="shared", slots=shared_slots, selectors=compute),
        ],
        resend_interval=3600,
    )


# ---------------------------------------------------------------------------------------------
# What the kubelet answers


@dataclass(frozen=True, slots=True)
class ContainerAdmission:
    name: str
    kind: str  # init | sidecar | app
    affinity: tuple[int, ...] | None  # the Topology Manager's NUMA affinity (None: any)
    preferred: bool
    devices: Mapping[str, tuple[str, ...]]
    env: Mapping[str, str] = field(default_factory=dict)  # from the plugins' Allocate answers


@dataclass(frozen=True, slots=True)
class Admission:
    uid: str
    admitted: bool
    reason: str
    message: str
    containers: tuple[ContainerAdmission, ...]

    def devices(self, resource: str) -> frozenset[str]:
        """Every device of `resource` the pod holds (init containers' ones included)."""
        return frozenset(i for c in self.containers for i in c.devices.get(resource, ()))


def _admission(reply: Mapping[str, Any]) -> Admission:
    containers = tuple(
        ContainerAdmission(
            c["name"],
            c["kind"],
            tuple(c["affinity"]) if c["affinity"] is not None else None,
            c["preferred"],
            {r: tuple(ids) for r, ids in c["devices"].items()},
            c.get("env") or {},
        )
        for c in reply.get("containers") or ()
    )
    return Admission(
        reply["uid"],
        reply["admitted"],
        reply.get("reason", ""),
        reply.get("message", ""),
        containers,
    )


# ---------------------------------------------------------------------------------------------
# What a node offers


def exclusive(rdma: EmbeddedPlugin, resource: str) -> list[Offered]:
    """The devices of the node's exclusive pool `resource`."""
    return [o for o in rdma.offered() if not o.shared and o.resource == resource]


def cabled(rdma: EmbeddedPlugin, resource: str, topo: NodeTopology) -> list[nrt.Uplink]:
    """The node's compute HCAs (those of its exclusive pool) cabled rail-optimised: HCA k
    (natural name order) into switch `rail-k` on rail k, as `fabric.hca_rails` numbers them
    when nothing says more."""
    offered = sorted({h for o in exclusive(rdma, resource) for h in o.hcas}, key=natural_key)
    hcas = [h for h in (topo.hca(n) for n in offered) if h is not None]
    return [
        nrt.Uplink(h.name, f"rail-{k}", k, "", h.numa if h.numa is not None else -1, h.pcie_root)
        for k, h in enumerate(hcas)
    ]


# ---------------------------------------------------------------------------------------------
# The Go process and the plugins' event loop, each shared by any number of nodes


class HarnessProcess:
    """The Go harness: one process, any number of nodes; one JSON request and reply a line."""

    def __init__(self, workdir: Path) -> None:
        self.log = workdir / "harness.log"
        self._replies: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [str(harness_binary())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
            text=True,
            bufsize=1,
        )
        threading.Thread(target=self._read_replies, daemon=True).start()
        self._reply()  # {"ready": true}

    def _read_replies(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._replies.put(line)
        self._replies.put(None)

    def _reply(self) -> dict[str, Any]:
        try:
            line = self._replies.get(timeout=REPLY_TIMEOUT_S)
        except queue.Empty:
            tail = self.log_tail()
            raise HarnessError(f"no answer within {REPLY_TIMEOUT_S:.0f} s; {tail}") from None
        if line is None:
            raise HarnessError(f"the harness exited; {self.log_tail()}")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise HarnessError(reply["error"])
        return reply

    def request(self, message: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            stdin = self._proc.stdin
            if stdin is None or self._proc.poll() is not None:
                raise HarnessError(f"the harness is not running; {self.log_tail()}")
            stdin.write(json.dumps(message) + "\n")
            stdin.flush()
            return self._reply()

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "last lines of its log:\n" + "\n".join(text[-lines:])

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class PluginHost:
    """An event loop in a thread of its own, serving the device plugins of any number of nodes
    (rdmaplane's embedded plugin and the GPU stand-in, per node)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.served: list[EmbeddedPlugin | GpuPluginStandIn] = []

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = REPLY_TIMEOUT_S) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def serve(
        self,
        node: SampleNode,
        kubelet_dir: Path,
        dev_root: Path,
        gpu_preference: str,
        shared_slots: int,
        names: tuple[str, str, str] = RESOURCES,
    ) -> tuple[EmbeddedPlugin, GpuPluginStandIn]:
        """Start and register a node's plugins (run it on this host's loop: `run(serve(…))`),
        their resources named `names` (GPU, exclusive pool, shared pool)."""
        config = plugin_config(node.topology, shared_slots, *names[1:])
        rdma = EmbeddedPlugin(config, kubelet_dir=kubelet_dir, dev_root=dev_root)
        rdma.update(node.topology, {}, {})
        # the node cabled rail-optimised, as the agent's fabric source would say (`cabled`)
        rdma.update(node.topology, {}, nrt.rail_by_hca(cabled(rdma, names[1], node.topology)))
        plugins = kubelet_dir / "device-plugins"
        gpu = GpuPluginStandIn(node.gpus(), plugins, gpu_preference, resource=names[0])
        await rdma.start()
        self.served.append(rdma)
        await gpu.start()
        self.served.append(gpu)
        return rdma, gpu

    def close(self) -> None:
        if self.thread.is_alive():
            self.run(self._stop())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        self.loop.close()

    async def _stop(self) -> None:
        for served in reversed(self.served):
            await served.stop()
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:  # the streams the kubelets had open
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)


@dataclass
class Backend:
    """What nodes share: a temporary folder, the Go process and the plugins' event loop."""

    workdir: Path
    process: HarnessProcess
    host: PluginHost

    @classmethod
    def start(cls) -> Backend:
        # unix socket paths are limited to 107 bytes: a short folder right under /tmp
        workdir = Path(tempfile.mkdtemp(prefix="kh-", dir="/tmp"))
        return cls(workdir, HarnessProcess(workdir), PluginHost())

    def close(self) -> None:
        self.host.close()  # plugins first: they would take the kubelets' going for a restart
        self.process.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# A node


@dataclass
class KubeletHarness:
    """One node's kubelet admission: a device manager and Topology Manager in the Go process,
    and the node's device plugins registered with them. Without a `backend` it starts (and
    closes) one of its own."""

    node: SampleNode
    policy: str
    scope: str
    gpu_preference: str = "index"
    shared_slots: int = 4
    names: Mapping[str, str] = field(default_factory=dict)  # default name -> the node's
    name: str = "node"
    backend: Backend | None = None
    active: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> pod, admitted
    admissions: dict[str, Admission] = field(default_factory=dict)  # uid -> admission
    facts: dict[str, DeviceFact] = field(default_factory=dict)  # device ID -> fact
    rdma: EmbeddedPlugin | None = None
    gpu: GpuPluginStandIn | None = None
    _own_backend: bool = False

    @property
    def resources(self) -> tuple[str, str, str]:
        """The node's GPU resource, exclusive pool and shared pool."""
        gpu, hca, shared = (self.names.get(r, r) for r in RESOURCES)
        return gpu, hca, shared

    # --- lifecycle
    def start(self) -> KubeletHarness:
        if self.backend is None:
            self.backend, self._own_backend = Backend.start(), True
        kubelet_dir = self.backend.workdir / self.name
        plugin_dir = kubelet_dir / "device-plugins"
        plugin_dir.mkdir(parents=True)
        self.request(
            {
                "op": "start",
                "pluginDir": str(plugin_dir),
                "numa": list(self.node.numa_ids),
                "policy": self.policy,
                "scope": self.scope,
            }
        )
        host = self.backend.host
        dev_root = device_nodes(self.node.sysfs, kubelet_dir / "dev")
        self.rdma, self.gpu = host.run(
            host.serve(
                self.node,
                kubelet_dir,
                dev_root,
                self.gpu_preference,
                self.shared_slots,
                self.resources,
            )
        )
        self.facts = self._expected_devices()
        want = {r: sum(1 for f in self.facts.values() if f.resource == r) for r in self.resources}
        seen = self.request({"op": "wait", "resources": want, "timeoutSeconds": REPLY_TIMEOUT_S})
        self._check_reported_topology(seen["devices"])
        return self

    def close(self) -> None:
        if self._own_backend and self.backend is not None:
            self.backend.close()
            self.backend = None

    def __enter__(self) -> KubeletHarness:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, message: Mapping[str, Any]) -> dict[str, Any]:
        if self.backend is None:
            raise HarnessError("the harness is not started")
        return self.backend.process.request({**message, "node": self.name})

    # --- pods
    def admit(self, pod: Mapping[str, Any]) -> Admission:
        """Admit a v1 Pod (a fresh UID is given when it has none); active when admitted."""
        pod = dict(pod)
        meta = dict(pod.get("metadata") or {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("namespace", "default")
        pod["metadata"] = meta
        admission = _admission(self.request({"op": "admit", "pod": pod}))
        if admission.admitted:
            self.active[admission.uid] = pod
            self.admissions[admission.uid] = admission
        return admission

    def delete(self, uid: str) -> None:
        self.request({"op": "delete", "uid": uid})
        del self.active[uid]
        del self.admissions[uid]

    def reset(self) -> None:
        """End every pod: the node is empty again."""
        for uid in list(self.active):
            self.delete(uid)

    # --- what the node has, and what the agent would publish
    def _expected_devices(self) -> dict[str, DeviceFact]:
        topo = self.node.topology
        facts = {
            g.id: DeviceFact(self.resources[0], g.id, (g.numa,) if g.numa is not None else (), root)
            for g, root in zip(self.node.gpus(), self.node.gpu_roots().values(), strict=True)
        }
        assert self.rdma is not None
        for offered in self.rdma.offered():
            hcas = [h for h in (topo.hca(n) for n in offered.hcas) if h is not None]
            numa = tuple(sorted({h.numa for h in hcas if h.numa is not None}))
            roots = {h.pcie_root for h in hcas}
            root = next(iter(roots)) if len(roots) == 1 and not offered.shared else None
            facts[offered.device_id] = DeviceFact(offered.resource, offered.device_id, numa, root)
        return facts

    def _check_reported_topology(self, seen: Mapping[str, Mapping[str, Sequence[int]]]) -> None:
        """The NUMA nodes the device manager holds per device are the sample's."""
        for resource, devices in seen.items():
            for dev_id, numa in devices.items():
                fact = self.facts.get(dev_id)
                if fact is None or fact.resource != resource or fact.numa != tuple(sorted(numa)):
                    raise HarnessError(
                        f"{resource} device {dev_id}: the device manager has NUMA {sorted(numa)}, "
                        f"the sample says {fact}"
                    )

    def allocations(self) -> Allocations:
        pods = tuple(
            merge_containers(
                pod["metadata"]["namespace"],
                pod["metadata"].get("name", uid),
                [list(c.devices.items()) for c in self.admissions[uid].containers],
            )
            for uid, pod in self.active.items()
        )
        return Allocations(tuple(p for p in pods if p.devices))

    def rail_uplinks(self) -> list[nrt.Uplink]:
        """The node's uplinks as `cabled` (the plugin was fed their rails)."""
        assert self.rdma is not None
        return cabled(self.rdma, self.resources[1], self.node.topology)

    def offered_exclusive(self) -> list[Offered]:
        assert self.rdma is not None
        return exclusive(self.rdma, self.resources[1])

    def rails(self, admission: Admission) -> frozenset[int]:
        """The rails of the exclusive NICs the kubelet gave the pod (by `rail_uplinks`)."""
        return self.rails_of(admission.devices(self.resources[1]))

    def rails_of(self, devices: Iterable[str]) -> frozenset[int]:
        """The rails of these devices of the exclusive pool (by `rail_uplinks`)."""
        rail = nrt.rail_by_hca(self.rail_uplinks())
        hcas = {o.device_id: o.hcas for o in self.offered_exclusive()}
        return frozenset(rail[h] for d in devices for h in hcas.get(d, ()) if h in rail)

    def published(self, uplinks: Sequence[nrt.Uplink] = ()) -> nrt.NodeResourceTopology:
        """The NRT the node agent would publish now, from the kubelet's real allocations (with
        HCA zones for `uplinks`)."""
        assert self.rdma is not None
        health = {h.name: HcaHealth(h.name) for h in self.node.topology.hcas}
        obj = nrt_object(
            self.name,
            self.node.topology,
            self.rdma.offered(),
            health,
            self.allocations(),
            gpu_resource=self.resources[0],
            policy=self.policy,
            scope=self.scope,
            pools=self.rdma.plugin.config.pools,
            uplinks=uplinks,
        )
        return nrt.from_object(obj)
