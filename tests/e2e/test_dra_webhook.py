"""No script in the pod on DRA nodes, judged by the real kube-apiserver (the webhook as
deploy/webhook/ installs it), kube-controller-manager's resourceclaim controller and the real
kube-scheduler, on a node whose HCA ports the DRA driver's own code publishes beside GPUs as
NVIDIA's GPU DRA driver publishes them:

- a plain GPU pod (`nvidia.com/gpu: 4`) in an opted-in namespace, selecting the DRA pool's
  label, is given by the webhook the claim of deploy/dra/'s template for 4 GPUs
  (gpu-nic-numa-x4, its GPU count moved into it), IPC_LOCK and /dev/shm; it binds, and the
  pairing judge (`drafleet.judge_allocation`) finds the template's terms kept and every GPU of
  its claim with a NIC port on its own PCIe root;
- a pod written for the device plugin (`nvidia.com/gpu: 2`, `rdmaplane.io/hca: 2`), sent to no
  webhook, binds unchanged to the DRA node through deploy/dra/deviceclass.yaml's classes'
  `extendedResourceName` (KEP-5004): kube-scheduler makes its claim, with 2 GPUs and 2 ports of
  the device plugin's own pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, cast

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaimTemplate

from rdmaplane.core.settings.webhook import CLAIM_TEMPLATES, DRA_NODE_LABEL
from tests.e2e import drafleet
from tests.e2e.controlplane import KubeCluster, Process, launch_controller_manager
from tests.e2e.dra import (
    DRIVER,
    GPU_DRIVER,
    GROUP_LABEL,
    WAIT_S,
    DraNode,
    allocation,
    bound_node,
    device_classes,
    dra_node,
    ensure_device_classes,
    templates,
)
from tests.webhook_server import deployed_webhook, webhook_namespaces

GPU, HCA = "nvidia.com/gpu", "rdmaplane.io/hca"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
SAMPLE = "hgx-h100-roce"


@pytest.fixture(scope="module")
def namespaces(kube_cluster: KubeCluster) -> Iterator[tuple[str, str]]:
    """The webhook as deployed (its default settings: one DRA pool, the nodes labelled
    rdmaplane.io/kubelet-plugin=dra), an opted-in namespace and a plain one."""
    with deployed_webhook(kube_cluster, {}), webhook_namespaces(kube_cluster) as pair:
        yield pair


@pytest.fixture(scope="module")
def claim_controller(kube_cluster: KubeCluster) -> Iterator[Process]:
    process = launch_controller_manager(kube_cluster, ("resourceclaim-controller",))
    yield process
    process.stop()


@pytest.fixture
def scheduler(start_scheduler: Callable[..., Process], claim_controller: Process) -> Process:
    return start_scheduler()


@pytest.fixture
async def classes(kube: AsyncClient) -> AsyncIterator[None]:
    """deploy/dra/deviceclass.yaml's classes, the extended-resource ones too; those removed
    afterwards (other tests expect device-plugin pods to stay off DRA nodes)."""
    await ensure_device_classes(kube, extended=True)
    yield
    for body in device_classes(extended=True):
        if "extendedResourceName" in body["spec"]:
            await kube.delete(DeviceClass, body["metadata"]["name"])


@pytest.fixture
async def node(kube: AsyncClient, classes: None) -> AsyncIterator[DraNode]:
    async with dra_node(kube, SAMPLE) as made:
        await kube.patch(Node, made.name, {"metadata": {"labels": {DRA_NODE_LABEL: "dra"}}})
        yield made


def _roots(node: DraNode) -> dict[tuple[str, str], str]:
    out = {(GPU_DRIVER, f"gpu-{g.index}"): g.pci.root for g in node.topo.gpus}
    for name, device in node.driver.devices.items():
        root = device.attribute(PCIE_ROOT)
        if isinstance(root, str):
            out[(DRIVER, name)] = root
    return out


async def _status(kube: AsyncClient, namespace: str, pod: str, key: str) -> Any:
    async with asyncio.timeout(WAIT_S):
        while True:
            stored = (await kube.get(Pod, pod, namespace=namespace)).to_dict()
            found = stored.get("status", {}).get(key)
            if found:
                return found
            await asyncio.sleep(0.25)


def _pod(name: str, limits: Mapping[str, str], selector: Mapping[str, str]) -> Pod:
    body = {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": dict(selector),
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example/trainer:1",
                    "resources": {"limits": dict(limits)},
                }
            ],
        },
    }
    return cast(Pod, Pod.from_dict(body))


async def test_the_webhook_gives_a_gpu_pod_on_a_dra_pool_its_paired_claim(
    kube: AsyncClient, namespaces: tuple[str, str], scheduler: Process, node: DraNode
) -> None:
    opted_in, _ = namespaces
    template = next(t.name for t in CLAIM_TEMPLATES if t.gpus == 4)
    body = {**templates()[template], "metadata": {"name": template, "namespace": opted_in}}
    try:
        await kube.create(cast(ResourceClaimTemplate, ResourceClaimTemplate.from_dict(body)))
    except ApiError as e:
        if e.status.code != 409:
            raise
    selector = {DRA_NODE_LABEL: "dra", GROUP_LABEL: node.group}
    created = await kube.create(_pod("trainer-dra", {GPU: "4"}, selector), namespace=opted_in)
    stored = created.to_dict()
    (claim_ref,) = stored["spec"]["resourceClaims"]
    assert claim_ref["resourceClaimTemplateName"] == template
    (container,) = stored["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": claim_ref["name"]}]
    assert not {GPU, HCA} & set(container["resources"].get("limits", {}))
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert "/dev/shm" in [m["mountPath"] for m in container["volumeMounts"]]

    (status,) = await _status(kube, opted_in, "trainer-dra", "resourceClaimStatuses")
    results = await allocation(kube, opted_in, status["resourceClaimName"])
    assert len([r for r in results if r["driver"] == DRIVER]) == 4
    # the template's own terms kept, each GPU with a NIC of the claim on its root (its comment
    # promises that on an HGX node)
    verdict = await drafleet.judge_claim(kube, opted_in, status["resourceClaimName"], _roots(node))
    assert (verdict.gpus, verdict.wrong, verdict.unaligned) == (4, [], []), verdict
    assert verdict.paired and drafleet.promised(template, SAMPLE)
    assert await bound_node(kube, opted_in, "trainer-dra") == node.name


async def test_a_device_plugin_pod_runs_unchanged_on_a_dra_node_through_the_device_classes(
    kube: AsyncClient, namespaces: tuple[str, str], scheduler: Process, node: DraNode
) -> None:
    _, plain = namespaces  # no webhook: the pod as written
    limits = {GPU: "2", HCA: "2"}
    created = await kube.create(
        _pod("trainer-plugin", limits, {GROUP_LABEL: node.group}), namespace=plain
    )
    assert "resourceClaims" not in created.to_dict()["spec"]
    assert await bound_node(kube, plain, "trainer-plugin") == node.name
    status = await _status(kube, plain, "trainer-plugin", "extendedResourceClaimStatus")
    mapped = {m["resourceName"] for m in status["requestMappings"]}
    assert mapped == {GPU, HCA}
    results = await allocation(kube, plain, status["resourceClaimName"])
    gpus = [r for r in results if r["driver"] == GPU_DRIVER]
    nics = [node.driver.devices[r["device"]] for r in results if r["driver"] == DRIVER]
    assert len(gpus) == 2 and len(nics) == 2
    assert {d.attribute("pool") for d in nics} == {HCA}
