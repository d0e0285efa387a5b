"""The real kube-scheduler pairs GPUs with RDMA NICs through DRA: the driver's ResourceSlices
for a sample node (published by the driver's own code) and GPU slices of the same sample as
NVIDIA's GPU DRA driver publishes them; claims from deploy/dra/'s templates."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from rdmaplane.dra.slices import FATAL, PortFault
from tests.e2e.controlplane import Process
from tests.e2e.dra import (
    DRIVER,
    GPU_DRIVER,
    DraNode,
    allocation,
    claim_pod,
    dra_node,
    ensure_device_classes,
    failed_scheduling_note,
)

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"


@pytest.fixture
def scheduler(start_scheduler: Callable[..., Process]) -> Process:
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


async def test_four_gpus_get_the_nic_on_their_pcie_root(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    async with dra_node(kube, "hgx-h100-roce") as node:
        pod, claim = await claim_pod(kube, namespace, node, "gpu-nic-pcie-x4")

        got = by_request(await allocation(kube, namespace, claim))

        where = roots(node)
        assert sorted(got) == sorted(
            [f"gpu-{k}" for k in range(4)] + [f"nic-{k}" for k in range(4)]
        )
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
        pod, _ = await claim_pod(kube, namespace, node, "gpu-nic-pcie-x4")

        note = await failed_scheduling_note(kube, namespace, pod)

        assert "cannot allocate all claims" in note, note
        stored = await kube.get(Pod, pod, namespace=namespace)
        assert stored.spec is not None and stored.spec.nodeName is None

        _, numa_claim = await claim_pod(kube, namespace, node, "gpu-nic-numa-x4")
        got = by_request(await allocation(kube, namespace, numa_claim))
        numa = {(GPU_DRIVER, f"gpu-{g.index}"): g.pci.numa for g in node.topo.gpus}
        numa |= {(DRIVER, n): d.attribute("numaNode") for n, d in node.driver.devices.items()}
        for k in range(4):
            assert numa[got[f"gpu-{k}"]] == numa[got[f"nic-{k}"]]


async def test_a_tainted_nic_is_not_allocated_until_its_fault_clears(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    async with dra_node(kube, "hgx-h100-roce") as node:
        node.faults[("mlx5_0", 1)] = PortFault(FATAL, "port 1 DOWN (DISABLED)")
        await node.publish()
        tainted = node.device_of("mlx5_0")

        # Eight pairs need every NIC beside a GPU; GPU0's root holds only mlx5_0.
        pod, claim = await claim_pod(kube, namespace, node, "gpu-nic-pcie-x8")
        note = await failed_scheduling_note(kube, namespace, pod)
        assert "cannot allocate all claims" in note, note

        stored = await kube.get(Pod, pod, namespace=namespace)
        assert stored.spec is not None and stored.spec.nodeName is None

        node.faults.clear()
        await node.publish()
        assert node.driver.publisher is not None
        assert not await node.driver.publisher.publish_once()  # the server holds it: no write
        got = by_request(await allocation(kube, namespace, claim))
        assert tainted in {device for _, device in got.values()}
