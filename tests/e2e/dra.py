"""What the DRA end-to-end tests share: a sample node whose HCA ports the driver's own code
publishes (with a device node for every HCA), GPU slices as NVIDIA's GPU DRA driver publishes
them for the same sample, the DeviceClasses, and claims made from deploy/dra/'s templates (and
examples/dra-rails.yaml's)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml
from lightkube import ApiError, AsyncClient, codecs
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.events_v1 import Event
from lightkube.resources.resource_v1 import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)

from rdmaplane.adapters.config import API_VERSION, parse
from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG
from rdmaplane.adapters.discovery.samples import read_sample
from rdmaplane.adapters.kube import ClaimDict
from rdmaplane.core.faults import Fault
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.nrt import Uplink
from rdmaplane.core.settings.agent import AgentSettings
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.core.settings.dra import DraSettings
from rdmaplane.services.dra.driver import DraDriver
from rdmaplane.services.dra.policy.slices import BANDWIDTH
from tests.e2e import nodeaccess
from tests.e2e.controlplane import KubeCluster, add_ready_node
from tests.unit.test_deviceplugin_resources import device_nodes
from tests.unit.test_dra_devices import with_ports_down

REPO = Path(__file__).resolve().parents[2]
DRA_DEPLOY = REPO / "deploy" / "dra"
DRA_SCHEDULER_CONFIG = DRA_DEPLOY / "kube-scheduler-config.yaml"  # what docs/dra.md recommends
RAIL_EXAMPLE = REPO / "examples" / "dra-rails.yaml"
DRIVER = "rdma.rdmaplane.io"
GPU_DRIVER = "gpu.nvidia.com"
DRIVER_USER = "system:serviceaccount:rdmaplane:rdmaplane-dra-driver"
GROUP_LABEL = "e2e.rdmaplane.io/dra-group"
WAIT_S = 60.0
# As NVIDIA's GPU DRA driver installs it (its Helm chart): full GPUs of driver gpu.nvidia.com.
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": "device.driver == 'gpu.nvidia.com' && "
                    "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                }
            }
        ]
    },
}


def templates() -> dict[str, dict[str, Any]]:
    """deploy/dra/claim-templates.yaml's, share-templates.yaml's and examples/dra-rails.yaml's
    ResourceClaimTemplates by name."""
    files = [DRA_DEPLOY / "claim-templates.yaml", DRA_DEPLOY / "share-templates.yaml", RAIL_EXAMPLE]
    return {
        d["metadata"]["name"]: d
        for file in files
        for d in yaml.safe_load_all(file.read_text())
        if d["kind"] == "ResourceClaimTemplate"
    }


# What NVML says of the samples' GPUs and NVIDIA's driver puts in its attributes and capacity
# (our table, by product): architecture, CUDA compute capability, memory in GiB, brand.
GPU_PRODUCTS = {
    "A100": ("Ampere", "8.0", 80, "Nvidia"),
    "H100": ("Hopper", "9.0", 80, "Nvidia"),
    "H200": ("Hopper", "9.0", 140, "Nvidia"),
    "GB300": ("Blackwell", "10.3", 270, "Nvidia"),
    "L40S": ("Ada Lovelace", "8.9", 45, "Nvidia"),
    "RTX 6000 Ada": ("Ada Lovelace", "8.9", 48, "Nvidia_RTX"),
}
GPU_DRIVER_VERSIONS = {"driverVersion": "580.95.5", "cudaDriverVersion": "13.0.0"}


def gpu_product(name: str | None) -> tuple[str, str, int, str]:
    found = [v for k, v in GPU_PRODUCTS.items() if k in (name or "")]
    if not found:
        raise ValueError(f"no GPU_PRODUCTS entry for GPU {name!r}")
    return found[0]


def gpu_slice(node: str, topo: NodeTopology) -> dict[str, Any]:
    """The node's full GPUs as NVIDIA's GPU DRA driver (k8s-dra-driver-gpu) publishes them:
    `gpu-<minor>`, its `type`, `uuid` (lower case), `minor`, `productName`, `brand`,
    `architecture`, the CUDA compute capability and driver versions (semver), the standard
    PCI bus ID, PCIe root and NUMA node attributes (`deviceattribute`), and its `memory` as
    capacity."""
    devices = []
    for gpu in topo.gpus:
        architecture, compute, memory_gib, brand = gpu_product(gpu.name)
        attributes: dict[str, Any] = {
            "type": {"string": "gpu"},
            "uuid": {"string": (gpu.uuid or f"GPU-{gpu.index}").lower()},
            "minor": {"int": gpu.index},
            "productName": {"string": gpu.name},
            "brand": {"string": brand},
            "architecture": {"string": architecture},
            "cudaComputeCapability": {"version": f"{compute}.0"},
            **{k: {"version": v} for k, v in GPU_DRIVER_VERSIONS.items()},
            "resource.kubernetes.io/pcieRoot": {"string": gpu.pci.root},
            "resource.kubernetes.io/pciBusID": {"string": gpu.pci.address},
        }
        if gpu.pci.numa is not None and gpu.pci.numa >= 0:
            attributes["resource.kubernetes.io/numaNode"] = {"int": gpu.pci.numa}
        devices.append(
            {
                "name": f"gpu-{gpu.index}",
                "attributes": attributes,
                "capacity": {"memory": {"value": f"{memory_gib}Gi"}},
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{GPU_DRIVER}"},
        "spec": {
            "driver": GPU_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_classes(extended: bool = False) -> list[dict[str, Any]]:
    """deploy/dra/deviceclass.yaml's classes: the driver's, and with `extended` those that
    serve extended resources through DRA (KEP-5004)."""
    ours = yaml.safe_load_all((DRA_DEPLOY / "deviceclass.yaml").read_text())
    return [c for c in ours if extended or "extendedResourceName" not in c["spec"]]


async def ensure_device_classes(kube: AsyncClient, extended: bool = False) -> None:
    """The driver's DeviceClass and NVIDIA's; with `extended`, deploy/dra/'s classes serving
    `rdmaplane.io/hca` and `nvidia.com/gpu` by DRA too (left out by default: the scheduler
    would then serve device-plugin pods on DRA nodes, which the other tests do not expect)."""
    for body in (*device_classes(extended), GPU_CLASS):
        try:
            await kube.create(cast(DeviceClass, DeviceClass.from_dict(body)))
        except ApiError as e:
            if e.status.code != 409:
                raise


@dataclass
class DraNode:
    """A Node of the sample, its GPU slice, and the DRA driver publishing its HCA ports; `topo`
    is what the driver is fed next (the sample, or it with ports down)."""

    name: str
    group: str
    topo: NodeTopology
    driver: DraDriver
    dev_root: Path
    faults: dict[tuple[str, int], Fault] = field(default_factory=dict)
    uplinks: Sequence[Uplink] = ()  # where its HCAs plug into the fabric (rails), if known

    async def publish(self) -> None:
        """Feed the driver the topology, the current faults and the fabric; wait until the
        server has it."""
        self.driver.update(self.topo, self.faults, self.uplinks)
        assert self.driver.publisher is not None
        await self.driver.publisher.publish_once()

    async def write_claim_status(self) -> int:
        """What the driver's claim watch would do now: the binding conditions of this node's
        devices written into every claim holding one; the number of claims written."""
        writer = self.driver.claim_status
        assert writer is not None and self.driver.kube is not None
        async for claim in self.driver.kube.list(ClaimDict, namespace="*"):
            writer.observe("ADDED", claim)
        return await writer.flush()

    @asynccontextmanager
    async def claim_status_written(self) -> AsyncIterator[None]:
        """The driver's claim watch running, as in the agent."""
        writer = self.driver.claim_status
        assert writer is not None
        task = asyncio.create_task(writer.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def device_of(self, hca: str) -> str:
        return next(n for n, d in self.driver.devices.items() if d.hca == hca)


async def slice_devices(kube: AsyncClient, node: str) -> dict[str, dict[str, Any]]:
    """The driver's devices on `node` as the API server holds them, by name."""
    out = {}
    async for s in kube.list(ResourceSlice, fields={"spec.nodeName": node, "spec.driver": DRIVER}):
        for d in s.to_dict()["spec"].get("devices", []):
            out[d["name"]] = d
    return out


def agent_config(node: str, dev_root: Path | None = None, **dra: Any) -> AgentSettings:
    return AgentSettings(
        node_name=node,
        device_plugin_enabled=False,
        dra=DraSettings(enabled=True, **dra),
        **({"dev_root": dev_root} if dev_root is not None else {}),
    )


@asynccontextmanager
async def dra_node(
    kube: AsyncClient,
    sample: str,
    pools: PluginSettings | None = None,
    down: tuple[str, ...] = (),
    *,
    group: str | None = None,
    claim_status: bool = True,
    uplinks: Sequence[Uplink] = (),
    **dra: object,
) -> AsyncIterator[DraNode]:
    """The sample as a node, its HCAs' device nodes in a folder of their own, the ports of the
    HCAs `down` DOWN/Disabled from the first slice on; `group` (the label pods select) shared
    with other nodes, or one of its own. `claim_status`: the driver's claim watch runs (pods
    bind once it set their devices ready); without it the test writes it
    (`DraNode.write_claim_status`). `uplinks`: the fabric as the agent's source gives it.
    `dra`: settings of `AgentConfig.dra`."""
    group = group or uuid.uuid4().hex[:8]
    name = f"dra-{sample}-{uuid.uuid4().hex[:8]}"
    await add_ready_node(kube, name, {GROUP_LABEL: group}, {})
    topo = with_ports_down(read_sample(sample), *down)
    await kube.create(cast(ResourceSlice, ResourceSlice.from_dict(gpu_slice(name, topo))))
    dev_root = device_nodes(topo, Path(tempfile.mkdtemp(prefix="rdr-dev-")) / "dev")
    config = agent_config(name, dev_root, **dra)
    driver = DraDriver(config, (pools or PluginSettings()).pools, kube)
    node = DraNode(name, group, topo, driver, dev_root, uplinks=uplinks)
    await node.publish()
    try:
        if claim_status and driver.claim_status is not None:
            async with node.claim_status_written():
                yield node
        else:
            yield node
    finally:
        async for s in kube.list(ResourceSlice, fields={"spec.nodeName": name}):
            assert s.metadata is not None and s.metadata.name
            await kube.delete(ResourceSlice, s.metadata.name)
        await kube.delete(Node, name)
        shutil.rmtree(dev_root.parent, ignore_errors=True)


def _pod(namespace: str, group: str, claim: Mapping[str, str]) -> tuple[str, Pod]:
    name = f"train-{uuid.uuid4().hex[:6]}"
    body = {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {GROUP_LABEL: group},
            "resourceClaims": [{"name": "gpus-nics", **claim}],
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example/trainer:1",
                    "resources": {"claims": [{"name": "gpus-nics"}]},
                }
            ],
        },
    }
    return name, cast(Pod, Pod.from_dict(body))


async def claim_pod(
    kube: AsyncClient, namespace: str, node: DraNode | str, spec: Mapping[str, Any]
) -> tuple[str, str]:
    """A ResourceClaim with `spec` and a pod using it on `node`'s group (by name: no
    kube-controller-manager needed)."""
    claim_name = f"claim-{uuid.uuid4().hex[:6]}"
    claim = {"metadata": {"name": claim_name, "namespace": namespace}, "spec": dict(spec)}
    await kube.create(cast(ResourceClaim, ResourceClaim.from_dict(claim)))
    pod_name, pod = _pod(
        namespace,
        node.group if isinstance(node, DraNode) else node,
        {"resourceClaimName": claim_name},
    )
    await kube.create(pod)
    return pod_name, claim_name


async def template_pod(
    kube: AsyncClient, namespace: str, node: DraNode, template: str
) -> tuple[str, str]:
    """A pod naming one of deploy/dra/'s ResourceClaimTemplates (created in `namespace`), and
    the claim kube-controller-manager's resourceclaim controller makes for it."""
    body = {**templates()[template], "metadata": {"name": template, "namespace": namespace}}
    try:
        await kube.create(cast(ResourceClaimTemplate, ResourceClaimTemplate.from_dict(body)))
    except ApiError as e:
        if e.status.code != 409:
            raise
    pod_name, pod = _pod(namespace, node.group, {"resourceClaimTemplateName": template})
    await kube.create(pod)
    async with asyncio.timeout(WAIT_S):
        while True:
            stored = await kube.get(Pod, pod_name, namespace=namespace)
            statuses = (stored.status.resourceClaimStatuses if stored.status else None) or []
            if statuses and statuses[0].resourceClaimName:
                return pod_name, statuses[0].resourceClaimName
            await asyncio.sleep(0.25)


def nics(count: int, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A claim spec for `count` NIC ports (and `config`, opaque parameters for the driver)."""
    spec: dict[str, Any] = {
        "devices": {
            "requests": [
                {"name": f"nic-{k}", "exactly": {"deviceClassName": DRIVER}} for k in range(count)
            ]
        }
    }
    if config is not None:
        spec["devices"]["config"] = [{"opaque": {"driver": DRIVER, "parameters": dict(config)}}]
    return spec


# mlx5_0 and mlx5_1 (400G RoCE) shared by bandwidth: 100G a request unless it names more.
SHARED_POOLS = {
    "apiVersion": API_VERSION,
    "kind": "DevicePluginConfig",
    "pools": [{"mode": "shared", "selectors": {"hcaNames": ["mlx5_0", "mlx5_1"]}}],
}
SHARED = parse(SHARED_POOLS, DEVICE_PLUGIN_CONFIG, "shared pools")


def shares(*gbps: int | None, distinct: str | None = None) -> dict[str, Any]:
    """A claim for one share per entry (None: the default bandwidth), on distinct values of
    the attribute `distinct` when given."""
    requests = [
        {
            "name": f"nic-{k}",
            "exactly": {
                "deviceClassName": DRIVER,
                **({"capacity": {"requests": {BANDWIDTH: f"{g}G"}}} if g else {}),
            },
        }
        for k, g in enumerate(gbps)
    ]
    devices: dict[str, Any] = {"requests": requests}
    if distinct:
        devices["constraints"] = [
            {"requests": [r["name"] for r in requests], "distinctAttribute": distinct}
        ]
    return {"devices": devices}


async def allocation(kube: AsyncClient, namespace: str, claim: str) -> list[Mapping[str, Any]]:
    """The claim's allocated devices, once the scheduler has written them."""
    async with asyncio.timeout(WAIT_S):
        while True:
            found = (await kube.get(ResourceClaim, claim, namespace=namespace)).to_dict()
            results = found.get("status", {}).get("allocation", {}).get("devices", {})
            if results.get("results"):
                return cast(list[Mapping[str, Any]], results["results"])
            await asyncio.sleep(0.25)


async def pending(kube: AsyncClient, namespace: str, pod: str) -> bool:
    """Not bound to a node (yet)."""
    stored = await kube.get(Pod, pod, namespace=namespace)
    return stored.spec is not None and stored.spec.nodeName is None


async def bound_node(kube: AsyncClient, namespace: str, pod: str) -> str:
    """The node the pod is bound to, once it is (binding waits for its devices' binding
    conditions: kube-scheduler looks every 5 s)."""

    async def node() -> str | None:
        stored = await kube.get(Pod, pod, namespace=namespace)
        return stored.spec.nodeName if stored.spec else None

    found: str = await until(node, f"{pod} bound")
    return found


async def failed_scheduling_note(
    kube: AsyncClient, namespace: str, pod: str, containing: str = ""
) -> str:
    """The note of the scheduler's FailedScheduling event about `pod` that contains
    `containing` (a pod may first wait for its claim to be created)."""
    async with asyncio.timeout(WAIT_S):
        while True:
            async for event in kube.list(Event, namespace=namespace):
                note = event.note or ""
                ours = event.reason == "FailedScheduling" and event.regarding.name == pod
                if ours and containing in note:
                    return note
            await asyncio.sleep(0.5)


async def until(check: Callable[[], Awaitable[Any]], what: str) -> Any:
    """Await `check()` until it returns something truthy; fail naming `what` after WAIT_S."""
    try:
        async with asyncio.timeout(WAIT_S):
            while True:
                found = await check()
                if found:
                    return found
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"not within {WAIT_S:g} s: {what}") from None


def install_driver_rbac(cluster: KubeCluster) -> Path:
    """The agent's and the driver's RBAC, for real, without the own-node admission policy (a
    client certificate carries no node name); a kubeconfig as the driver's ServiceAccount."""
    with cluster.client() as client:
        for path in (REPO / "deploy/agent/rbac.yaml", DRA_DEPLOY / "rbac.yaml"):
            for obj in codecs.load_all_yaml(path.read_text()):
                if "AdmissionPolicy" not in obj.kind:
                    client.apply(obj, force=True)
    return cluster.kubeconfig_for(DRIVER_USER)


HEALTH_WINDOW = "5s"  # long enough to see a taint come, short enough to see it go


def driver_command(
    workdir: Path,
    tree: Path,
    node: str,
    kubeconfig: Path,
    poll: str,
    *,
    fault: tuple[str, str] = ("0s", "0s"),
    pools: Mapping[str, Any] | None = None,
    health_resend: str = "10s",
) -> list[str]:
    """`rdmaplane dra-driver` for `node` on `tree` (device nodes in workdir/dev, kubelet folder
    workdir/kubelet, CDI specs workdir/cdi), its config written to workdir/agent.yaml: fast
    polls, JSON logs, metrics on a free port, the fault hysteresis `fault` (fatalAfter,
    clearAfter; off by default: taints at once), a short health window (`symbol_error` over 10
    within it: the port is refused), the device plugin `pools` when given (a
    DevicePluginConfig document, to workdir/pools.yaml)."""
    config = {
        "apiVersion": "rdmaplane.io/v1alpha1",
        "kind": "AgentConfig",
        "sysfsRoot": str(tree),
        "kubeletDir": str(workdir / "kubelet"),
        "devRoot": str(workdir / "dev"),
        "pollInterval": poll,
        "metricsAddress": "127.0.0.1",
        "metricsPort": 0,
        "logFormat": "json",
        "fabric": {"lldp": "off"},
        "publish": {"backoffInitial": "200ms", "backoffMax": "2s"},
        "health": {"window": HEALTH_WINDOW, "thresholds": {"symbol_error": 10}},
        "fault": {"fatalAfter": fault[0], "clearAfter": fault[1]},
        "dra": {"cdiDir": str(workdir / "cdi"), "health": {"resend": health_resend}},
    }
    (workdir / "kubelet").mkdir(exist_ok=True)
    (workdir / "agent.yaml").write_text(yaml.safe_dump(config))
    extra = []
    if pools is not None:
        (workdir / "pools.yaml").write_text(yaml.safe_dump(dict(pools)))
        extra = ["--device-plugin-config", str(workdir / "pools.yaml")]
    return [
        sys.executable, "-m", "rdmaplane", "dra-driver", "--node-name", node,
        "--config", str(workdir / "agent.yaml"), "--kubeconfig", str(kubeconfig), *extra,
    ]  # fmt: skip


def driver_kubeconfig_on(cluster: KubeCluster, node: str) -> Path:
    """The DRA DaemonSet's pod on `node` (created, never run: the node is not real) and its
    ServiceAccount's token bound to it, as the kubelet mounts it: the API server names the node
    in it, which the driver's `associated-node:patch` on claims needs."""
    return nodeaccess.kubeconfig_on(cluster, node, nodeaccess.DRA_DAEMONSET)
