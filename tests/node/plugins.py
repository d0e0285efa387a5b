"""The device plugins beside the real kubelet: ours as it is deployed (`rdmaplane device-plugin`
in its own process), and the GPU plugin stand-in of tests/kubelet for `nvidia.com/gpu`; what the
kubelet made of them (the Node's allocatable, PodResources)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from rdmaplane.adapters.discovery import read_node
from rdmaplane.adapters.kubelet.podresources import PodResourcesClient, PodResourcesError
from rdmaplane.core.allocation import PodDevices
from rdmaplane.core.model import NodeTopology
from rdmaplane.services.agent.policy.inventory import gpu_ids
from tests.e2e.controlplane import Process
from tests.kubelet.gpu_plugin import Gpu, GpuPluginStandIn
from tests.node.realnode import RealNode

HCA = "rdmaplane.io/hca"
GPU = "nvidia.com/gpu"
WAIT_S = 60.0


@contextlib.contextmanager
def device_plugin(
    node: RealNode, sysfs: Path, config: Mapping[str, Any], name: str = "device-plugin"
) -> Iterator[Process]:
    """`rdmaplane device-plugin` with `config` for this node's kubelet, reading `sysfs` and the
    node's device nodes; stopped (SIGTERM) at the end."""
    config_file = node.workdir / f"{name}.yaml"
    document = {"apiVersion": "rdmaplane.io/v1alpha1", "kind": "DevicePluginConfig", **config}
    config_file.write_text(yaml.safe_dump(document))
    process = Process.start(
        Path(sys.executable),
        ["-m", "rdmaplane", "device-plugin", f"--config={config_file}", f"--sysfs-root={sysfs}",
         f"--dev-root={node.dev_root}", f"--kubelet-dir={node.kubelet_dir}", "-v"],
        node.workdir / "logs" / f"{name}.log",
    )  # fmt: skip
    try:
        yield process
    finally:
        process.stop()


def sample_gpus(topology: NodeTopology) -> list[Gpu]:
    """The sample's GPUs as NVIDIA's plugin announces them (UUID, NUMA node)."""
    ids = gpu_ids(topology)
    return [Gpu(ids[g.index], g.pci.numa) for g in topology.gpus]


@contextlib.asynccontextmanager
async def gpu_plugin(node: RealNode, sysfs: Path) -> AsyncIterator[GpuPluginStandIn]:
    plugin = GpuPluginStandIn(
        sample_gpus(read_node(str(sysfs))), node.kubelet_dir / "device-plugins"
    )
    await plugin.start()
    try:
        yield plugin
    finally:
        await plugin.stop()


async def allocatable(kube: AsyncClient, node: str, resource: str) -> int:
    status = (await kube.get(Node, node)).status
    return int(((status.allocatable if status else None) or {}).get(resource, "0"))


async def kubelet_allocatable(node: RealNode, resource: str) -> int | None:
    """How many healthy devices of `resource` the kubelet's device manager has (PodResources
    GetAllocatableResources); None while its socket does not answer."""
    client = PodResourcesClient(node.kubelet_dir / "pod-resources" / "kubelet.sock", [resource])
    try:
        ids = (await client.allocations()).allocatable_ids(resource)
    except PodResourcesError:
        return None
    finally:
        await client.close()
    return None if ids is None else len(ids)


async def wait_allocatable(
    kube: AsyncClient, node: RealNode, want: Mapping[str, int], within: float = WAIT_S
) -> float:
    """Until the kubelet's device manager and the Node's allocatable both have `want` of each
    resource (the Node alone can be a status from before a plugin restarted): the seconds it
    took."""
    start = time.monotonic()
    while True:
        seen = {r: (await kubelet_allocatable(node, r), await allocatable(kube, node.name, r))
                for r in want}  # fmt: skip
        if all(seen[r] == (n, n) for r, n in want.items()):
            return time.monotonic() - start
        if time.monotonic() - start > within:
            raise AssertionError(
                f"(kubelet, Node) allocatable {seen}, not {dict(want)}, after {within} s"
            )
        await asyncio.sleep(0.1)


async def held(
    node: RealNode, namespace: str, resources: tuple[str, ...] = (HCA, GPU)
) -> dict[str, PodDevices]:
    """What the kubelet's PodResources says each running pod of `namespace` holds, by pod."""
    client = PodResourcesClient(node.kubelet_dir / "pod-resources" / "kubelet.sock", resources)
    try:
        allocations = await client.allocations()
    finally:
        await client.close()
    return {p.name: p for p in allocations.pods if p.namespace == namespace}
