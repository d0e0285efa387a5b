"""The fault chain on a real control plane: kube-apiserver, kube-scheduler with the rdmaplane
extender, kube-controller-manager (Job and taint-eviction controllers), KWOK for the nodes' pod
lifecycle, and the rdmaplane agent (with its own RBAC) for node A on a copy of the HGX sample,
fed by a PodResources stand-in that reports what the pods bound to A hold.

The Job is `examples/indexed-job.yaml` (its podFailurePolicy and toleration as written): one
pod per node (8 GPUs, 8 HCAs). A port under the pod on A goes down → the fault notice
(annotation + Event) → after the grace period the RDMAFault condition and an eviction → KWOK
fails the pod → the Job controller replaces it without counting a failure → the scheduler and
the extender place the replacement on the spare node (A has only 7 healthy HCAs left).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from lightkube import AsyncClient
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, Node, Pod

from rdmaplane import nrt
from rdmaplane.agent.config import FaultConfig, PublishConfig
from rdmaplane.agent.service import Agent
from rdmaplane.kube import NodeResourceTopology
from rdmaplane.kubelet.api.podresources.v1 import api_pb2 as pr
from rdmaplane.scheduler.layouts import layout
from tests.e2e.controlplane import KubeCluster, Process, add_kwok_node, write_kubeconfig
from tests.e2e.test_agent import (  # noqa: F401  (fixtures)
    GPU,
    HCA,
    Lister,
    _metrics_url,
    agent_kubeconfig,
    eventually,
    kubelet,
    running_agent,
    tree,
    workdir,
)
from tests.e2e.test_scheduler_extender import _scheduler_config, extender  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_JOB = REPO / "examples" / "indexed-job.yaml"
# Short fault timings: the Job controller's own 10 s pod-recreation backoff dominates anyway.
FAULT = FaultConfig.model_validate(
    {"fatalAfter": "1s", "clearAfter": "4s", "graceSeconds": "2s", "maxEvictionsPerMinute": 4}
)
PUBLISH = PublishConfig(backoff_initial_s=0.2, backoff_max_s=1.0)
CHAIN_S = 120.0  # generous: the machine is shared and loaded
RIG_LABEL = "e2e.rdmaplane.io/rig"  # generous: the machine is shared and loaded


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
    seen: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # pod → its versions

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

    def versions_with(self, test: Callable[[dict[str, Any]], bool]) -> list[str]:
        return sorted(name for name, versions in self.seen.items() if any(map(test, versions)))


def _holding(topo_lister: Lister, pods: list[Pod], node: str) -> list[pr.PodResources]:
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
        rig.lister.pods = _holding(rig.lister, await rig.pods(), rig.a)
        await asyncio.sleep(0.1)


async def _record(rig: Rig) -> None:
    """Every version of every pod, from a watch (an evicted pod without a finalizer is gone
    within milliseconds; its versions show what happened)."""
    async for _, pod in rig.kube.watch(Pod, namespace=rig.namespace):
        assert pod.metadata is not None and pod.metadata.name is not None
        rig.seen.setdefault(pod.metadata.name, []).append(pod.to_dict())


async def _start_job(rig: Rig) -> str:
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
    agent_kubeconfig: Path,  # noqa: F811
    tree: Path,  # noqa: F811
    workdir: Path,  # noqa: F811
    kubelet: Lister,  # noqa: F811
    start_scheduler: Callable[..., Process],
    extender_url: str,
    **agent_config: Any,
) -> AsyncIterator[tuple[Rig, Agent]]:
    prefix = uuid.uuid4().hex[:5]
    a, b = f"gpu-a-{prefix}", f"gpu-b-{prefix}"
    capacity = {nrt.GPU: "8", nrt.HCA: "8"}
    for name in (a, b):
        await add_kwok_node(kube, name, {RIG_LABEL: prefix}, capacity)
    await kube.create(
        NodeResourceTopology(nrt.to_object(layout("hgx", b, policy="best-effort", scope="pod")))
    )
    start_scheduler(_scheduler_config(extender_url))
    rig = Rig(kube, namespace, a, b, tree, kubelet, extender_url, prefix)
    # 8 GPUs + 8 HCAs span both NUMA nodes of the HGX layout: best-effort admits that.
    config = {
        "fault": FAULT,
        "publish": PUBLISH,
        "topology_manager_policy": "best-effort",
        "topology_manager_scope": "pod",
        **agent_config,
    }
    async with running_agent(agent_kubeconfig, a, tree, workdir, **config) as agent:
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


async def _extender_knows(url: str, node: str) -> None:
    async def known() -> bool:
        async with httpx.AsyncClient() as client:
            reply = await client.get(f"{url}/debug/nodes/{node}")
        return reply.status_code == 200

    await eventually(known, CHAIN_S)


async def _add_spare(rig: Rig) -> str:
    c = f"gpu-c-{uuid.uuid4().hex[:5]}"
    await add_kwok_node(rig.kube, c, {RIG_LABEL: rig.label}, {nrt.GPU: "8", nrt.HCA: "8"})
    await rig.kube.create(
        NodeResourceTopology(nrt.to_object(layout("hgx", c, policy="best-effort", scope="pod")))
    )
    await _extender_knows(rig.extender, c)
    return c


def _condition(version: dict[str, Any], type_: str) -> dict[str, Any] | None:
    conditions = version.get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_ and c["status"] == "True"), None)


async def _metric(agent: Agent, name: str, **labels: str) -> float:
    """The sum of a metric's samples that carry `labels`, scraped from the agent's /metrics
    (the agent serves it on this event loop: never a blocking request here)."""
    async with httpx.AsyncClient() as client:
        body = (await client.get(_metrics_url(agent), timeout=10)).text
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith(name + "{") and all(w in line for w in wanted)
    )


# ---------------------------------------------------------------- tests


async def test_port_down_notice_condition_eviction_replacement(
    kube: AsyncClient,
    namespace: str,
    agent_kubeconfig: Path,  # noqa: F811
    tree: Path,  # noqa: F811
    workdir: Path,  # noqa: F811
    kubelet: Lister,  # noqa: F811
    start_scheduler: Callable[..., Process],
    extender: str,  # noqa: F811
    controller_manager: Process,
    kwok: Process,
):
    async with fault_rig(
        kube, namespace, agent_kubeconfig, tree, workdir, kubelet, start_scheduler, extender
    ) as (rig, agent):
        job = await _start_job(rig)
        placed = await placed_on(rig, {rig.a, rig.b})
        victim = next(p for p, n in placed.items() if n == rig.a)
        spare = await _add_spare(rig)

        rig.port("mlx5_3", up=False)

        now_placed = await placed_on(rig, {spare, rig.b})
        assert victim not in now_placed

        # The victim's recorded versions: notice, condition, then the eviction.
        notice = [
            v
            for v in rig.seen[victim]
            if "rdmaplane.io/fault" in (v["metadata"].get("annotations") or {})
        ]
        assert notice, "no fault notice annotation"
        fault = json.loads(notice[0]["metadata"]["annotations"]["rdmaplane.io/fault"])
        assert (fault["hca"], fault["port"], fault["class"]) == ("mlx5_3", 1, "fatal")
        assert fault["reason"] == "port 1 DOWN (DISABLED)" and fault["since"].endswith("Z")
        rdma_fault = next(c for v in rig.seen[victim] if (c := _condition(v, "RDMAFault")))
        assert "mlx5_3 port 1 fatal" in rdma_fault["message"]
        disruption = next(c for v in rig.seen[victim] if (c := _condition(v, "DisruptionTarget")))
        assert disruption["reason"] == "EvictionByEvictionAPI"
        reasons = {e.reason for e in await rig.events("RDMAFault")} | {
            e.reason for e in await rig.events("RDMAFaultEviction")
        }
        assert reasons == {"RDMAFault", "RDMAFaultEviction"}

        status = (await kube.get(Job, job, namespace=namespace)).status
        assert status is not None and not status.failed  # Ignored: no failure counted
        acted = await _metric(agent, "rdmaplane_agent_fault_decisions_total", verb="act")
        assert acted == 1


async def test_flapping_port_evicts_at_most_once(
    kube: AsyncClient,
    namespace: str,
    agent_kubeconfig: Path,  # noqa: F811
    tree: Path,  # noqa: F811
    workdir: Path,  # noqa: F811
    kubelet: Lister,  # noqa: F811
    start_scheduler: Callable[..., Process],
    extender: str,  # noqa: F811
    controller_manager: Process,
    kwok: Process,
):
    async with fault_rig(
        kube, namespace, agent_kubeconfig, tree, workdir, kubelet, start_scheduler, extender
    ) as (rig, agent):
        await _start_job(rig)
        await placed_on(rig, {rig.a, rig.b})
        await _add_spare(rig)
        # Down and up every 0.3 s for 12 s; the hardware counts each fall in link_downed.
        for n in range(1, 41):
            rig.port("mlx5_5", up=False, link_downed=n)
            await asyncio.sleep(0.15)
            rig.port("mlx5_5", up=True)
            await asyncio.sleep(0.15)
        await asyncio.sleep(5)
        evicted = rig.versions_with(lambda v: _condition(v, "DisruptionTarget") is not None)
        assert len(evicted) <= 1
        assert len(await rig.events("RDMAFaultEviction")) <= 1
        raised = await _metric(agent, "rdmaplane_agent_fault_changes_total", to="fatal")
        assert raised == 1  # one fault for the whole flapping episode


async def test_every_compute_hca_fatal_taints_the_node_until_clear_after(
    kube: AsyncClient,
    namespace: str,
    agent_kubeconfig: Path,  # noqa: F811
    tree: Path,  # noqa: F811
    workdir: Path,  # noqa: F811
    kubelet: Lister,  # noqa: F811
    start_scheduler: Callable[..., Process],
    extender: str,  # noqa: F811
    controller_manager: Process,
    kwok: Process,
):
    async with fault_rig(
        kube, namespace, agent_kubeconfig, tree, workdir, kubelet, start_scheduler, extender
    ) as (rig, _):
        hcas = [f"mlx5_{i}" for i in range(8)]

        async def taint() -> Any:
            node = await kube.get(Node, rig.a)
            taints = (node.spec.taints if node.spec else None) or []
            return next((t for t in taints if t.key == "rdmaplane.io/rdma-unhealthy"), None)

        for hca in hcas[:7]:
            rig.port(hca, up=False)
        await asyncio.sleep(3)  # > fatalAfter: seven fatal HCAs are no reason to taint
        assert await taint() is None
        rig.port(hcas[7], up=False)
        found = await eventually(taint, CHAIN_S)
        assert (found.value, found.effect) == ("8-hcas", "NoExecute")

        # The taint manager acts on it: a pod without the toleration is evicted at once.
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "intolerant", "namespace": namespace},
            "spec": {"nodeName": rig.a, "containers": [{"name": "c", "image": "busybox"}]},
        }
        await kube.create(Pod.from_dict(body))

        async def taint_evicted() -> bool:
            versions = rig.seen.get("intolerant", [])
            return any(
                (c := _condition(v, "DisruptionTarget")) and c["reason"] == "DeletionByTaintManager"
                for v in versions
            )

        await eventually(taint_evicted, CHAIN_S)

        rig.port(hcas[0], up=True)
        await asyncio.sleep(2)  # < clearAfter: still tainted
        assert await taint() is not None
        await eventually(lambda: _absent(taint), CHAIN_S)


async def _absent(check: Callable[[], Any]) -> bool:
    return await check() is None


class Proxy:
    """A TCP relay between the agent and the API server that the test can cut: the node loses
    the API server while the rest of the cluster keeps it."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._links):
            writer.close()
        await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._links |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._links -= {writer, up_writer}


async def test_api_server_away_during_the_fault_then_the_right_action(
    kube: AsyncClient,
    kube_cluster: KubeCluster,
    namespace: str,
    agent_kubeconfig: Path,  # noqa: F811
    tree: Path,  # noqa: F811
    workdir: Path,  # noqa: F811
    kubelet: Lister,  # noqa: F811
    start_scheduler: Callable[..., Process],
    extender: str,  # noqa: F811
    controller_manager: Process,
    kwok: Process,
):
    """While the agent cannot reach the API server, the fault is raised but nothing is done to
    the pod (its view is stale); once it can, the notice and eviction follow."""
    proxy = Proxy(int(kube_cluster.server.rsplit(":", 1)[1]))
    await proxy.open()
    config = yaml.safe_load(await asyncio.to_thread(agent_kubeconfig.read_text))
    user = config["users"][0]["user"]
    via_proxy = write_kubeconfig(
        workdir / "via-proxy.kubeconfig",
        f"https://127.0.0.1:{proxy.port}",
        Path(config["clusters"][0]["cluster"]["certificate-authority"]),
        Path(user["client-certificate"]),
        Path(user["client-key"]),
    )
    async with fault_rig(
        kube, namespace, via_proxy, tree, workdir, kubelet, start_scheduler, extender
    ) as (rig, agent):
        await _start_job(rig)
        placed = await placed_on(rig, {rig.a, rig.b})
        victim = next(p for p, n in placed.items() if n == rig.a)
        await _add_spare(rig)
        await asyncio.wait_for(agent.publisher.in_sync.wait(), CHAIN_S)

        await proxy.cut()
        rig.port("mlx5_2", up=False)
        await eventually(lambda: _raised(agent), CHAIN_S)
        await eventually(lambda: _held(agent), CHAIN_S)
        await asyncio.sleep(FAULT.grace_seconds + 3)  # past the grace period: would have acted
        pod = await kube.get(Pod, victim, namespace=namespace)
        assert pod.metadata is not None and pod.metadata.deletionTimestamp is None
        assert "rdmaplane.io/fault" not in (pod.metadata.annotations or {})

        await proxy.open()
        await eventually(lambda: _evicted(rig), CHAIN_S)
        assert rig.versions_with(lambda v: _condition(v, "RDMAFault") is not None) == [victim]


async def _evicted(rig: Rig) -> list[str]:
    return rig.versions_with(lambda v: _condition(v, "DisruptionTarget") is not None)


async def _raised(agent: Agent) -> bool:
    return bool(agent.faults.state.faults)


async def _held(agent: Agent) -> bool:
    return await _metric(agent, "rdmaplane_agent_fault_decisions_total", outcome="held") > 0
