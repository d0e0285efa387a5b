"""The real kube-scheduler pairs GPUs with RDMA NICs through DRA: the driver's ResourceSlices
for a sample node (published by the driver's own code) and GPU slices of the same sample as
NVIDIA's GPU DRA driver publishes them; kube-scheduler configured by
deploy/dra/kube-scheduler-config.yaml; pods naming deploy/dra/'s ResourceClaimTemplates, their
claims made by kube-controller-manager's resourceclaim controller, and the device taint
eviction controller acting on the driver's NoExecute taints. A port that is down is never
allocated, whether down from the start or later, compute or storage; and every sample's slice,
as the API server holds it, agrees with the device plugin on every device."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from rdmaplane.adapters.discovery.samples import read_sample
from rdmaplane.core.faults import TAINT_KEY, Fault, FaultClass
from rdmaplane.core.nrt import Uplink
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.services.dra.policy.readiness import FAILED, READY
from rdmaplane.services.dra.policy.slices import BANDWIDTH
from tests.e2e.controlplane import KubeCluster, Process, launch_controller_manager
from tests.e2e.dra import (
    DRA_SCHEDULER_CONFIG,
    DRIVER,
    GPU_DRIVER,
    SHARED,
    DraNode,
    allocation,
    bound_node,
    claim_pod,
    dra_node,
    ensure_device_classes,
    failed_scheduling_note,
    nics,
    pending,
    shares,
    slice_devices,
    template_pod,
    until,
)
from tests.e2e.drafleet import Verdict, judge_claim, promised
from tests.unit.test_dra_agrees_with_plugin import (
    SAMPLES,
    plugin_verdicts,
    slice_verdicts,
    storage_and_first_compute,
)
from tests.unit.test_dra_devices import with_ports_down

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
CANNOT = "cannot allocate all claims"
PORT_DOWN = (TAINT_KEY, "PortDown", "NoSchedule")


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
    """kube-scheduler configured as docs/dra.md recommends (deploy/dra's file, as shipped)."""
    return start_scheduler(DRA_SCHEDULER_CONFIG.read_text())


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


def paired(verdict: Verdict) -> int:
    """The GPUs of a claim the pairing judge (tests/e2e/drafleet.py, the bench's and the scale
    test's) finds each beside a NIC of the claim, the claim's own terms kept; fails otherwise."""
    assert (verdict.wrong, verdict.unaligned) == ([], []), verdict
    assert verdict.paired
    return verdict.gpus


def by_request(results: list[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    return {r["request"]: (r["driver"], r["device"]) for r in results}


def nics_of(results: list[Mapping[str, Any]]) -> set[str]:
    return {r["device"] for r in results if r["driver"] == DRIVER}


def taints_said(device: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {(t["key"], t["value"], t["effect"]) for t in device.get("taints", [])}


def only(*hcas: str) -> dict[str, Any]:
    """A claim for the NIC ports of `hcas` (a CEL selector on the driver's attribute)."""
    rule = f"device.attributes['{DRIVER}'].rdmaDevice in {list(hcas)!r}"
    request = {
        "deviceClassName": DRIVER,
        "selectors": [{"cel": {"expression": rule}}],
        "allocationMode": "ExactCount",
        "count": len(hcas),
    }
    return {"devices": {"requests": [{"name": "nics", "exactly": request}]}}


async def stays_pending(kube: AsyncClient, namespace: str, pod: str) -> None:
    """The scheduler said it cannot allocate the pod's claim, and the pod is not bound."""
    note = await failed_scheduling_note(kube, namespace, pod, CANNOT)
    assert "1 cannot allocate all claims" in note, note
    assert await pending(kube, namespace, pod)


async def test_the_rail_selector_gives_each_gpu_the_nic_of_its_rail_or_the_pod_waits(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    """examples/dra-rails.yaml's template: where the NICs name their rails (HCA k on rail k),
    GPUs 0-3 get the NICs on rails 0-3, each on its GPU's root; where they name none, the pod
    waits and the scheduler says it cannot allocate (the selector tests the attribute is
    there: reading a missing one would be a CEL error, aborting the allocation)."""
    topo = read_sample("hgx-h100-roce")
    compute = [topo.hca(f"mlx5_{k}") for k in range(8)]
    uplinks = [
        Uplink(h.name, f"rail-{k}", k, "", -1, h.pcie_root) for k, h in enumerate(compute) if h
    ]
    async with dra_node(kube, "hgx-h100-roce", uplinks=uplinks) as node:
        pod, claim = await template_pod(kube, namespace, node, "gpu-nic-rails-0-3")
        got = by_request(await allocation(kube, namespace, claim))
        for k in range(4):
            nic = node.driver.devices[got[f"nic-{k}"][1]]
            assert nic.attribute("rail") == k and nic.hca == f"mlx5_{k}"
        assert paired(await judge_claim(kube, namespace, claim, roots(node))) == 4
        assert await bound_node(kube, namespace, pod) == node.name
    async with dra_node(kube, "hgx-h100-roce") as unknown:
        pod, _ = await template_pod(kube, namespace, unknown, "gpu-nic-rails-0-3")
        await stays_pending(kube, namespace, pod)


# Four GPUs with the NICs beside them: half an HGX node (one socket, by its numaNode
# constraint) and a whole GB300 node (every GPU and every compute NIC), where each ConnectX-8 is
# on its GPU's root only by its Data Direct function
@pytest.mark.parametrize(
    ("sample", "template"), [("hgx-h100-roce", "gpu-nic-numa-x4"), ("gb300-cx8", "gpu-nic-node")]
)
async def test_four_gpus_get_the_nic_on_their_pcie_root(
    kube: AsyncClient, namespace: str, scheduler: Process, sample: str, template: str
) -> None:
    async with dra_node(kube, sample) as node:
        pod, claim = await template_pod(kube, namespace, node, template)

        results = await allocation(kube, namespace, claim)

        where = roots(node)
        gpus = {(r["driver"], r["device"]) for r in results if r["driver"] == GPU_DRIVER}
        ours = {(r["driver"], r["device"]) for r in results if r["driver"] == DRIVER}
        assert len(gpus) == len(ours) == len(results) // 2 == 4
        # four GPUs on four roots, each with one of the claim's NICs on its root: the pairing
        # judge's aligned check, as the template's comment promises on this sample
        assert paired(await judge_claim(kube, namespace, claim, where)) == 4
        assert promised(template, sample)
        assert len({where[g] for g in gpus}) == 4
        for _, nic in ours:
            hca = node.topo.hca(node.driver.devices[nic].hca)
            assert hca is not None and hca.pci is not None
            if hca.data_direct is not None:  # paired through it, not the NIC's own root
                assert hca.pci.root != where[(DRIVER, nic)] == hca.data_direct.root
        # bound once the driver said each NIC is ready (its binding condition)
        assert await bound_node(kube, namespace, pod) == node.name
        stored = (await kube.get(ResourceClaim, claim, namespace=namespace)).to_dict()
        said = {d["device"]: d["conditions"] for d in stored["status"]["devices"]}
        assert set(said) == {nic for _, nic in ours}
        for conditions in said.values():
            ready = next(c for c in conditions if c["type"] == READY)
            assert (ready["status"], ready["reason"]) == ("True", "PortReady")


async def test_a_request_that_cannot_be_paired_stays_pending_and_pairs_that_can_fit(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    # A PCIe server: two GPUs share a root complex with a 400G NIC, the others have none beside
    # them, and NUMA node 0 has four GPUs but two compute NICs: half a node does not fit, the
    # two pairs that exist do.
    async with dra_node(kube, "pcie-l40s-split") as node:
        pod, _ = await template_pod(kube, namespace, node, "gpu-nic-numa-x4")

        note = await failed_scheduling_note(kube, namespace, pod, CANNOT)

        assert "1 cannot allocate all claims" in note, note  # the other nodes: other reasons
        assert await pending(kube, namespace, pod)

        _, pairs_claim = await template_pod(kube, namespace, node, "gpu-nic-pcie-x2")
        got = by_request(await allocation(kube, namespace, pairs_claim))
        assert paired(await judge_claim(kube, namespace, pairs_claim, roots(node))) == 2
        assert {got["gpu-0"], got["gpu-1"]} == {(GPU_DRIVER, "gpu-0"), (GPU_DRIVER, "gpu-2")}


async def test_a_tainted_nic_is_not_allocated_until_its_fault_clears(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    async with dra_node(kube, "hgx-h100-roce") as node:
        node.faults[("mlx5_0", 1)] = Fault("mlx5_0", 1, FaultClass.FATAL, "port 1 DOWN", 0.0)
        await node.publish()
        tainted = node.device_of("mlx5_0")

        # A whole node takes every compute NIC, mlx5_0 (GPU0's) among them.
        pod, claim = await template_pod(kube, namespace, node, "gpu-nic-node-x8")
        await failed_scheduling_note(kube, namespace, pod, CANNOT)
        assert await pending(kube, namespace, pod)

        node.faults.clear()
        await node.publish()
        assert node.driver.publisher is not None
        assert not await node.driver.publisher.publish_once()  # the server holds it: no write
        assert tainted in nics_of(await allocation(kube, namespace, claim))


async def test_a_fatal_fault_evicts_the_pods_that_do_not_tolerate_it(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    async with dra_node(kube, "hgx-h100-roce") as node:
        pod, claim = await template_pod(kube, namespace, node, "gpu-nic-pcie-x1")
        tolerant, tolerant_claim = await claim_pod(kube, namespace, node, TOLERANT)
        for running in (pod, tolerant):  # bound first: a pod not yet bound is sent back instead
            await bound_node(kube, namespace, running)
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


async def test_ports_down_from_the_start_go_to_no_nic_claim_and_no_pair(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    # The node: the dual-port storage NIC (200G RoCE beside 400G InfiniBand compute
    # NICs, on NUMA node 0 with four GPUs) has both ports down when the driver starts.
    storage = ("mlx5_1", "mlx5_2")
    async with dra_node(kube, "hgx-h200-ib", down=storage) as node:
        stored = await slice_devices(kube, node.name)
        down = {node.device_of(h) for h in storage}
        assert {n: taints_said(d) for n, d in stored.items()} == {
            n: {PORT_DOWN} if n in down else set() for n in stored
        }

        # NUMA node 1's NICs and node 0's first compute NIC taken: half a node needs four
        # compute NICs on one NUMA node, and node 0 has three left beside its storage ports.
        taken = ("mlx5_0", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_10", "mlx5_11")
        _, taker = await claim_pod(kube, namespace, node, only(*taken))
        assert nics_of(await allocation(kube, namespace, taker)) == {
            node.device_of(h) for h in taken
        }
        pairs, _ = await template_pod(kube, namespace, node, "gpu-nic-numa-x4")
        await stays_pending(kube, namespace, pairs)

        # The ports left that are up in one NIC-only claim; then nothing for another claim,
        # not even one that tolerates the fault classes' NoExecute taints.
        healthy = len(stored) - len(down) - len(taken)
        _, rest = await claim_pod(kube, namespace, node, nics(healthy))
        got = nics_of(await allocation(kube, namespace, rest))
        assert len(got) == healthy and not got & down
        last, _ = await claim_pod(kube, namespace, node, TOLERANT)
        await stays_pending(kube, namespace, last)


async def test_a_port_that_goes_down_later_is_allocated_to_no_claim_until_it_is_up(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    async with dra_node(kube, "hgx-h100-roce") as node:
        sample = node.topo
        # A compute port goes down; no fault is raised yet (the fault classes wait
        # `fatalAfter`), but the port cannot be handed out now.
        node.topo = with_ports_down(sample, "mlx5_0")
        await node.publish()
        compute = node.device_of("mlx5_0")
        assert taints_said((await slice_devices(kube, node.name))[compute]) == {PORT_DOWN}

        # A whole node takes every compute NIC, mlx5_0 (GPU0's) among them.
        pairs, pairs_claim = await template_pod(kube, namespace, node, "gpu-nic-node-x8")
        await stays_pending(kube, namespace, pairs)
        node.topo = sample
        await node.publish()
        assert compute in nics_of(await allocation(kube, namespace, pairs_claim))

        # Left: the bonded storage port, a class the fault classes never judge. It goes down.
        storage = node.device_of("mlx5_bond_0")
        node.topo = with_ports_down(sample, "mlx5_bond_0")
        await node.publish()
        nic, nic_claim = await claim_pod(kube, namespace, node, TOLERANT)
        await stays_pending(kube, namespace, nic)
        node.topo = sample
        await node.publish()
        assert nics_of(await allocation(kube, namespace, nic_claim)) == {storage}


async def test_a_port_down_between_allocation_and_binding_sends_the_pod_elsewhere(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    group = uuid.uuid4().hex[:8]
    async with (
        dra_node(kube, "hgx-h100-roce", group=group, claim_status=False) as a,
        dra_node(kube, "hgx-h100-roce", group=group, claim_status=False) as b,
    ):
        nodes = {a.name: a, b.name: b}
        pod, claim = await claim_pod(kube, namespace, group, only("mlx5_0"))
        # kube-scheduler allocated the claim on one node and waits in PreBind for the NIC's
        # binding condition; the drivers have not said anything yet
        (result,) = await allocation(kube, namespace, claim)
        first = nodes.pop(result["pool"])
        (other,) = nodes.values()
        assert result["bindingConditions"] == [READY]
        assert await pending(kube, namespace, pod)

        first.topo = with_ports_down(first.topo, "mlx5_0")
        await first.publish()  # tainted PortDown: no claim gets it again
        assert await first.write_claim_status() == 1
        stored = (await kube.get(ResourceClaim, claim, namespace=namespace)).to_dict()
        (said,) = stored["status"]["devices"]
        failed = next(c for c in said["conditions"] if c["type"] == FAILED)
        assert (failed["status"], failed["reason"]) == ("True", "PortDown")

        # the scheduler gives the allocation up and allocates again: the other node's NIC,
        # which its driver says is ready
        async with other.claim_status_written():
            assert await bound_node(kube, namespace, pod) == other.name
        (moved,) = await allocation(kube, namespace, claim)
        assert moved["pool"] == other.name and moved["device"] == other.device_of("mlx5_0")


async def bound_share(
    kube: AsyncClient, namespace: str, node: DraNode, spec: dict[str, Any]
) -> tuple[str, str, list[Mapping[str, Any]]]:
    """A pod with a claim for shares, once it is bound (its results). One at a time: while a
    pod waits for its binding conditions, kube-scheduler v1.37.2 counts its shares twice (the
    claim it wrote and its allocation still in flight: GatherAllocatedState), so a share
    asked for meanwhile may not fit until that pod is bound."""
    pod, claim = await claim_pod(kube, namespace, node, spec)
    results = await allocation(kube, namespace, claim)
    assert await bound_node(kube, namespace, pod) == node.name
    return pod, claim, list(results)


async def test_pods_take_shares_of_a_shared_nic_until_its_bandwidth_is_used(
    kube: AsyncClient, namespace: str, scheduler: Process
) -> None:
    async with dra_node(kube, "hgx-h100-roce", SHARED) as node:
        stored = await slice_devices(kube, node.name)
        shared = {node.device_of("mlx5_0"), node.device_of("mlx5_1")}
        assert set(stored) == shared
        for name in shared:
            assert stored[name]["allowMultipleAllocations"] is True
            assert stored[name]["capacity"][BANDWIDTH]["value"] == "400G"
        # deploy/dra's template: two 200G shares on two distinct NICs, one on each port
        pod, claim = await template_pod(kube, namespace, node, "nic-share-200g-x2-distinct")
        wide = await allocation(kube, namespace, claim)
        assert await bound_node(kube, namespace, pod) == node.name
        assert {r["device"] for r in wide} == shared
        assert all(r["consumedCapacity"] == {BANDWIDTH: "200G"} and r["shareID"] for r in wide)
        # 200G left on each: two 200G shares fit...
        fits = [await bound_share(kube, namespace, node, shares(200)) for _ in range(2)]
        assert {r["device"] for _, _, (r,) in fits} == shared
        assert all(r["consumedCapacity"] == {BANDWIDTH: "200G"} for _, _, (r,) in fits)
        # ...and then a default (100G) one waits
        last, last_claim = await claim_pod(kube, namespace, node, shares(None))
        await stays_pending(kube, namespace, last)

        # one pod and its claim go: the waiting one gets that share
        gone_pod, gone_claim, (freed,) = fits[0]
        await kube.delete(Pod, gone_pod, namespace=namespace, grace_period=0)
        await kube.delete(ResourceClaim, gone_claim, namespace=namespace)
        (result,) = await allocation(kube, namespace, last_claim)
        assert result["device"] == freed["device"]


@pytest.mark.parametrize("sample", sorted(SAMPLES))
async def test_every_samples_slice_agrees_with_the_device_plugin(
    kube: AsyncClient, sample: str
) -> None:
    config = PluginSettings()
    for down in ((), storage_and_first_compute(SAMPLES[sample])):
        async with dra_node(kube, sample, config, down=down) as node:
            ours = {"spec.nodeName": node.name, "spec.driver": DRIVER}
            stored = [s.to_dict() async for s in kube.list(ResourceSlice, fields=ours)]
            dra = slice_verdicts(stored)
            plugin = plugin_verdicts(node.topo, config.pools, node.dev_root)
            assert dra == plugin, f"{sample}, down: {', '.join(down) or 'none'}"


# A claim for one NIC port that rides out the driver's fault taints.
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
