"""The scale scenario, reduced to fit `make test` (bench/cluster.py runs it at 1,000 and 5,000
nodes): 200 KWOK GPU nodes from the bundled samples with mixed Topology Manager policies, each
with the NodeResourceTopology its agent would publish, the real kube-scheduler configured with
deploy/scheduler/kube-scheduler-config.yaml, and the extender as deployed (its own process, its
ServiceAccount's RBAC), on the control plane of `kwok_cluster`.

A stream of GPU + HCA pods and CPU-only pods: none is lost, no node holds more than it has,
and every pod with devices lands where the kubelet would admit it (our model of its admission,
the extender's policy, itself judged by the kubelet's own code in tests/kubelet). Then two replicas
behind one address, killed and restarted mid-stream: pods keep binding (without the extender
while none runs: `ignorable`), a restarted replica lists everything again and answers exactly
as the one that stayed.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from lightkube import AsyncClient

from tests.e2e import fleet, scalerig
from tests.e2e.conftest import KwokCluster
from tests.e2e.controlplane import Process, free_port, launch_scheduler

NODES = 200
PODS = 240
RATE = 25.0  # pods a second: each decision sees the previous pod's binding (see the docs)
FAILOVER_PODS = 100


@dataclass
class Scale:
    kube: AsyncClient
    kwok: KwokCluster
    nodes: list[fleet.FleetNode]
    replicas: scalerig.Replicas


@pytest.fixture
async def scale(kwok_cluster: KwokCluster) -> AsyncIterator[Scale]:
    cluster = kwok_cluster.cluster
    with cluster.client() as client:
        scalerig.install_extender_rbac(client)
    nodes = fleet.plan(NODES, seed=7, prefix=f"scale-{uuid.uuid4().hex[:5]}")
    kubeconfig = scalerig.extender_kubeconfig(cluster)
    replicas = scalerig.Replicas(cluster, kubeconfig, [free_port(), free_port()])
    async with cluster.async_client() as kube:
        try:
            await fleet.create(kube, nodes)
            await replicas.start(replicas.ports[0])
            yield Scale(kube, kwok_cluster, nodes, replicas)
        finally:
            replicas.stop()
            await fleet.delete(kube, nodes)


@contextlib.contextmanager
def scheduler(kwok: KwokCluster, config: dict[str, object]) -> Iterator[Process]:
    process = launch_scheduler(kwok.cluster, config)
    try:
        yield process
    finally:
        process.stop()


async def test_a_stream_through_the_extender(scale: Scale) -> None:
    kube = scale.kube
    url = scale.replicas.urls()[0]
    label = scale.nodes[0].labels[fleet.FLEET_LABEL]
    namespace = await scalerig.create_namespace(kube, "scale")
    pods = scalerig.bodies(namespace, label, "p", fleet.stream(PODS, seed=11))
    assert set(map(fleet.gpus_of, pods)) == {g for g, _ in fleet.SHAPES}  # every shape
    sent: dict[str, float] = {}
    with scheduler(scale.kwok, scalerig.scheduler_config(url)):
        async with fleet.Bindings(kube, namespace) as seen:
            await scalerig.create_paced(kube, pods, RATE, sent)
            lost = await seen.wait_for(sent, scalerig.BIND_WITHIN_S)
    assert not lost, f"{len(lost)} pods never bound: {sorted(lost)[:10]}"
    by_name = {p["metadata"]["name"]: p for p in pods}
    assert fleet.overbooked(scale.nodes, by_name, seen.bound) == {}
    assert fleet.refused(scale.nodes, by_name, seen.bound) == {}
    # the extender decided every pod that asks for devices, and saw every one bound
    asked = sum(map(scalerig.asks_devices, pods))
    assert await scalerig.metric(url, "rdmaplane_extender_requests_total", verb="filter") >= asked
    await scalerig.empty(kube, namespace, [url])


async def test_replicas_killed_and_restarted_mid_stream(scale: Scale) -> None:
    result = await scalerig.failover(
        scale.kube,
        scale.replicas,
        scale.nodes,
        lambda config: launch_scheduler(scale.kwok.cluster, config),
        FAILOVER_PODS,
        RATE,
        seed=13,
    )
    phases = {p.name: p for p in result.phases}
    assert result.unbound == 0 and all(p.bound == p.pods for p in result.phases)
    # one replica left: it answers every pod; none left: kube-scheduler binds without them
    assert phases["one killed"].answered >= phases["one killed"].asked > 0
    assert phases["both killed"].answered == 0 and phases["both killed"].asked > 0
    assert phases["both back"].answered >= phases["both back"].asked
    assert result.refused == {}
    assert all(line.startswith("identical") for line in result.answers), result.answers
    assert len(result.answers) == 2
