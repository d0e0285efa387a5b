"""The agent in one process on a sample tree: polling, health, metrics over real HTTP,
allocations from a PodResources stand-in. No API server here (see tests/e2e/test_agent.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
from pathlib import Path

import grpc
import httpx
import pytest
import yaml
from kubelet_standin import agent_with_plugin
from lightkube import AsyncClient, KubeConfig
from prometheus_client.parser import text_string_to_metric_families

from rdmaplane.adapters.config.base import validate
from rdmaplane.adapters.discovery import read_node
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2 as pr
from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc
from rdmaplane.adapters.kubelet.podresources import PodResourcesClient
from rdmaplane.core import nrt
from rdmaplane.core.counters import PORT_COUNTERS
from rdmaplane.core.model import LinkLayer, NodeTopology
from rdmaplane.core.settings.agent import AgentSettings, FabricSettings, HealthSettings
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.services.agent.deviceplugin import EmbeddedPlugin
from rdmaplane.services.agent.metrics import NodeCollector, NodeView
from rdmaplane.services.agent.root import Agent

GPU = "nvidia.com/gpu"
POLL_S = 0.1


@pytest.fixture
def node(sample_trees: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(sample_trees["hgx-h100-roce"], tmp_path / "sys", symlinks=True))


def config(node: Path, tmp_path: Path, **extra) -> AgentSettings:
    kubelet = tmp_path / "kubelet"
    kubelet.mkdir(exist_ok=True)
    (kubelet / "config.yaml").write_text(
        "kind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\n"
        "topologyManagerScope: pod\n"
    )
    return AgentSettings(
        node_name="hgx-h100-017",
        sysfs_root=node,
        kubelet_dir=kubelet,
        poll_interval_s=POLL_S,
        allocation_interval_s=POLL_S,
        metrics_address="127.0.0.1",
        metrics_port=0,
        **extra,
    )


class Running:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(self.agent.run(self.stop))
        await asyncio.wait_for(self.agent.ready.wait(), 30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)

    @property
    def url(self) -> str:
        port = self.agent.http._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def get(self, path: str) -> httpx.Response:
        async with httpx.AsyncClient() as client:
            return await client.get(self.url + path)

    async def metrics(self) -> dict[tuple[str, tuple], float]:
        text = (await self.get("/metrics")).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


async def until(check, within_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(POLL_S / 2)


def labels(hca: str, netdev: str, numa: int) -> tuple:
    return tuple(sorted({"hca": hca, "port": "1", "netdev": netdev, "numa": str(numa)}.items()))


async def test_metrics_endpoints_and_counters(node: Path, tmp_path: Path):
    async with Running(Agent(config(node, tmp_path))) as run:
        assert (await run.get("/healthz")).status_code == 200
        assert (await run.get("/readyz")).text == "ready\n"
        assert (await run.get("/nope")).status_code == 404
        m = await run.metrics()
    mlx5_0 = labels("mlx5_0", "ens108np0", 0)
    assert m[("rdmaplane_port_transmit_bytes_total", mlx5_0)] == 812345678901 * 4
    assert m[("rdmaplane_port_receive_bytes_total", mlx5_0)] == 798765432109 * 4
    assert m[("rdmaplane_port_transmit_packets_total", mlx5_0)] == 2345678901
    assert m[("rdmaplane_port_cnp_sent_total", mlx5_0)] == 1201
    assert m[("rdmaplane_port_cnp_handled_total", mlx5_0)] == 1198
    assert m[("rdmaplane_port_symbol_errors_total", mlx5_0)] == 0
    assert m[("rdmaplane_port_up", mlx5_0)] == 1
    assert m[("rdmaplane_port_state", mlx5_0)] == 4
    assert m[("rdmaplane_port_rate_bytes_per_second", mlx5_0)] == 400e9 / 8
    assert m[("rdmaplane_hca_healthy", (("hca", "mlx5_0"),))] == 1
    assert m[("rdmaplane_node_rdma_ready", ())] == 1
    assert m[("rdmaplane_agent_discoveries_total", (("trigger", "start"),))] == 1
    bond = labels("mlx5_bond_0", "bond0", 0)
    assert m[("rdmaplane_port_up", bond)] == 1


DASHBOARD = Path(__file__).resolve().parents[2] / "deploy/grafana/rdmaplane-dashboard.json"


async def test_dashboard_queries_only_exported_metrics(node: Path, tmp_path: Path):
    async with Running(Agent(config(node, tmp_path))) as run:
        text = (await run.get("/metrics")).text
    exported = set()
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
        exported |= {family.name + s for s in suffixes.get(family.type, [""])}
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"rdmaplane_[a-z_]+", e)}
    assert len(used) >= 20
    assert used <= exported, f"not exported: {sorted(used - exported)}"


async def test_port_flap_flips_health_and_condition(node: Path, tmp_path: Path):
    port = node / "class/infiniband/mlx5_3/ports/1"
    async with Running(Agent(config(node, tmp_path))) as run:
        agent = run.agent
        assert agent.condition is not None and agent.condition.status
        (port / "state").write_text("1: DOWN\n")
        (port / "phys_state").write_text("3: Disabled\n")
        await until(lambda: not agent.condition.status)
        assert agent.condition.reason == "PortDown"
        assert "mlx5_3: port 1 DOWN (DISABLED)" in agent.condition.message
        m = await run.metrics()
        assert m[("rdmaplane_port_up", labels("mlx5_3", "ens111np0", 0))] == 0
        assert m[("rdmaplane_hca_healthy", (("hca", "mlx5_3"),))] == 0
        assert m[("rdmaplane_agent_discoveries_total", (("trigger", "changed"),))] >= 1
        assert agent.topo.hca("mlx5_3").port(1).is_up is False  # rediscovered
        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        await until(lambda: agent.condition.status)
        m = await run.metrics()
        assert m[("rdmaplane_agent_health_transitions_total", (("to", "unhealthy"),))] == 1
        assert m[("rdmaplane_agent_health_transitions_total", (("to", "healthy"),))] == 1


async def test_gid_label_comes_from_the_pools_and_a_mismatch_is_said(
    node: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """The gid-index label is the NCCL_IB_GID_INDEX the plugin's pools inject; pools whose GID
    policies give different indexes drop it, say why in RDMAReady and log a warning."""
    v1 = {"resourceName": "example.com/hca-v1", "nccl": {"gid": {"roceVersion": 1}}}
    pools = validate(PluginSettings, {"pools": [{}, v1]}).pools
    caplog.set_level(logging.INFO, logger="rdmaplane")
    agent = Agent(config(node, tmp_path), pools=pools[:1])  # as with --no-device-plugin
    await agent.discover("start")
    assert agent.desired().labels[nrt.LABEL_GID_INDEX] == "3"
    assert agent.condition is not None and agent.condition.reason == "AllDevicesHealthy"
    agent = Agent(config(node, tmp_path), pools=pools)
    await agent.discover("start")
    desired = agent.desired()
    assert desired.labels[nrt.LABEL_GID_INDEX] is None  # removed from the node
    assert (desired.condition.status, desired.condition.reason) == (True, "GidIndexMismatch")
    said = "NCCL_IB_GID_INDEX differs between device plugin pools "
    said += "(example.com/hca-v1 → 2, rdmaplane.io/hca → 3)"
    assert desired.condition.message.endswith(said)
    warned = [r for r in caplog.records if r.getMessage().startswith(said)]
    assert [r.levelname for r in warned] == ["WARNING"]


async def test_rising_error_counters_make_the_hca_unhealthy(node: Path, tmp_path: Path):
    counter = node / "class/infiniband/mlx5_6/ports/1/counters/symbol_error"
    cfg = config(node, tmp_path, health=HealthSettings(60, {"symbol_error": 10}))
    async with Running(Agent(cfg)) as run:
        counter.write_text("5\n")
        await asyncio.sleep(POLL_S * 3)
        assert run.agent.condition.status  # +5: under the threshold
        counter.write_text("50\n")
        await until(lambda: not run.agent.condition.status)
        assert run.agent.condition.reason == "ErrorCountersRising"
        assert "symbol_error +50 within 60 s (max 10)" in run.agent.condition.message


class Lister(pr_grpc.PodResourcesListerServicer):
    def __init__(self, allocatable: list[str]) -> None:
        self.pods: list[pr.PodResources] = []
        self.allocatable = allocatable

    async def List(self, request, context):
        return pr.ListPodResourcesResponse(pod_resources=self.pods)

    async def GetAllocatableResources(self, request, context):
        devices = [pr.ContainerDevices(resource_name=GPU, device_ids=self.allocatable)]
        return pr.AllocatableResourcesResponse(devices=devices)


async def test_available_follows_pod_resources(
    node: Path, tmp_path: Path, sample_nodes: dict[str, NodeTopology]
):
    cfg = config(node, tmp_path)
    socket = cfg.pod_resources_socket
    socket.parent.mkdir(parents=True)
    topo = sample_nodes["hgx-h100-roce"]
    lister = Lister([g.uuid for g in topo.gpus])
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    agent = Agent(cfg, allocation_source=PodResourcesClient(socket, [GPU]))
    try:
        async with Running(agent):

            def free(zone: str) -> int:
                parsed = nrt.from_object(agent.desired().nrt)
                return next(z for z in parsed.zones if z.name == zone).available(GPU)

            assert nrt.from_object(agent.desired().nrt).policy == "single-numa-node"
            assert free("node-1") == 4
            lister.pods = [
                pr.PodResources(
                    name="train",
                    namespace="ml",
                    containers=[
                        pr.ContainerResources(
                            name="c",
                            devices=[
                                pr.ContainerDevices(
                                    resource_name=GPU,
                                    device_ids=[topo.gpus[5].uuid, topo.gpus[6].uuid],
                                )
                            ],
                        )
                    ],
                )
            ]
            await until(lambda: free("node-1") == 2)
            assert nrt.from_object(agent.desired().nrt).accounted_pods == {"ml/train"}
            lister.pods = []
            await until(lambda: free("node-1") == 4)
    finally:
        await server.stop(None)


def with_plugin(node: Path, short_dir: Path, **extra) -> tuple[AgentSettings, EmbeddedPlugin]:
    return agent_with_plugin(node, short_dir, poll_interval_s=POLL_S, **extra)


async def test_rising_errors_reach_the_device_plugin(
    node: Path, short_dir: Path, sample_nodes: dict[str, NodeTopology]
):
    """The embedded plugin learns of counter-based ill health from the agent (it sees port
    states itself): ListAndWatch turns the HCA Unhealthy, Allocate refuses it naming the counter,
    and it turns Healthy again once it recovers."""
    cfg, plugin = with_plugin(
        node, short_dir, health=HealthSettings(1.0, {"symbol_error": 10}, hourly_thresholds={})
    )
    mlx5_2 = sample_nodes["hgx-h100-roce"].hca("mlx5_2").pci.address
    counter = node / "class/infiniband/mlx5_2/ports/1/counters/symbol_error"
    async with Running(Agent(cfg, plugin=plugin)):
        socket = next((cfg.kubelet_dir / "device-plugins").glob("rdmaplane-*.sock"))
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stream = dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty())
            health = await next_health(stream)
            assert health[mlx5_2] == "Healthy" and len(health) == 9
            counter.write_text("500\n")
            while (health := await next_health(stream))[mlx5_2] == "Healthy":
                pass
            assert health[mlx5_2] == "Unhealthy"
            assert sum(v == "Unhealthy" for v in health.values()) == 1
            with pytest.raises(grpc.aio.AioRpcError) as refused:  # with the real cause
                await dp_grpc.DevicePluginStub(channel).Allocate(
                    dp.AllocateRequest(
                        container_requests=[dp.ContainerAllocateRequest(devices_ids=[mlx5_2])]
                    )
                )
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "mlx5_2: port 1 symbol_error +" in (refused.value.details() or "")
            while (health := await next_health(stream))[mlx5_2] == "Unhealthy":
                pass  # the increment ages out of the 1 s window
            stream.cancel()


async def test_allocate_tells_the_rails_the_fabric_file_gives_the_hcas(
    node: Path, short_dir: Path, sample_nodes: dict[str, NodeTopology]
):
    """The agent's fabric source reaches the embedded plugin: HCA k cabled into rail 7 - k's
    leaf, Allocate says so in `RDMAPLANE_RAILS`, in `RDMAPLANE_HCAS`'s order."""
    fabric = {
        "apiVersion": "rdmaplane.io/v1alpha1",
        "kind": "Fabric",
        "switches": [{"name": f"rail{r}", "tier": 0, "rail": r} for r in range(8)],
        "nodes": ["hgx-h100-017"],
        "links": [
            {"node": "hgx-h100-017", "hca": f"mlx5_{k}", "switch": f"rail{7 - k}"} for k in range(8)
        ],
    }
    path = short_dir / "fabric.yaml"
    path.write_text(yaml.safe_dump(fabric))
    cfg, plugin = with_plugin(node, short_dir, fabric=FabricSettings(file=path, lldp="off"))
    topo = sample_nodes["hgx-h100-roce"]
    ids = [topo.hca(n).pci.address for n in ("mlx5_3", "mlx5_0")]
    async with Running(Agent(cfg, plugin=plugin)):
        socket = next((cfg.kubelet_dir / "device-plugins").glob("rdmaplane-*.sock"))
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            got = await dp_grpc.DevicePluginStub(channel).Allocate(
                dp.AllocateRequest(
                    container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
                )
            )
    envs = got.container_responses[0].envs
    assert (envs["RDMAPLANE_HCAS"], envs["RDMAPLANE_RAILS"]) == ("mlx5_0,mlx5_3", "7,4")


async def next_health(stream) -> dict[str, str]:
    response = await asyncio.wait_for(stream.read(), 10)
    return {d.ID: d.health for d in response.devices}


def test_infiniband_ports_export_no_roce_counters(sample_trees: dict[str, Path]):
    """The sample's InfiniBand HCAs have no hw_counters: their RoCE metrics are absent, not 0;
    its Ethernet HCAs (storage, front-end) have them."""
    root = str(sample_trees["hgx-h200-ib"])
    topo = read_node(root)
    families = {m.name: m for m in NodeCollector(lambda: NodeView(root, topo, {}, None)).collect()}
    ethernet = {h.name for h in topo.hcas if h.ports[0].link_layer == LinkLayer.ETHERNET}
    assert ethernet and len(ethernet) < len(topo.hcas)
    for metric in ("rdmaplane_port_cnp_sent", "rdmaplane_port_local_ack_timeout_errors"):
        assert {s.labels["hca"] for s in families[metric].samples} == ethernet
    sent = families["rdmaplane_port_transmit_bytes"].samples
    assert len(sent) == sum(len(h.ports) for h in topo.hcas)
    assert all(s.name == "rdmaplane_port_transmit_bytes_total" for s in sent)


def test_every_counter_with_a_metric_is_exported_as_the_table_says(node: Path):
    """On a RoCE sample (every counter file there, PMA and hw_counters): one family per counter
    of the table with a metric, named, helped and scaled as its row says."""
    (node / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data").write_text("1000\n")
    root = str(node)
    topo = read_node(root)
    families = {
        m.name: m
        for m in NodeCollector(lambda: NodeView(root, topo, {}, None)).collect()
        if m.type == "counter"
    }
    table = {f"rdmaplane_port_{c.metric}": c for c in PORT_COUNTERS if c.metric}
    assert families.keys() == table.keys()
    for name, family in families.items():
        assert family.documentation == table[name].help
    sent = families["rdmaplane_port_transmit_bytes"].samples
    assert next(s.value for s in sent if s.labels["hca"] == "mlx5_0") == 4000


async def raw_http(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


async def test_http_rejects_what_it_does_not_serve(node: Path, tmp_path: Path):
    async with Running(Agent(config(node, tmp_path))) as run:
        port = int(run.url.rsplit(":", 1)[1])
        assert (await raw_http(port, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405")
        assert (await raw_http(port, b"nonsense\r\n\r\n")).startswith(b"HTTP/1.1 400")
        assert (await raw_http(port, b"GET /healthz HTTP/1.0\r\n\r\n")).endswith(b"ok\n")


async def healthz_until(run: Running, status: int, within_s: float = 30.0) -> httpx.Response:
    deadline = asyncio.get_running_loop().time() + within_s
    while (health := await run.get("/healthz")).status_code != status:
        assert asyncio.get_running_loop().time() < deadline, f"/healthz never {status}"
    return health


class Broken:
    """Stands in for one method of a running task: raises an unexpected error while set."""

    def __init__(self, real) -> None:
        self.real = real
        self.on = True

    async def __call__(self, *args, **kwargs):
        if self.on:
            raise RuntimeError("unexpected fault injected by the test")
        return await self.real(*args, **kwargs)


class BrokenSync(Broken):
    def __call__(self, *args, **kwargs):  # type: ignore[override]
        if self.on:
            raise RuntimeError("unexpected fault injected by the test")
        return self.real(*args, **kwargs)


async def test_each_task_that_dies_is_restarted_and_healthz_fails_meanwhile(
    node: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """Kill every long task of the agent in turn with an exception nobody expects: /healthz
    answers 503 naming the task while it is down, the task is restarted, /healthz is 200
    again, and the restarts are counted in /metrics."""
    cfg, plugin = with_plugin(node, short_dir, allocation_interval_s=POLL_S)
    unreachable = AsyncClient(  # the discard port: the publisher keeps retrying
        KubeConfig.from_dict(
            {
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    pod_resources = PodResourcesClient(cfg.pod_resources_socket, [GPU])
    agent = Agent(cfg, kube=unreachable, plugin=plugin, allocation_source=pod_resources)
    agent.tasks.backoff_initial_s, agent.tasks.backoff_max_s = 0.05, 0.2
    pool = plugin.plugin.servers[0]
    assert agent.publisher is not None
    faults = {
        "poll": (agent, "poll", Broken, lambda: None),
        "allocations": (agent, "refresh_allocations", Broken, lambda: None),
        "publish": (
            agent.publisher,
            "publish_once",
            Broken,
            lambda: agent.publisher.record_event("Normal", "Test", "wake up"),
        ),
        "faults": (agent.faults, "act_once", Broken, lambda: None),  # acts after every poll
        "states": (agent, "_states_changed", BrokenSync, lambda: None),  # every second
        pool.task_name: (
            pool.kept,
            "look",
            BrokenSync,
            lambda: (cfg.kubelet_dir / "device-plugins" / "wake").touch(),
        ),
    }
    async with Running(agent) as run:
        assert sorted(agent.tasks.names) == sorted(faults)
        for name, (owner, method, kind, wake) in faults.items():
            broken = kind(getattr(owner, method))
            monkeypatch.setattr(owner, method, broken)
            wake()
            health = await healthz_until(run, 503)
            assert f"task {name} is down: RuntimeError: unexpected fault" in health.text
            broken.on = False
            await healthz_until(run, 200)
            assert agent.tasks.restarts[name] > 0
        m = await run.metrics()
    for name in faults:
        assert m[("rdmaplane_agent_task_restarts_total", (("task", name),))] >= 1


async def test_a_device_without_its_verbs_node_is_unhealthy_with_the_reason(
    node: Path, short_dir: Path, sample_nodes: dict[str, NodeTopology], caplog
):
    """`--dev-root` lacking /dev/infiniband/uverbsN: the kubelet is told Unhealthy (not Healthy
    and then refused at Allocate), the reason is logged at start and exported in /metrics, and
    the device turns Healthy once its node appears."""
    mlx5_3 = sample_nodes["hgx-h100-roce"].hca("mlx5_3")
    cfg, plugin = with_plugin(node, short_dir)
    dev_root = short_dir / "dev"
    (dev_root / "infiniband" / mlx5_3.uverbs).unlink()
    async with Running(Agent(cfg, plugin=plugin)) as run:
        socket = next((cfg.kubelet_dir / "device-plugins").glob("rdmaplane-*.sock"))
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stream = dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty())
            health = await next_health(stream)
            assert health[mlx5_3.pci.address] == "Unhealthy"
            assert sum(v == "Healthy" for v in health.values()) == 8
            m = await run.metrics()
            hca = "rdmaplane.io/hca"
            unhealthy = (("health", "Unhealthy"), ("reason", "NoVerbsDevice"), ("resource", hca))
            assert m[("rdmaplane_device_plugin_devices", unhealthy)] == 1
            healthy = (("health", "Healthy"), ("reason", ""), ("resource", hca))
            assert m[("rdmaplane_device_plugin_devices", healthy)] == 8
            series = (
                ("device", mlx5_3.pci.address),
                ("hcas", "mlx5_3"),
                ("reason", "NoVerbsDevice"),
                ("resource", hca),
            )
            assert m[("rdmaplane_device_plugin_unusable_devices", series)] == 1
            (dev_root / "infiniband" / mlx5_3.uverbs).touch()  # the driver came up late
            while (health := await next_health(stream))[mlx5_3.pci.address] == "Unhealthy":
                pass
            stream.cancel()
    logged = [r.getMessage() for r in caplog.records if "NoVerbsDevice" in r.getMessage()]
    assert logged == [
        f"rdmaplane.io/hca: device {mlx5_3.pci.address} is Unhealthy (NoVerbsDevice): mlx5_3: "
        f"no verbs device node /dev/infiniband/{mlx5_3.uverbs} (looked under {dev_root})"
    ]
