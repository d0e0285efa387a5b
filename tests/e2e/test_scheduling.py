"""The real kube-scheduler places pods by the GPUs and HCAs that nodes advertise as extended
resources, and leaves a pod that no single node can hold Pending with a FailedScheduling event."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from lightkube import AsyncClient
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.events_v1 import Event

from tests.e2e.controlplane import Process, add_ready_node

GPU = "nvidia.com/gpu"
HCA = "rdmaplane.io/hca"
GROUP_LABEL = "e2e.rdmaplane.io/group"
WAIT_S = 60.0


@dataclass(frozen=True)
class GpuNodes:
    """Three nodes only this test's pods may use (by a node selector on a per-test label):
    GPUs without HCAs, HCAs without GPUs, and a smaller node with both."""

    group: str
    gpus_only: str
    hcas_only: str
    both: str


@pytest.fixture
async def gpu_nodes(kube: AsyncClient) -> AsyncIterator[GpuNodes]:
    group = uuid.uuid4().hex[:8]
    nodes = GpuNodes(group, f"gpus-only-{group}", f"hcas-only-{group}", f"both-{group}")
    await add_ready_node(kube, nodes.gpus_only, {GROUP_LABEL: group}, {GPU: "8"})
    await add_ready_node(kube, nodes.hcas_only, {GROUP_LABEL: group}, {HCA: "8"})
    await add_ready_node(kube, nodes.both, {GROUP_LABEL: group}, {GPU: "4", HCA: "4"})
    yield nodes
    for name in (nodes.gpus_only, nodes.hcas_only, nodes.both):
        await kube.delete(Node, name)


@pytest.fixture
def scheduler(start_scheduler: Callable[..., Process]) -> Process:
    # Given as a dict to exercise the pass-through; the profile is the default one, spelled out.
    return start_scheduler({"profiles": [{"schedulerName": "default-scheduler"}]})


async def create_pod(
    kube: AsyncClient, namespace: str, nodes: GpuNodes, gpus: int, hcas: int
) -> str:
    name = f"train-{uuid.uuid4().hex[:6]}"
    limits = {GPU: str(gpus), HCA: str(hcas)}  # extended resources: requests default to limits
    pod = Pod(
        metadata=ObjectMeta(name=name, namespace=namespace),
        spec=PodSpec(
            nodeSelector={GROUP_LABEL: nodes.group},
            containers=[
                Container(
                    name="trainer",
                    image="registry.example/trainer:1",
                    resources=ResourceRequirements(limits=limits),
                )
            ],
        ),
    )
    await kube.create(pod)
    return name


async def bound_node(kube: AsyncClient, namespace: str, name: str) -> str:
    """The node the scheduler bound the pod to, once its PodScheduled condition is True."""
    pod = await asyncio.wait_for(
        kube.wait(Pod, name, namespace=namespace, for_conditions=["PodScheduled"]), WAIT_S
    )
    assert pod.spec is not None and pod.spec.nodeName
    return pod.spec.nodeName


async def failed_scheduling_note(kube: AsyncClient, namespace: str, pod_name: str) -> str:
    """The note of the scheduler's FailedScheduling event about the pod, once there is one."""
    async with asyncio.timeout(WAIT_S):
        while True:
            async for event in kube.list(Event, namespace=namespace):
                if event.reason == "FailedScheduling" and event.regarding.name == pod_name:
                    return event.note or ""
            await asyncio.sleep(0.5)


async def test_pod_that_no_single_node_can_hold_stays_pending(
    kube: AsyncClient, namespace: str, gpu_nodes: GpuNodes, scheduler: Process
) -> None:
    # 12 GPUs and 12 HCAs exist among the nodes, but no node has 8 GPUs and an HCA.
    pod = await create_pod(kube, namespace, gpu_nodes, gpus=8, hcas=1)

    note = await failed_scheduling_note(kube, namespace, pod)

    assert "0/" in note
    assert f"Insufficient {GPU}" in note
    assert f"Insufficient {HCA}" in note
    stored = await kube.get(Pod, pod, namespace=namespace)
    assert stored.spec is not None and stored.spec.nodeName is None
    assert stored.status is not None and stored.status.phase == "Pending"


async def test_pod_binds_to_the_only_node_holding_both_and_its_devices_are_counted(
    kube: AsyncClient, namespace: str, gpu_nodes: GpuNodes, scheduler: Process
) -> None:
    first = await create_pod(kube, namespace, gpu_nodes, gpus=4, hcas=2)
    assert await bound_node(kube, namespace, first) == gpu_nodes.both

    # The same request again: the only node with both kinds has no GPU left.
    second = await create_pod(kube, namespace, gpu_nodes, gpus=4, hcas=2)

    note = await failed_scheduling_note(kube, namespace, second)
    assert f"Insufficient {GPU}" in note
