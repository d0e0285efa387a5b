"""The DRA round of bench/cluster.py, reduced to fit `make test` (the bench runs it at 1,000 and
5,000 nodes): 200 KWOK GPU nodes from the bundled samples, each with rdmaplane's DRA driver's
ResourceSlice (the driver's own code) and its GPUs as NVIDIA's GPU DRA driver publishes them,
kube-controller-manager's resourceclaim controller making the pods' claims from deploy/dra/'s
shipped templates by GPU count (the webhook's default table: gpu-nic-pcie-x1, gpu-nic-pcie-x2,
gpu-nic-numa-x4, gpu-nic-node-x8), and the real kube-scheduler, no extender, allocating them: a
burst (the claims made before the scheduler starts, as the bench measures it), then a paced
stream.

Every pod binds; every claim's allocation in the API server keeps its own terms
(`drafleet.judge_allocation`) on the pod's node, no device in two claims, and every GPU has a
NIC port of its claim on its own PCIe root wherever the template's comment promises that on the
node's shape; where it does not (an 8-GPU pod on the L40S server, whose two NICs the whole-node
template takes with all eight GPUs), the GPUs without one are counted, not failed.

Then one smaller round of the bench's anchor (u) on the same fleet: the pods asking as many GPUs
and NIC ports through claims without pairing (`drafleet.unpaired_template`: `count: N` per
class, no constraint). Every pod binds, and every claim holds its GPUs and NIC ports of the right
drivers on the pod's node, none in two claims: the bench's DRA ÷ (u) compares rounds that both
do their work.

The largest claims come first, onto empty nodes, and the scheduler's DRA plugin runs without
its filterTimeout (10 s by default): the shipped templates are answered without a search
(tests/dra_allocator), but on two loaded cores a node's filter can still be slow, and a
timeout fails the pod's whole scheduling attempt. What the defaults cost a mixed stream is the
bench's to show (docs/dra.md); this test is about binding and pairing, whatever the machine's
load.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from lightkube import AsyncClient

from rdmaplane.core.settings.webhook import DraNodePool
from tests.e2e import drafleet, fleet, scalerig
from tests.e2e.conftest import KwokCluster
from tests.e2e.controlplane import Process, launch_controller_manager, launch_scheduler
from tests.e2e.dra import ensure_device_classes, templates

NODES = 200
PODS = 240  # half a burst, half paced
UNPAIRED_PODS = 80  # the anchor's round: small, it only has to bind and allocate
RATE = 25.0  # paced pods a second
NO_FILTER_TIMEOUT = {
    "profiles": [
        {
            "schedulerName": "default-scheduler",
            "pluginConfig": [{"name": "DynamicResources", "args": {"filterTimeout": "0s"}}],
        }
    ]
}


@dataclass
class DraFleet:
    kube: AsyncClient
    kwok: KwokCluster
    nodes: list[fleet.FleetNode]
    claims: Process  # kube-controller-manager with the resourceclaim controller


# One fleet for the module's rounds: they and the fixture share one event loop.
ROUNDS = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dra_fleet(kwok_cluster: KwokCluster) -> AsyncIterator[DraFleet]:
    cluster = kwok_cluster.cluster
    nodes = fleet.plan(NODES, seed=7, prefix=f"scale-dra-{uuid.uuid4().hex[:5]}")
    async with cluster.async_client() as kube:
        await ensure_device_classes(kube)
        claims = launch_controller_manager(
            cluster, ("resourceclaim-controller",), ("--kube-api-qps=200", "--kube-api-burst=400")
        )
        try:
            await fleet.create(kube, nodes)
            await drafleet.create_slices(kube, nodes)
            yield DraFleet(kube, kwok_cluster, nodes, claims)
        finally:
            claims.stop()
            await drafleet.delete_slices(kube, nodes)
            await fleet.delete(kube, nodes)


def test_every_shape_asks_the_shipped_template_the_webhook_names_for_it() -> None:
    for gpus, _ in fleet.SHAPES:
        if gpus:
            name = DraNodePool().template(gpus)
            assert name is not None, gpus
            assert drafleet.shipped_template(gpus) == templates()[name]


async def burst_then_stream(
    dra_fleet: DraFleet, prefix: str, gpus: list[int], *, paired: bool
) -> drafleet.Pairing:
    """Half the pods as a burst (their claims made before the scheduler starts), half paced; all
    bound, their claims judged, then the namespace emptied."""
    kube = dra_fleet.kube
    label = dra_fleet.nodes[0].labels[fleet.FLEET_LABEL]
    namespace = await scalerig.create_namespace(kube, prefix)
    await drafleet.create_templates(kube, namespace, gpus, paired=paired)
    make = drafleet.pod_body if paired else drafleet.unpaired_pod_body
    pods = scalerig.bodies(namespace, label, "p", gpus, make)
    burst, paced = pods[: len(pods) // 2], pods[len(pods) // 2 :]
    sent: dict[str, float] = {}
    async with fleet.Bindings(kube, namespace) as seen:
        await scalerig.create_pods(kube, burst, sent)
        asking = sum(1 for p in burst if drafleet.pairs_of(p))
        await drafleet.wait_for_claims(kube, namespace, asking, scalerig.BIND_WITHIN_S)
        scheduler = launch_scheduler(dra_fleet.kwok.cluster, NO_FILTER_TIMEOUT)
        try:
            lost = await seen.wait_for(sent, scalerig.BIND_WITHIN_S)
            await scalerig.create_paced(kube, paced, RATE, sent)
            lost |= await seen.wait_for(sent, scalerig.BIND_WITHIN_S)
        finally:
            scheduler.stop()
    assert not lost, f"{len(lost)} pods never bound: {sorted(lost)[:10]}"
    by_name = {p["metadata"]["name"]: p for p in pods}
    pairing = await drafleet.judge(kube, namespace, dra_fleet.nodes, by_name, seen.bound)
    assert pairing.claims == sum(1 for p in pods if drafleet.pairs_of(p))
    assert pairing.pairs == sum(gpus)
    assert (pairing.wrong, pairing.elsewhere, pairing.unallocated, pairing.doubled) == (
        [],
        [],
        [],
        [],
    )
    assert pairing.loose == 0 or paired, pairing.loose_where  # the anchor promises nothing
    await scalerig.empty(kube, namespace, [], claims=True)
    return pairing


@ROUNDS
async def test_a_burst_and_a_stream_bind_with_every_gpu_beside_its_nic(dra_fleet: DraFleet) -> None:
    gpus = sorted(fleet.stream(PODS, seed=17), reverse=True)
    assert set(gpus) == {g for g, _ in fleet.SHAPES}  # every shape, each its shipped template
    pairing = await burst_then_stream(dra_fleet, "scale-dra", gpus, paired=True)
    # every GPU beside a NIC of its claim, but those the whole-node template takes on the L40S
    # server without one (its comment says so; `loose_where` names them)
    assert pairing.aligned + pairing.loose == pairing.pairs, pairing.loose_where
    assert all("gpu-nic-node-x8, pcie-l40s-split" in x for x in pairing.loose_where)


@ROUNDS
async def test_the_unpaired_anchor_binds_every_pod_with_its_gpus_and_nics(
    dra_fleet: DraFleet,
) -> None:
    """The bench's (u): the same shapes, claims of `count: N` GPUs and N NIC ports unpaired."""
    gpus = sorted(fleet.stream(UNPAIRED_PODS, seed=19), reverse=True)
    assert set(gpus) == {g for g, _ in fleet.SHAPES}  # every shape
    pairing = await burst_then_stream(dra_fleet, "scale-dra-u", gpus, paired=False)
    assert 0 <= pairing.aligned <= pairing.pairs  # chance's pairs: reported by the bench
