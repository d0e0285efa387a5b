"""The fault chain's test rig, shared by tests/e2e/test_faults.py and bench/fault.py.

Two (or three) KWOK nodes: A, for which the rdmaplane agent runs on a copy of the HGX sample
tree with a PodResources stand-in that reports what the pods bound to A hold, with the
credential its DaemonSet pod on A would get (`agent_kubeconfig(A)`: a token bound to that pod,
under the own-node policies when `tests.e2e.nodeaccess.install` put them in); B, and later a
spare C, with static NodeResourceTopology objects (as their agents would publish them). The Job
is examples/indexed-job.yaml: one pod per node (8 GPUs, 8 HCAs). A watch records every version
of every pod in the namespace with the time it arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import yaml
from lightkube import AsyncClient
from lightkube.operators import exists
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import CascadeType

from rdmaplane.adapters.kube import NodeResourceTopology
from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2 as pr
from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc
from rdmaplane.core import nrt
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.names import FAULT_SINCE_LABEL
from rdmaplane.core.settings.agent import FaultSettings, PublishSettings
from rdmaplane.core.settings.scheduler import ExtenderSettings
from rdmaplane.services.agent.root import Agent
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.root import create_app
from rdmaplane.services.scheduler.watch import make_client, watch_all
from tests.e2e.controlplane import KubeCluster, Process, add_kwok_node, delete_if_there
from tests.e2e.test_agent import GPU, HCA, Lister, eventually, running_agent
from tests.e2e.test_scheduler_extender import _scheduler_config
from tests.layouts import layout
from tests.scheduler_helpers import serve

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_JOB = REPO / "examples" / "indexed-job.yaml"
# Short fault timings: the Job controller's own 10 s pod-recreation backoff dominates anyway.
FAULT = FaultSettings(fatal_after_s=1.0, clear_after_s=4.0, grace_s=2.0, max_evictions_per_minute=4)
PUBLISH = PublishSettings(backoff_initial_s=0.2, backoff_max_s=1.0)
CHAIN_S = 120.0  # generous: the machine is shared and loaded
SAMPLE = "hgx-h100-roce"
NOTICE = "rdmaplane.io/fault"
RIG_LABEL = "e2e.rdmaplane.io/rig"  # this rig's nodes; the session cluster has others


# ---------------------------------------------------------------- the rig


@dataclass
class Rig:
    kube: AsyncClient
    namespace: str
    a: str  # the node the agent speaks for
    b: str
    tree: Path
    lister: Lister
    extender: str
    label: str
    nodes: list[str] = field(default_factory=list)  # this rig's, deleted at the end
    jobs: list[str] = field(default_factory=list)
    # pod → its versions, each with the (monotonic) time the watch delivered it
    seen: dict[str, list[tuple[float, dict[str, Any]]]] = field(default_factory=dict)

    def port(self, hca: str, up: bool, link_downed: int | None = None) -> None:
        """Change a port the way the kernel shows it in sysfs."""
        base = self.tree / f"class/infiniband/{hca}/ports/1"
        (base / "state").write_text("4: ACTIVE\n" if up else "1: DOWN\n")
        (base / "phys_state").write_text("5: LinkUp\n" if up else "3: Disabled\n")
        if link_downed is not None:
            (base / "counters/link_downed").write_text(f"{link_downed}\n")

    async def pods(self) -> list[Pod]:
        return [p async for p in self.kube.list(Pod, namespace=self.namespace)]

    async def events(self, reason: str) -> list[Event]:
        found = self.kube.list(Event, namespace=self.namespace, fields={"reason": reason})
        return [e async for e in found]

    def versions(self, pod: str) -> list[dict[str, Any]]:
        return [v for _, v in self.seen.get(pod, [])]

    def versions_with(self, test: Callable[[dict[str, Any]], bool]) -> list[str]:
        """The pods that had a version passing `test`."""
        return sorted(name for name in self.seen if any(map(test, self.versions(name))))

    def first(self, test: Callable[[dict[str, Any]], bool], pod: str | None = None) -> float | None:
        """When the first version passing `test` arrived (of `pod`, or of any pod)."""
        names = [pod] if pod is not None else list(self.seen)
        times = [t for n in names for t, v in self.seen.get(n, []) if test(v)]
        return min(times) if times else None


def holding(topo_lister: Lister, pods: list[Pod], node: str) -> list[pr.PodResources]:
    """What the kubelet's PodResources would report on `node`: every GPU and HCA (the pods ask
    for the whole node) for each live pod bound there."""
    gpus = list(topo_lister.allocatable[0].device_ids)
    hcas = list(topo_lister.allocatable[1].device_ids)
    out = []
    for p in pods:
        live = p.status is None or p.status.phase in (None, "Pending", "Running")
        if p.spec is None or p.spec.nodeName != node or not live or p.metadata is None:
            continue
        devices = [
            pr.ContainerDevices(resource_name=GPU, device_ids=gpus),
            pr.ContainerDevices(resource_name=HCA, device_ids=hcas),
        ]
        container = pr.ContainerResources(name="trainer", devices=devices)
        out.append(
            pr.PodResources(
                name=p.metadata.name, namespace=p.metadata.namespace, containers=[container]
            )
        )
    return out


async def _stand_in_kubelet(rig: Rig) -> None:
    """Keep PodResources in step with the pods bound to A."""
    while True:
        rig.lister.pods = holding(rig.lister, await rig.pods(), rig.a)
        await asyncio.sleep(0.1)


async def _record(rig: Rig) -> None:
    """Every version of every pod, from a watch (an evicted pod without a finalizer is gone
    within milliseconds; its versions show what happened)."""
    async for _, pod in rig.kube.watch(Pod, namespace=rig.namespace):
        assert pod.metadata is not None and pod.metadata.name is not None
        rig.seen.setdefault(pod.metadata.name, []).append((time.monotonic(), pod.to_dict()))


async def start_job(rig: Rig) -> str:
    docs = list(yaml.safe_load_all(EXAMPLE_JOB.read_text()))
    job = next(d for d in docs if d["kind"] == "Job")
    name = f"train-{uuid.uuid4().hex[:5]}"
    job["metadata"] = {"name": name, "namespace": rig.namespace}
    # The changes: this test's nodes only (the session cluster has others), and no shared
    # storage here (the pods run nothing anyway).
    job["spec"]["template"]["spec"]["nodeSelector"] = {RIG_LABEL: rig.label}
    for volume in job["spec"]["template"]["spec"]["volumes"]:
        if "persistentVolumeClaim" in volume:
            volume.pop("persistentVolumeClaim")
            volume["emptyDir"] = {}
    await rig.kube.create(Job.from_dict(job))
    rig.jobs.append(name)
    return name


async def placed_on(rig: Rig, nodes: set[str]) -> dict[str, str]:
    """Wait until the Job's live pods run on exactly `nodes`; on timeout say where they are."""
    try:
        return await eventually(lambda: _placed(rig, nodes), CHAIN_S)  # type: ignore[no-any-return]
    except AssertionError:
        pods = [
            (p.metadata.name, p.spec.nodeName, p.status.phase if p.status else None)
            for p in await rig.pods()
            if p.metadata and p.spec
        ]
        events = [
            (e.involvedObject.name, e.reason, e.message)
            async for e in rig.kube.list(Event, namespace=rig.namespace)
        ]
        raise AssertionError(f"pods not on {nodes}: {pods}; events: {events}") from None


async def _placed(rig: Rig, nodes: set[str]) -> dict[str, str] | None:
    """pod → node once the Job's live pods run on exactly `nodes`."""
    placed = {}
    for p in await rig.pods():
        running = p.status is not None and p.status.phase == "Running"
        if p.metadata and p.metadata.deletionTimestamp is None and p.spec and running:
            placed[p.metadata.name] = p.spec.nodeName
    return placed if set(placed.values()) == nodes and len(placed) == len(nodes) else None


@contextlib.asynccontextmanager
async def fault_rig(
    kube: AsyncClient,
    namespace: str,
    agent_kubeconfig: Callable[[str], Path],
    tree: Path,
    workdir: Path,
    kubelet: Lister,
    start_scheduler: Callable[..., Process],
    extender_url: str,
    **agent_config: Any,
) -> AsyncIterator[tuple[Rig, Agent]]:
    await _no_faulty_nodes(kube)
    prefix = uuid.uuid4().hex[:5]
    a, b = f"gpu-a-{prefix}", f"gpu-b-{prefix}"
    capacity = {nrt.GPU: "8", nrt.HCA: "8"}
    for name in (a, b):
        await add_kwok_node(kube, name, {RIG_LABEL: prefix}, capacity)
    await kube.create(
        NodeResourceTopology(nrt.to_object(layout("hgx", b, policy="best-effort", scope="pod")))
    )
    start_scheduler(_scheduler_config(extender_url))
    rig = Rig(kube, namespace, a, b, tree, kubelet, extender_url, prefix, nodes=[a, b])
    # 8 GPUs + 8 HCAs span both NUMA nodes of the HGX layout: best-effort admits that.
    config = {
        "fault": FAULT,
        "publish": PUBLISH,
        "topology_manager_policy": "best-effort",
        "topology_manager_scope": "pod",
        **agent_config,
    }
    kubeconfig = await asyncio.to_thread(agent_kubeconfig, a)
    async with running_agent(kubeconfig, a, tree, workdir, **config) as agent:
        # A pod the extender turns away for want of an NRT waits minutes in the scheduler's
        # unschedulable queue (NRTs are no scheduler event): publish first.
        await asyncio.wait_for(agent.publisher.in_sync.wait(), CHAIN_S)
        await _extender_knows(extender_url, a)
        tasks = [asyncio.create_task(_stand_in_kubelet(rig)), asyncio.create_task(_record(rig))]
        try:
            yield rig, agent
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await _clean_up(rig)


async def _no_faulty_nodes(kube: AsyncClient) -> None:
    """The agent's fault budget counts the cluster's faulty nodes: one left by an earlier test
    would open its breaker and hold the action a test waits for. Said here, by name."""
    faulty = kube.list(Node, labels={FAULT_SINCE_LABEL: exists()})
    left = [n.metadata.name async for n in faulty if n.metadata is not None]
    assert not left, f"nodes left faulty ({FAULT_SINCE_LABEL}) by an earlier test: {left}"


async def _clean_up(rig: Rig) -> None:
    """The rig's Jobs, their pods, nodes and NRTs go, so the next rig's scheduler (and the next
    test's extender, which counts every bound pod) sees none of them, nor the next agent's
    fault budget a faulty node of this rig. A Job deleted through the API orphans its pods
    unless asked otherwise, so they are deleted too, at once; so are the agent's pod and any
    other pod bound to the rig's nodes (no pod garbage collector runs). Whatever is already
    gone counts as deleted; the nodes go even when deleting a pod was refused."""
    kube = rig.kube
    try:
        for job in rig.jobs:
            await delete_if_there(
                kube, Job, job, namespace=rig.namespace, cascade=CascadeType.BACKGROUND
            )
        await kube.deletecollection(Pod, namespace=rig.namespace, grace_period=0)
        for node in rig.nodes:
            async for pod in kube.list(Pod, namespace="*", fields={"spec.nodeName": node}):
                assert pod.metadata is not None and pod.metadata.name is not None
                await delete_if_there(
                    kube, Pod, pod.metadata.name, namespace=pod.metadata.namespace, grace_period=0
                )
    finally:
        for node in rig.nodes:
            await delete_if_there(kube, Node, node)
            await delete_if_there(kube, NodeResourceTopology, node)


@contextlib.contextmanager
def serve_extender(cluster: KubeCluster) -> Iterator[str]:
    """The rdmaplane scheduler extender for `cluster`, on loopback; its URL."""
    app = create_app(
        ClusterCache(),
        ExtenderSettings(),
        lambda c, restarted: watch_all(c, lambda: make_client(cluster.kubeconfig), restarted),
    )
    with serve(app) as url:
        yield url


async def _extender_knows(url: str, node: str) -> None:
    async def known() -> bool:
        async with httpx.AsyncClient() as client:
            reply = await client.get(f"{url}/debug/nodes/{node}")
        return reply.status_code == 200

    await eventually(known, CHAIN_S)


async def add_spare(rig: Rig) -> str:
    c = f"gpu-c-{uuid.uuid4().hex[:5]}"
    rig.nodes.append(c)
    await add_kwok_node(rig.kube, c, {RIG_LABEL: rig.label}, {nrt.GPU: "8", nrt.HCA: "8"})
    await rig.kube.create(
        NodeResourceTopology(nrt.to_object(layout("hgx", c, policy="best-effort", scope="pod")))
    )
    await _extender_knows(rig.extender, c)
    return c


@contextlib.asynccontextmanager
async def pod_resources_server(kubelet_dir: Path, topo: NodeTopology) -> AsyncIterator[Lister]:
    """The kubelet's PodResources socket under `kubelet_dir`, answered by a `Lister`."""
    socket = kubelet_dir / "pod-resources" / "kubelet.sock"
    socket.parent.mkdir(parents=True, exist_ok=True)
    lister = Lister(topo)
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield lister
    finally:
        await server.stop(None)


def condition_true(version: dict[str, Any], type_: str) -> dict[str, Any] | None:
    conditions = version.get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_ and c["status"] == "True"), None)


async def absent(check: Callable[[], Any]) -> bool:
    return await check() is None


class Proxy:
    """A TCP relay the test can cut: between the agent and the API server (the node loses the
    API server while the rest of the cluster keeps it), or in front of several extender
    replicas as a Service stands in front of its pods (each connection to the next upstream
    in turn, skipping those that refuse it; none left: the connection is closed)."""

    def __init__(self, *upstream_ports: int) -> None:
        self.upstream_ports = upstream_ports
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._next = 0

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._links):
            writer.close()
        await self._server.wait_closed()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        ports = self.upstream_ports
        for _ in ports:
            port = ports[self._next % len(ports)]
            self._next += 1
            with contextlib.suppress(OSError):
                return await asyncio.open_connection("127.0.0.1", port)
        return None

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await self._connect()
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream
        self._links |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._links -= {writer, up_writer}
