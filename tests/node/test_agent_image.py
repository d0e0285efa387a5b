"""The node agent as deploy/agent/ installs it, from rdmaplane's own image, on the real node.

The DaemonSet and its ConfigMap are applied as written (with its RBAC and the own-node
policies); kube-controller-manager's DaemonSet controller makes the pod, kube-scheduler binds
it, the kubelet runs it with the manifest's securityContext (root, every capability dropped,
read-only root filesystem, RuntimeDefault seccomp), its pod-bound ServiceAccount token and the
root CA the root-ca-cert-publisher controller puts in the namespace. Three changes, each
because this machine is not a cluster node:

- `/sys` is the sample's tree (this machine has no HCA);
- the API server is reached at 127.0.0.1 (KUBERNETES_SERVICE_HOST; no kube-proxy here);
- the metrics port is a free one (other tests share the machine's network).

The agent then does what it does on a GPU node: it registers its device plugin (the Node's
allocatable), publishes the NRT and labels its own Node, through the own-node policies, and
its probes (kubelet → host port) pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, AsyncClient, codecs
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from lightkube.types import CascadeType, PatchType

from rdmaplane import IMAGE
from rdmaplane.adapters.kube import NodeResourceTopology
from rdmaplane.core import nrt
from tests.e2e import nodeaccess
from tests.e2e.controlplane import free_port
from tests.node import pods
from tests.node.conftest import NodeCluster
from tests.node.plugins import HCA, allocatable
from tests.node.realnode import RealNode
from tests.node.test_device_plugin import topology

NAMESPACE = "rdmaplane"
GPU_NODE_LABEL = "nvidia.com/gpu.present"  # the DaemonSet's nodeSelector (GPU feature discovery)


def as_deployed(node_sample: Path, api_port: int, metrics_port: int) -> list[Any]:
    """deploy/agent/daemonset.yaml's ConfigMap and DaemonSet with the three changes above."""
    config_map, daemonset = yaml.safe_load_all(nodeaccess.AGENT_DAEMONSET.read_text())
    agent = yaml.safe_load(config_map["data"]["agent.yaml"])
    config_map["data"]["agent.yaml"] = yaml.safe_dump({**agent, "metricsPort": metrics_port})
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    (port,) = container["ports"]
    port["containerPort"] = metrics_port
    container["env"] += [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)},
    ]
    (sys_volume,) = (v for v in spec["volumes"] if v["name"] == "sys")
    sys_volume["hostPath"]["path"] = str(node_sample)
    return [codecs.from_dict(config_map), codecs.from_dict(daemonset)]


@pytest.fixture
async def deployed_agent(
    node_cluster: NodeCluster, real_node: RealNode, node_sample: Path, node_nrt_crd: None,
    kube: AsyncClient,
) -> AsyncIterator[dict[str, Any]]:  # fmt: skip
    """The agent's DaemonSet, applied; removed at the end with what it wrote on the Node."""
    cluster = node_cluster.cluster
    nodeaccess.install(cluster, (nodeaccess.AGENT_RBAC, nodeaccess.OWN_NODE))  # not the DRA's
    objects = as_deployed(node_sample, int(cluster.server.rsplit(":", 1)[1]), free_port())
    label = {"metadata": {"labels": {GPU_NODE_LABEL: "true"}}}
    await kube.patch(Node, real_node.name, label)
    try:
        for obj in objects:
            await kube.apply(obj, field_manager="rdmaplane-node-test", force=True)
        yield objects[1].to_dict()
    finally:
        await kube.delete(
            DaemonSet, "rdmaplane-agent", namespace=NAMESPACE,
            cascade=CascadeType.FOREGROUND,
        )  # fmt: skip
        await pods.until(lambda: _no_agent_pod(kube), "the agent's pod gone")
        await kube.delete(ConfigMap, "rdmaplane-agent", namespace=NAMESPACE)
        nodeaccess.uninstall(cluster)  # the tier's other agents run with credentials of their own
        with contextlib.suppress(ApiError):  # the next test's agent writes its own
            await kube.delete(NodeResourceTopology, real_node.name)
        gone = {k: None for k in (GPU_NODE_LABEL, *await _labels_of_ours(kube, real_node.name))}
        await kube.patch(
            Node, real_node.name, {"metadata": {"labels": gone}}, patch_type=PatchType.MERGE
        )


async def _labels_of_ours(kube: AsyncClient, node: str) -> list[str]:
    labels = (await kube.get(Node, node)).metadata.labels or {}  # type: ignore[union-attr]
    return [k for k in labels if k.startswith("rdmaplane.io/")]


async def _agent_pods(kube: AsyncClient) -> list[Pod]:
    selector = {"app.kubernetes.io/name": "rdmaplane-agent"}
    return [p async for p in kube.list(Pod, namespace=NAMESPACE, labels=selector)]


async def _no_agent_pod(kube: AsyncClient) -> bool:
    return not await _agent_pods(kube)


def ready(pod: Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


async def test_the_agent_daemonset_runs_from_rdmaplanes_image(
    deployed_agent: dict[str, Any], real_node: RealNode, node_sample: Path, kube: AsyncClient
) -> None:
    (pod,) = await pods.until(lambda: _agent_pods(kube), "the DaemonSet controller's pod")
    assert pod.spec is not None and pod.metadata is not None
    name = pod.metadata.name
    try:
        pod = await pods.until(
            lambda: _ready_pod(kube, name), f"{name} Ready (its probes, through the host port)"
        )
    except AssertionError as err:
        shown = await kube.get(Pod, name, namespace=NAMESPACE)
        logged = await pods.log(kube, NAMESPACE, name, container="agent")
        raise AssertionError(f"{err}\n{shown.status}\n--- its log:\n{logged[-4000:]}") from None
    assert pod.spec is not None and pod.spec.nodeName == real_node.name
    (status,) = pod.status.containerStatuses or []  # type: ignore[union-attr]
    assert status.image == IMAGE and status.restartCount == 0, status
    hcas = topology(node_sample).hcas
    mellanox = [h for h in hcas if h.pci and h.pci.vendor.removeprefix("0x") == "15b3"]
    assert mellanox
    await pods.until(
        lambda: _allocatable_is(kube, real_node.name, len(mellanox)),
        f"the Node's {HCA} from the agent's device plugin",
    )
    published = await pods.until(
        lambda: _nrt(kube, real_node.name), "the agent's NodeResourceTopology"
    )
    assert published["zones"], published
    labels = await pods.until(
        lambda: _labels(kube, real_node.name), f"the agent's {nrt.LABEL_RDMA} label"
    )
    assert labels[nrt.LABEL_RDMA] == "true", labels


async def _ready_pod(kube: AsyncClient, name: str) -> Pod | None:
    pod = await kube.get(Pod, name, namespace=NAMESPACE)
    assert pods.phase(pod) in ("Pending", "Running"), pod.status
    return pod if ready(pod) else None


async def _allocatable_is(kube: AsyncClient, node: str, count: int) -> bool:
    return await allocatable(kube, node, HCA) == count


async def _nrt(kube: AsyncClient, node: str) -> dict[str, Any] | None:
    try:
        found = await kube.get(NodeResourceTopology, node)
    except ApiError as e:
        if e.status.code == 404:
            return None
        raise
    return dict(found.to_dict())


async def _labels(kube: AsyncClient, node: str) -> dict[str, str] | None:
    labels = (await kube.get(Node, node)).metadata.labels or {}  # type: ignore[union-attr]
    return labels if nrt.LABEL_RDMA in labels else None
