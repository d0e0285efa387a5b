"""The RDMA netns mode end to end: the agent on an exclusive-mode node with a shared pool publishes
`rdmaplane.io/rdma-netns=exclusive` and RDMAReady=False (`NetnsExclusive`) to a real API server;
the extender, reading only that condition, keeps an RDMA pod off the node while the real
kube-scheduler tries it; `rdma system set netns shared` (ib_core's parameter flips) brings the
label, the condition and the pod's binding."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType

from rdmaplane.adapters.discovery.sysfs import NETNS_PARAMETER
from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2 as pr
from rdmaplane.core import nrt
from rdmaplane.core.settings.deviceplugin import PluginSettings, Pool
from tests.e2e.controlplane import Process, add_ready_node
from tests.e2e.test_agent import (  # noqa: F401 (fixtures)
    Lister,
    agent_kubeconfig,
    condition,
    eventually,
    kubelet,
    running_agent,
    workdir,
)
from tests.e2e.test_scheduler_extender import _scheduler_config, extender  # noqa: F401
from tests.scheduler_helpers import pod

POOLS = PluginSettings(pools=(Pool(), Pool(mode="shared", slots=16)))


async def _filtered_out(url: str, body: dict[str, Any], node: str) -> str | None:
    """The extender's own answer over its wire format: why `node` fails the pod, or None."""
    async with httpx.AsyncClient() as client:
        reply = await client.post(f"{url}/filter", json={"Pod": body, "NodeNames": [node]})
    failed = reply.json().get("FailedNodes") or {}
    return failed.get(node)


async def test_exclusive_mode_keeps_rdma_pods_off_until_the_node_shares(
    kube: AsyncClient,
    namespace: str,
    agent_kubeconfig: Path,  # noqa: F811
    extender: str,  # noqa: F811
    start_scheduler: Callable[..., Process],
    workdir: Path,  # noqa: F811
    kubelet: Lister,  # noqa: F811
    sample_trees: dict[str, Path],
):
    tree = Path(shutil.copytree(sample_trees["hgx-h100-roce"], workdir / "sys", symlinks=True))
    (tree / NETNS_PARAMETER).write_text("N\n")  # `rdma system set netns exclusive` at boot
    name = f"netns-{uuid.uuid4().hex[:6]}"
    await add_ready_node(kube, name, {}, {nrt.GPU: "8", nrt.HCA: "9", nrt.HCA_SHARED: "16"})
    body = pod("nccl-0", gpus=1, shared=1, ns=namespace)
    del body["status"]

    async def ready_is(status: str) -> Node | None:
        node = await kube.get(Node, name)
        c = condition(node)
        return node if c is not None and c.status == status else None

    async with running_agent(agent_kubeconfig, name, tree, workdir, plugin_config=POOLS) as agent:
        slots = [o.device_id for o in agent.plugin.offered() if o.shared]
        kubelet.allocatable.append(
            pr.ContainerDevices(resource_name=nrt.HCA_SHARED, device_ids=slots)
        )
        node = await eventually(lambda: ready_is("False"))
        assert node.metadata.labels[nrt.LABEL_RDMA_NETNS] == "exclusive"
        down = condition(node)
        assert down.reason == "NetnsExclusive"
        assert "shared device plugin pools need shared mode: rdmaplane.io/hca-shared" in (
            down.message
        )
        why = await eventually(lambda: _filtered_for(extender, body, name, "rdmaplane: RDMAReady"))
        assert why.startswith("rdmaplane: RDMAReady=False: the RDMA subsystem is in exclusive")

        start_scheduler(_scheduler_config(extender))
        await kube.create(Pod.from_dict(body))

        async def refused() -> str | None:
            async for e in kube.list(
                Event, namespace=namespace, fields={"involvedObject.name": "nccl-0"}
            ):
                if e.reason == "FailedScheduling" and "exclusive network-namespace" in (
                    e.message or ""
                ):
                    return e.message
            return None

        await eventually(refused, within_s=60)
        assert not (await kube.get(Pod, "nccl-0", namespace=namespace)).spec.nodeName

        (tree / NETNS_PARAMETER).write_text("Y\n")  # `rdma system set netns shared`
        node = await eventually(lambda: ready_is("True"), within_s=60)
        assert node.metadata.labels[nrt.LABEL_RDMA_NETNS] == "shared"
        assert condition(node).reason == "AllDevicesHealthy"
        await eventually(lambda: _passes(extender, body, name), within_s=60)
        # The pod waits in the scheduler's unschedulable queue for a cluster event; the agent's
        # own patches may have come before the extender's watch saw them, so make one more.
        await kube.patch(
            Node,
            name,
            {"metadata": {"annotations": {"e2e/poke": "1"}}},
            patch_type=PatchType.MERGE,
        )

        async def bound() -> str | None:
            return (await kube.get(Pod, "nccl-0", namespace=namespace)).spec.nodeName

        assert await eventually(bound, within_s=90) == name


async def _passes(url: str, body: dict[str, Any], node: str) -> bool:
    return await _filtered_out(url, body, node) is None


async def _filtered_for(url: str, body: dict[str, Any], node: str, prefix: str) -> str | None:
    """Why the extender fails `node`, once that starts with `prefix` (before the agent's first
    NRT it fails the node for having none)."""
    why = await _filtered_out(url, body, node)
    return why if why is not None and why.startswith(prefix) else None
