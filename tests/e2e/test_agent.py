"""The node agent against a real kube-apiserver, with its own least-privilege RBAC.

The agent runs in-process on a copy of the HGX sample tree, embeds the device plugin (serving
on a temporary kubelet folder) and reads allocations from a PodResources stand-in built from the
upstream-compatible stubs. It authenticates as the DaemonSet's ServiceAccount, bound by
`deploy/agent/rbac.yaml`, so a missing permission fails these tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from lightkube import ApiError, AsyncClient, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node

from rdmaplane.adapters.config.base import validate
from rdmaplane.adapters.kube import NodeResourceTopology, async_client
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2 as pr
from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc
from rdmaplane.adapters.kubelet.podresources import PodResourcesClient
from rdmaplane.core import nrt
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.settings.agent import AgentSettings, PublishSettings
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.services.agent.deviceplugin import EmbeddedPlugin
from rdmaplane.services.agent.root import Agent
from tests.e2e.controlplane import KubeCluster, Process, start_apiserver, start_etcd
from tests.integration.kubelet_standin import device_nodes

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "deploy" / "agent" / "rbac.yaml"
DAEMONSET = REPO / "deploy" / "agent" / "daemonset.yaml"
AGENT_USER = "system:serviceaccount:rdmaplane:rdmaplane-agent"
GPU, HCA = "nvidia.com/gpu", "rdmaplane.io/hca"
POLL_S = 0.2


# ---------------------------------------------------------------- fixtures


def install_rbac(cluster: KubeCluster) -> Path:
    """Apply the agent's RBAC; a kubeconfig authenticating as its ServiceAccount."""
    with cluster.client() as client:
        for obj in codecs.load_all_yaml(RBAC.read_text()):
            client.apply(obj, force=True)
    return cluster.kubeconfig_for(AGENT_USER)


@pytest.fixture(scope="module")
def agent_kubeconfig(kube_cluster: KubeCluster, nrt_crd: object) -> Path:
    return install_rbac(kube_cluster)


@pytest.fixture
def workdir(short_dir: Path) -> Path:
    return short_dir


@pytest.fixture
def tree(sample_trees: dict[str, Path], workdir: Path) -> Path:
    return Path(shutil.copytree(sample_trees["hgx-h100-roce"], workdir / "sys", symlinks=True))


class Lister(pr_grpc.PodResourcesListerServicer):
    """The kubelet's PodResources answers: every GPU and HCA allocatable, pods as set."""

    def __init__(self, topo: NodeTopology) -> None:
        self.allocatable = [
            pr.ContainerDevices(resource_name=GPU, device_ids=[g.uuid for g in topo.gpus]),
            pr.ContainerDevices(
                resource_name=HCA, device_ids=[h.pci.address for h in topo.hcas if h.pci]
            ),
        ]
        self.pods: list[pr.PodResources] = []

    def hold(self, namespace: str, name: str, resource: str, ids: list[str]) -> None:
        devices = [pr.ContainerDevices(resource_name=resource, device_ids=ids)]
        container = pr.ContainerResources(name="main", devices=devices)
        self.pods.append(pr.PodResources(name=name, namespace=namespace, containers=[container]))

    async def List(self, request: Any, context: Any) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(pod_resources=self.pods)

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        return pr.AllocatableResourcesResponse(devices=self.allocatable)


@pytest.fixture
async def kubelet(workdir: Path, sample_nodes: dict[str, NodeTopology]) -> AsyncIterator[Lister]:
    """A kubelet folder with a config file and a PodResources stand-in."""
    (workdir / "kubelet").mkdir()
    (workdir / "kubelet/config.yaml").write_text(
        "kind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\n"
        "topologyManagerScope: pod\n"
    )
    socket = workdir / "kubelet/pod-resources/kubelet.sock"
    socket.parent.mkdir()
    lister = Lister(sample_nodes["hgx-h100-roce"])
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    yield lister
    await server.stop(None)


async def create_node(kube: AsyncClient) -> str:
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    await kube.create(Node(metadata=ObjectMeta(name=name)))
    return name


@contextlib.asynccontextmanager
async def running_agent(
    kubeconfig: Path,
    node_name: str,
    tree: Path,
    workdir: Path,
    plugin_config: PluginSettings | None = None,
    **config: Any,
) -> AsyncIterator[Agent]:
    settings: dict[str, Any] = {
        "poll_interval_s": POLL_S,
        "allocation_interval_s": POLL_S,
        **config,  # a caller may set the intervals too (bench/fault.py --poll)
    }
    cfg = AgentSettings(
        node_name=node_name,
        sysfs_root=tree,
        kubelet_dir=workdir / "kubelet",
        dev_root=workdir / "dev",
        metrics_address="127.0.0.1",
        metrics_port=0,
        **settings,
    )
    if not (cfg.dev_root / "infiniband").exists():  # the HCAs' device nodes, or none is healthy
        device_nodes(tree, cfg.dev_root)
    plugin_config = plugin_config or PluginSettings()
    plugin = EmbeddedPlugin(plugin_config, kubelet_dir=cfg.kubelet_dir, dev_root=cfg.dev_root)
    agent = Agent(
        cfg,
        kube=async_client(kubeconfig),
        plugin=plugin,
        allocation_source=PodResourcesClient(cfg.pod_resources_socket, [GPU, *plugin.resources]),
        pools=plugin_config.pools,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await asyncio.wait_for(agent.ready.wait(), 30)
    try:
        yield agent
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def eventually(check: Callable[[], Awaitable[Any]], within_s: float = 30.0) -> Any:
    """Await `check()` until it returns something truthy (API errors count as not yet)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        with contextlib.suppress(ApiError, AssertionError):
            result = await check()
            if result:
                return result
        assert asyncio.get_running_loop().time() < deadline, f"not reached in {within_s} s"
        await asyncio.sleep(0.2)


def condition(node: Node) -> Any:
    conditions = (node.status.conditions if node.status else None) or []
    return next((c for c in conditions if c.type == "RDMAReady"), None)


async def published_nrt(kube: AsyncClient, name: str) -> nrt.NodeResourceTopology:
    obj = await kube.get(NodeResourceTopology, name)
    return nrt.from_object(obj.to_dict())


def zone(topology: nrt.NodeResourceTopology, name: str) -> nrt.Zone:
    return next(z for z in topology.zones if z.name == name)


async def events(kube: AsyncClient, node_name: str) -> list[tuple[str, str]]:
    found = [
        e
        async for e in kube.list(
            Event, namespace="default", fields={"involvedObject.name": node_name}
        )
    ]
    return [(e.reason, e.type) for e in found]


# ---------------------------------------------------------------- tests


async def test_publishes_nrt_labels_annotation_and_condition(
    kube: AsyncClient, agent_kubeconfig: Path, tree: Path, workdir: Path, kubelet: Lister
):
    name = await create_node(kube)
    async with running_agent(agent_kubeconfig, name, tree, workdir) as agent:
        topology = await eventually(lambda: published_nrt(kube, name))
        assert (topology.policy, topology.scope) == ("single-numa-node", "pod")
        assert [z.name for z in topology.numa_zones()] == ["node-0", "node-1"]
        for numa in ("node-0", "node-1"):
            assert zone(topology, numa).resource(GPU) == nrt.ZoneResource(GPU, 4, 4, 4)
        # the default pool takes every HCA: 8 compute NICs and the storage bond (NUMA 0)
        assert zone(topology, "node-0").resource(HCA) == nrt.ZoneResource(HCA, 5, 5, 5)
        root = zone(topology, "pci0000:15")
        assert (root.type, root.parent, root.available(GPU), root.available(HCA)) == (
            "PCIeRoot",
            "node-0",
            1,
            1,
        )
        assert [c.value for c in zone(topology, "node-1").costs] == [21, 10]

        node = await eventually(lambda: _with_condition(kube, name))
        labels = node.metadata.labels
        assert labels["rdmaplane.io/rdma"] == "true"
        assert labels["rdmaplane.io/link-layer"] == "Ethernet"
        assert labels["rdmaplane.io/rate-gbps"] == "400"
        assert labels["rdmaplane.io/gid-index"] == "3"
        assert '"pcieRoot":"pci0000:15"' in node.metadata.annotations["rdmaplane.io/topology"]
        ready = condition(node)
        assert (ready.status, ready.reason) == ("True", "AllDevicesHealthy")

        # Idempotent: nothing changes, nothing is written.
        before = (node.metadata.resourceVersion, await _nrt_version(kube, name))
        writes = agent.metrics.writes.labels("node")._value.get()
        await asyncio.sleep(POLL_S * 10)
        after_node = await kube.get(Node, name)
        assert (after_node.metadata.resourceVersion, await _nrt_version(kube, name)) == before
        assert agent.metrics.writes.labels("node")._value.get() == writes


async def test_restarted_agent_on_an_unchanged_node_writes_nothing(
    kube: AsyncClient, agent_kubeconfig: Path, tree: Path, workdir: Path, kubelet: Lister
):
    name = await create_node(kube)
    async with running_agent(agent_kubeconfig, name, tree, workdir) as agent:
        await asyncio.wait_for(agent.publisher.in_sync.wait(), 30)
    before = ((await kube.get(Node, name)).metadata.resourceVersion, await _nrt_version(kube, name))
    async with running_agent(agent_kubeconfig, name, tree, workdir) as agent:
        await asyncio.wait_for(agent.publisher.in_sync.wait(), 30)
        await asyncio.sleep(POLL_S * 5)
        assert agent.publisher.cycles == 0
    after = ((await kube.get(Node, name)).metadata.resourceVersion, await _nrt_version(kube, name))
    assert after == before


async def _with_condition(kube: AsyncClient, name: str) -> Node | None:
    node = await kube.get(Node, name)
    return node if condition(node) is not None and node.metadata.labels else None


async def _nrt_version(kube: AsyncClient, name: str) -> str:
    return (await kube.get(NodeResourceTopology, name)).metadata.resourceVersion


async def test_port_flap_flips_condition_with_events(
    kube: AsyncClient, agent_kubeconfig: Path, tree: Path, workdir: Path, kubelet: Lister
):
    name = await create_node(kube)
    port = tree / "class/infiniband/mlx5_4/ports/1"

    async def ready_is(status: str) -> Any:
        c = condition(await kube.get(Node, name))
        return c if c is not None and c.status == status else None

    async with running_agent(agent_kubeconfig, name, tree, workdir):
        up = await eventually(lambda: ready_is("True"))
        (port / "state").write_text("1: DOWN\n")
        (port / "phys_state").write_text("3: Disabled\n")
        down = await eventually(lambda: ready_is("False"))
        assert down.reason == "PortDown"
        assert "mlx5_4: port 1 DOWN (DISABLED)" in down.message
        assert down.lastTransitionTime >= up.lastTransitionTime
        topology = await published_nrt(kube, name)
        assert zone(topology, "node-1").resource(HCA).allocatable == 3
        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        await eventually(lambda: ready_is("True"))
        seen = await eventually(lambda: _events_at_least(kube, name, 4))
        # Timestamps have one-second resolution, so only the set is certain, not the order.
        assert sorted(seen) == [
            ("RDMADeviceHealthy", "Normal"),
            ("RDMADeviceUnhealthy", "Warning"),
            ("RDMANotReady", "Warning"),
            ("RDMAReady", "Normal"),
        ]
        for state, phys, ready in (
            ("1: DOWN", "3: Disabled", "False"),
            ("4: ACTIVE", "5: LinkUp", "True"),
        ):
            (port / "state").write_text(state + "\n")
            (port / "phys_state").write_text(phys + "\n")
            await eventually(lambda ready=ready: ready_is(ready))
        counts = await eventually(lambda: _counts_reach(kube, name, 2))
    assert counts == {  # the second flap raised the counts: still four Events
        "RDMADeviceHealthy": 2,
        "RDMADeviceUnhealthy": 2,
        "RDMANotReady": 2,
        "RDMAReady": 2,
    }


async def test_pools_injecting_different_gid_indexes_are_a_warning(
    kube: AsyncClient, agent_kubeconfig: Path, tree: Path, workdir: Path, kubelet: Lister
):
    """Two pools over the same HCAs whose GID policies give different NCCL_IB_GID_INDEX: no
    gid-index label (it would be true for one pool only), RDMAReady says why, an Event too."""
    name = await create_node(kube)
    shared_v1 = {"mode": "shared", "nccl": {"gid": {"roceVersion": 1}}}
    pools = validate(PluginSettings, {"pools": [{}, shared_v1]})

    async def warned() -> list[tuple[str, str]] | None:
        seen = await events(kube, name)
        return seen if ("RDMAGidIndexMismatch", "Warning") in seen else None

    async with running_agent(agent_kubeconfig, name, tree, workdir, plugin_config=pools):
        node = await eventually(lambda: _with_condition(kube, name))
        ready = condition(node)
        assert (ready.status, ready.reason) == ("True", "GidIndexMismatch")
        assert ready.message.endswith(
            "NCCL_IB_GID_INDEX differs between device plugin pools "
            "(rdmaplane.io/hca → 3, rdmaplane.io/hca-shared → 2)"
        )
        assert "rdmaplane.io/gid-index" not in node.metadata.labels
        assert node.metadata.labels["rdmaplane.io/rdma"] == "true"
        await eventually(warned)


async def _counts_reach(kube: AsyncClient, name: str, n: int) -> dict[str, int] | None:
    found = [
        e async for e in kube.list(Event, namespace="default", fields={"involvedObject.name": name})
    ]
    counts = {e.reason: e.count for e in found}
    return counts if min(counts.values()) >= n else None


async def _events_at_least(kube: AsyncClient, name: str, n: int) -> list[tuple[str, str]] | None:
    seen = await events(kube, name)
    return seen if len(seen) >= n else None


async def test_available_follows_pod_resources(
    kube: AsyncClient,
    agent_kubeconfig: Path,
    tree: Path,
    workdir: Path,
    kubelet: Lister,
    sample_nodes: dict[str, NodeTopology],
):
    name = await create_node(kube)
    topo = sample_nodes["hgx-h100-roce"]

    async def node1_free(gpus: int, hcas: int) -> nrt.NodeResourceTopology | None:
        topology = await published_nrt(kube, name)
        z = zone(topology, "node-1")
        return topology if (z.available(GPU), z.available(HCA)) == (gpus, hcas) else None

    # NRT updates leave at most every nrtMinInterval, each after a jitter: short ones here
    publish = PublishSettings(nrt_min_interval_s=2.0, write_jitter_s=0.5)
    async with running_agent(agent_kubeconfig, name, tree, workdir, publish=publish):
        await eventually(lambda: node1_free(4, 4))
        kubelet.hold("ml", "trainer", GPU, [topo.gpus[4].uuid, topo.gpus[5].uuid])
        kubelet.hold("ml", "trainer-nic", HCA, [topo.hca("mlx5_4").pci.address])
        topology = await eventually(lambda: node1_free(2, 3))
        assert topology.accounted_pods == {"ml/trainer", "ml/trainer-nic"}
        assert zone(topology, "pci0000:97").available(GPU) == 0  # GPU 4's root
        assert zone(topology, "node-0").available(GPU) == 4
        kubelet.pods.clear()
        topology = await eventually(lambda: node1_free(4, 4))
        assert topology.accounted_pods == frozenset()


async def test_manifests_are_accepted_by_the_api_server(kube: AsyncClient, agent_kubeconfig: Path):
    for obj in codecs.load_all_yaml(DAEMONSET.read_text()):
        await kube.create(obj, dry_run=True)


# ---------------------------------------------------------------- the API server goes away


class RestartableApiServer:
    """A private etcd + kube-apiserver whose API server can be stopped and started again on the
    same port with the same flags (the shared session cluster must stay up for other tests)."""

    def __init__(self, bin_dir: Path, workdir: Path) -> None:
        self.etcd, etcd_url = start_etcd(bin_dir, workdir)
        self.process, self.cluster = start_apiserver(bin_dir, workdir, etcd_url)
        self.starts = 1

    def stop(self) -> None:
        self.process.stop()

    def start(self) -> None:
        self.starts += 1
        log = self.process.log_path.with_suffix(f".{self.starts}.log")
        self.process = Process.start(self.process.binary, self.process.args, log)
        context = self.cluster.tls_context()

        def ready() -> bool:
            try:
                url = f"{self.cluster.server}/readyz"
                return httpx.get(url, verify=context, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        self.process.wait_ready(ready)

    def close(self) -> None:
        self.process.stop()
        self.etcd.stop()


@pytest.fixture
def restartable(k8s_bin_dir: Path) -> Iterator[RestartableApiServer]:
    with tempfile.TemporaryDirectory(prefix="rdmaplane-e2e-outage-") as tmp:
        server = RestartableApiServer(k8s_bin_dir, Path(tmp))
        try:
            yield server
        finally:
            server.close()


OUTAGE_S = 60.0


async def test_api_server_outage(
    restartable: RestartableApiServer,
    tree: Path,
    workdir: Path,
    kubelet: Lister,
    caplog: pytest.LogCaptureFixture,
):
    """Stopped for 60 s and restarted: the device plugin and /metrics keep serving, the outage
    is logged once per backoff step, and the state (changed meanwhile) is republished."""
    cluster = restartable.cluster
    with cluster.client() as client:
        for crd in codecs.load_all_yaml(
            (REPO / "deploy/crds/noderesourcetopology.yaml").read_text()
        ):
            client.apply(crd, force=True)
    kubeconfig = install_rbac(cluster)
    caplog.set_level(logging.INFO, logger="rdmaplane.services.agent.publisher")
    async with cluster.async_client() as kube:
        await _wait_crd(kube)
        name = await create_node(kube)
        async with running_agent(kubeconfig, name, tree, workdir) as agent:
            await eventually(lambda: published_nrt(kube, name))
            metrics_url = _metrics_url(agent)
            plugin_socket = next((workdir / "kubelet/device-plugins").glob("rdmaplane-*.sock"))

            await asyncio.to_thread(restartable.stop)
            stopped = asyncio.get_running_loop().time()
            port = tree / "class/infiniband/mlx5_6/ports/1"
            (port / "state").write_text("1: DOWN\n")
            (port / "phys_state").write_text("3: Disabled\n")
            served = 0
            while asyncio.get_running_loop().time() - stopped < OUTAGE_S:
                async with httpx.AsyncClient() as http:
                    assert (await http.get(metrics_url)).status_code == 200
                assert await _plugin_lists_devices(plugin_socket) == 9
                served += 1
                await asyncio.sleep(5)
            failures = agent.publisher.failures
            await asyncio.to_thread(restartable.start)

            async def republished() -> Any:
                c = condition(await kube.get(Node, name))
                return c if c is not None and c.status == "False" else None

            down = await eventually(republished, within_s=90)
            assert "mlx5_6: port 1 DOWN" in down.message
            # The condition shows mid-cycle; the NRT and Events follow in the same cycle, and
            # only a finished cycle logs the recovery.
            await asyncio.wait_for(agent.publisher.in_sync.wait(), 30)

    outage_logs = [r for r in caplog.records if "publishing to the API server failed" in r.message]
    attempts = [r.attempt for r in outage_logs]
    assert attempts == list(range(1, len(attempts) + 1))  # one line per backoff step
    delays = [r.retry_in_s for r in outage_logs]
    steps = [min(2.0**i, 60.0) for i in range(len(delays))]  # 1, 2, 4, ... 60 s
    assert all(step / 2 <= d <= step for d, step in zip(delays, steps, strict=True)), delays
    assert len(outage_logs) >= failures >= 5  # 1+2+4+8+16 s < 60 s
    assert any("reachable again" in r.message for r in caplog.records)
    assert served >= 8  # one round every ~5 s; fewer only if the device plugin or /metrics stalled


async def _wait_crd(kube: AsyncClient) -> None:
    async def listed() -> bool:
        async for _ in kube.list(NodeResourceTopology):
            pass
        return True  # the list call did not fail: the CRD is served

    await eventually(listed)


def _metrics_url(agent: Agent) -> str:
    port = agent.http._server.sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


async def _plugin_lists_devices(socket: Path) -> int:
    """Ask the device plugin directly, as the kubelet would: the first ListAndWatch answer."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = dp_grpc.DevicePluginStub(channel)
        stream = stub.ListAndWatch(dp.Empty(), timeout=5)
        first = await stream.read()
        stream.cancel()
        return len(first.devices)
