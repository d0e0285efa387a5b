"""The real kube-scheduler pairs GPUs with RDMA NICs through DRA: the driver's ResourceSlices
for a sample node (published by the driver's own code) and GPU slices of the same sample as
NVIDIA's GPU DRA driver publishes them; pods naming deploy/dra/'s ResourceClaimTemplates, their
claims made by kube-controller-manager's resourceclaim controller, and the device taint
eviction controller acting on the driver's NoExecute taints."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from rdmaplane.faults import Fault, FaultClass
from tests.e2e.controlplane import KubeCluster, Process, launch_controller_manager
from tests.e2e.dra import (
    DRIVER,
    GPU_DRIVER,
    DraNode,
    allocation,
    claim_pod,
    dra_node,
    ensure_device_classes,
    failed_scheduling_note,
    template_pod,
    until,
)

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
CANNOT = "cannot allocate all claims"


@pytest.fixture(scope="module")
def claim_controllers(kube_cluster: KubeCluster) -> Iterator[Process]:
    """kube-controller-manager with the two DRA controllers only: claims for pods that name a
    template, and eviction of pods whose devices carry an untolerated NoExecute taint."""
    process = launch_controller_manager(
        kube_cluster, ("resourceclaim-controller", "device-taint-eviction-controller")
    )
    yield process
    process.stop()


@pytest.fixture
def scheduler(start_scheduler: Callable[..., Process], claim_controllers: Process) -> Process:
    return start_scheduler()


@pytest.fixture(autouse=True)
async def device_classes(kube: AsyncClient) -> None:
    await ensure_device_classes(kube)


def roots(node: DraNode) -> dict[tuple[str, str], str]:
    """(driver, device) → its PCIe root, from the sample both drivers describe."""
    out = {(GPU_DRIVER, f"gpu-{g.index}"): g.pci.root for g in node.topo.gpus}
    for name, device in node.driver.devices.items():
        root = device.attribute(PCIE_ROOT)
        assert isinstance(root, str)
        out[(DRIVER, name)] = root
    return out


def by_request(results: list[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    return {r["request"]: (r["driver"], r["device"]) for r in results}


async def pending(kube: AsyncClient, namespace: str, pod: str) -> bool:
    stored = await kube.get(Pod, pod, namespace=namespace)
    return stored.spec is not None and stored.spec.nodeName is None


async def test_four_gpus_get_the_nic_on_their_pcie_root(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    async with dra_node(kube, "hgx-h100-roce") as node:
        pod, claim = await template_pod(kube, namespace, node, "gpu-nic-pcie-x4")

        got = by_request(await allocation(kube, namespace, claim))

        where = roots(node)
        expected = [f"gpu-{k}" for k in range(4)] + [f"nic-{k}" for k in range(4)]
        assert sorted(got) == sorted(expected)
        for k in range(4):
            gpu, nic = got[f"gpu-{k}"], got[f"nic-{k}"]
            assert gpu[0] == GPU_DRIVER and nic[0] == DRIVER
            assert where[gpu] == where[nic], (
                f"pair {k}: {gpu} on {where[gpu]}, {nic} on {where[nic]}"
            )
        assert len({got[f"gpu-{k}"] for k in range(4)}) == 4
        bound = await kube.get(Pod, pod, namespace=namespace)
        assert bound.spec is not None and bound.spec.nodeName == node.name


async def test_a_request_that_cannot_be_paired_stays_pending_and_numa_pairs_fit(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    # A PCIe server: two GPUs share a root complex with a NIC, the others have none beside
    # them, so four PCIe pairs do not exist; four NUMA pairs do (NUMA node 0).
    async with dra_node(kube, "pcie-l40s-split") as node:
        pod, _ = await template_pod(kube, namespace, node, "gpu-nic-pcie-x4")

        note = await failed_scheduling_note(kube, namespace, pod, CANNOT)

        assert "1 cannot allocate all claims" in note, note  # the other nodes: other reasons
        assert await pending(kube, namespace, pod)

        _, numa_claim = await template_pod(kube, namespace, node, "gpu-nic-numa-x4")
        got = by_request(await allocation(kube, namespace, numa_claim))
        numa = {(GPU_DRIVER, f"gpu-{g.index}"): g.pci.numa for g in node.topo.gpus}
        numa |= {(DRIVER, n): d.attribute("numaNode") for n, d in node.driver.devices.items()}
        for k in range(4):
            assert numa[got[f"gpu-{k}"]] == numa[got[f"nic-{k}"]]


async def test_a_tainted_nic_is_not_allocated_until_its_fault_clears(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    async with dra_node(kube, "hgx-h100-roce") as node:
        node.faults[("mlx5_0", 1)] = Fault("mlx5_0", 1, FaultClass.FATAL, "port 1 DOWN", 0.0)
        await node.publish()
        tainted = node.device_of("mlx5_0")

        # Eight pairs need every NIC beside a GPU; GPU0's root holds only mlx5_0.
        pod, claim = await template_pod(kube, namespace, node, "gpu-nic-pcie-x8")
        await failed_scheduling_note(kube, namespace, pod, CANNOT)
        assert await pending(kube, namespace, pod)

        node.faults.clear()
        await node.publish()
        assert node.driver.publisher is not None
        assert not await node.driver.publisher.publish_once()  # the server holds it: no write
        got = by_request(await allocation(kube, namespace, claim))
        assert tainted in {device for _, device in got.values()}


async def test_a_fatal_fault_evicts_the_pods_that_do_not_tolerate_it(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    async with dra_node(kube, "hgx-h100-roce") as node:
        pod, claim = await template_pod(kube, namespace, node, "gpu-nic-pcie-x1")
        tolerant, tolerant_claim = await claim_pod(kube, namespace, node, TOLERANT)
        nics = [
            device
            for c in (claim, tolerant_claim)
            for driver, device in by_request(await allocation(kube, namespace, c)).values()
            if driver == DRIVER
        ]
        for nic in nics:
            hca = node.driver.devices[nic].hca
            node.faults[(hca, 1)] = Fault(hca, 1, FaultClass.FATAL, "port 1 DOWN", 0.0)
        await node.publish()

        async def evicted(name: str) -> str | None:
            stored = await kube.get(Pod, name, namespace=namespace)
            conditions = (stored.status.conditions if stored.status else None) or []
            target = [c.reason for c in conditions if c.type == "DisruptionTarget"]
            deleted = stored.metadata is not None and stored.metadata.deletionTimestamp
            return target[0] if target and deleted else None

        reason = await until(lambda: evicted(pod), f"{pod} evicted")
        assert reason == "DeletionByDeviceTaintManager"
        assert await evicted(tolerant) is None  # its claim tolerates the taint


# A claim for one NIC port that rides out the driver's taints.
TOLERANT = {
    "devices": {
        "requests": [
            {
                "name": "nic",
                "exactly": {
                    "deviceClassName": DRIVER,
                    "tolerations": [
                        {
                            "key": "rdmaplane.io/rdma-unhealthy",
                            "operator": "Exists",
                            "effect": "NoExecute",
                        }
                    ],
                },
            }
        ]
    }
}
