"""The fault chain on a real control plane: kube-apiserver, kube-scheduler with the rdmaplane
extender, kube-controller-manager (Job and taint-eviction controllers), KWOK for the nodes' pod
lifecycle, and the rdmaplane agent for node A (see `faultrig.py`) as deployed: its RBAC, the
own-node admission policies (deploy/agent/own-node.yaml), and the token of its DaemonSet pod
on A (`tests/e2e/nodeaccess.py`).

A port under the pod on A goes down → the fault notice (annotation + Event) → after the grace
period the RDMAFault condition and an eviction → KWOK fails the pod → the Job controller
replaces it without counting a failure → the scheduler and the extender place the replacement
on the spare node (A has only 7 healthy HCAs left).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube.resources.batch_v1 import Job
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Event, Node, Pod

from rdmaplane.core.repeat import CLEAR_ANNOTATION, HISTORY_ANNOTATION, QUARANTINE_TAINT_KEY
from rdmaplane.core.settings.agent import BreakerSettings, RepeatSettings
from rdmaplane.services.agent.breaker import BUDGET_ANNOTATION
from rdmaplane.services.agent.root import Agent
from tests.e2e import nodeaccess
from tests.e2e.conftest import KwokCluster
from tests.e2e.controlplane import KubeCluster, Process, launch_scheduler
from tests.e2e.faultrig import (
    CHAIN_S,
    FAULT,
    NOTICE,
    Proxy,
    Rig,
    absent,
    add_spare,
    condition_true,
    fault_rig,
    placed_on,
    serve_extender,
    start_job,
)
from tests.e2e.test_agent import (  # noqa: F401  (fixtures)
    Lister,
    _metrics_url,
    eventually,
    kubelet,
    tree,
    workdir,
)


async def _metric(agent: Agent, name: str, **labels: str) -> float:
    """The sum of a metric's samples that carry `labels`, scraped from the agent's /metrics
    (the agent serves it on this event loop: never a blocking request here)."""
    async with httpx.AsyncClient() as client:
        body = (await client.get(_metrics_url(agent), timeout=10)).text
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith(name + "{") and all(w in line for w in wanted)
    )


RigFactory = Callable[..., contextlib.AbstractAsyncContextManager[tuple[Rig, Agent]]]


@dataclass(frozen=True)
class FaultEnv:
    """The kwok cluster as these tests use it: the agent's access as deployed (its RBAC, the
    own-node policies) and the extender watching that cluster."""

    cluster: KubeCluster
    extender: str

    def agent_kubeconfig(self, node: str) -> Path:
        """The token of the agent's DaemonSet pod on `node`."""
        return nodeaccess.kubeconfig_on(self.cluster, node)


@pytest.fixture(scope="module")
def fault_env(kwok_cluster: KwokCluster) -> Iterator[FaultEnv]:
    cluster = kwok_cluster.cluster
    nodeaccess.install(cluster)
    with serve_extender(cluster) as url:
        yield FaultEnv(cluster, url)


@pytest.fixture
async def chain(
    fault_env: FaultEnv,
    tree: Path,  # noqa: F811
    workdir: Path,  # noqa: F811
    kubelet: Lister,  # noqa: F811
) -> AsyncIterator[RigFactory]:
    """`fault_rig` in a fresh namespace of the kwok cluster: `async with chain() as (rig,
    agent)`, or `chain(agent_kubeconfig=other)` (node → kubeconfig). Its kube-schedulers stop
    after the test."""
    cluster = fault_env.cluster
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(namespace)
    schedulers: list[Process] = []
    async with cluster.async_client() as kube:
        yield functools.partial(
            fault_rig,
            kube=kube,
            namespace=namespace,
            agent_kubeconfig=fault_env.agent_kubeconfig,
            tree=tree,
            workdir=workdir,
            kubelet=kubelet,
            start_scheduler=lambda config: schedulers.append(launch_scheduler(cluster, config)),
            extender_url=fault_env.extender,
        )
    for process in schedulers:
        process.stop()


# ---------------------------------------------------------------- tests


async def test_port_down_notice_condition_eviction_replacement(chain: RigFactory):
    async with chain() as (rig, agent):
        kube, namespace = rig.kube, rig.namespace
        job = await start_job(rig)
        placed = await placed_on(rig, {rig.a, rig.b})
        victim = next(p for p, n in placed.items() if n == rig.a)
        spare = await add_spare(rig)

        rig.port("mlx5_3", up=False)

        now_placed = await placed_on(rig, {spare, rig.b})
        assert victim not in now_placed

        # The victim's recorded versions: notice, condition, then the eviction.
        notice = [
            v
            for v in rig.versions(victim)
            if "rdmaplane.io/fault" in (v["metadata"].get("annotations") or {})
        ]
        assert notice, "no fault notice annotation"
        fault = json.loads(notice[0]["metadata"]["annotations"]["rdmaplane.io/fault"])
        assert (fault["hca"], fault["port"], fault["class"]) == ("mlx5_3", 1, "fatal")
        assert fault["reason"] == "port 1 DOWN (DISABLED)" and fault["since"].endswith("Z")
        versions = rig.versions(victim)
        rdma_fault = next(c for v in versions if (c := condition_true(v, "RDMAFault")))
        assert "mlx5_3 port 1 fatal" in rdma_fault["message"]
        disruption = next(c for v in versions if (c := condition_true(v, "DisruptionTarget")))
        assert disruption["reason"] == "EvictionByEvictionAPI"
        reasons = {e.reason for e in await rig.events("RDMAFault")} | {
            e.reason for e in await rig.events("RDMAFaultEviction")
        }
        assert reasons == {"RDMAFault", "RDMAFaultEviction"}

        status = (await kube.get(Job, job, namespace=namespace)).status
        assert status is not None and not status.failed  # Ignored: no failure counted
        acted = await _metric(agent, "rdmaplane_agent_fault_decisions_total", verb="act")
        assert acted == 1
        # The eviction took a token from the fleet's budget (the Lease, made and written with
        # the agent's own credential under deploy/agent/rbac.yaml).
        breaker = agent.config.fault.breaker
        lease = await kube.get(Lease, breaker.lease, namespace=breaker.namespace)
        assert lease.metadata is not None and lease.metadata.annotations is not None
        budget = json.loads(lease.metadata.annotations[BUDGET_ANNOTATION])
        assert rig.a in [t["node"] for t in budget["tokens"]] and budget["open"] == []
        granted = "rdmaplane_agent_fault_breaker_answers_total"
        assert await _metric(agent, granted, verdict="granted") == 1


async def test_flapping_port_evicts_at_most_once(chain: RigFactory):
    async with chain() as (rig, agent):
        await start_job(rig)
        await placed_on(rig, {rig.a, rig.b})
        await add_spare(rig)
        # Down and up every 0.3 s for 12 s; the hardware counts each fall in link_downed.
        for n in range(1, 41):
            rig.port("mlx5_5", up=False, link_downed=n)
            await asyncio.sleep(0.15)
            rig.port("mlx5_5", up=True)
            await asyncio.sleep(0.15)
        await asyncio.sleep(5)
        evicted = rig.versions_with(lambda v: condition_true(v, "DisruptionTarget") is not None)
        assert len(evicted) <= 1
        assert len(await rig.events("RDMAFaultEviction")) <= 1
        raised = await _metric(agent, "rdmaplane_agent_fault_changes_total", to="fatal")
        assert raised == 1  # one fault for the whole flapping episode


async def test_every_compute_hca_fatal_taints_the_node_until_clear_after(chain: RigFactory):
    async with chain() as (rig, _):
        kube, namespace = rig.kube, rig.namespace
        hcas = [f"mlx5_{i}" for i in range(8)]

        async def taint() -> Any:
            node = await kube.get(Node, rig.a)
            taints = (node.spec.taints if node.spec else None) or []
            return next((t for t in taints if t.key == "rdmaplane.io/rdma-unhealthy"), None)

        for hca in hcas[:7]:
            rig.port(hca, up=False)
        await asyncio.sleep(3)  # > fatalAfter: seven fatal HCAs are no reason to taint
        assert await taint() is None
        rig.port(hcas[7], up=False)
        found = await eventually(taint, CHAIN_S)
        assert (found.value, found.effect) == ("8-hcas", "NoExecute")

        # The taint manager acts on it: a pod without the toleration is evicted at once.
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "intolerant", "namespace": namespace},
            "spec": {"nodeName": rig.a, "containers": [{"name": "c", "image": "busybox"}]},
        }
        await kube.create(Pod.from_dict(body))

        async def taint_evicted() -> bool:
            versions = rig.versions("intolerant")
            return any(
                (c := condition_true(v, "DisruptionTarget"))
                and c["reason"] == "DeletionByTaintManager"
                for v in versions
            )

        await eventually(taint_evicted, CHAIN_S)

        rig.port(hcas[0], up=True)
        await asyncio.sleep(2)  # < clearAfter: still tainted
        assert await taint() is not None
        await eventually(lambda: absent(taint), CHAIN_S)


async def test_the_breaker_holds_the_eviction_until_the_storm_is_over(chain: RigFactory):
    """Part 1 with the agent as deployed: a breaker so tight that one faulty node is a storm
    (`minFaultyNodes` 1, `maxFaultyShare` 0) holds the eviction: the notice says why (`held`),
    the breaker's opening is one Event on the budget's Lease; once the fault is older than the
    breaker's window it closes (one Event), and the pod still hurt is evicted, once."""
    breaker = BreakerSettings(min_faulty_nodes=1, max_faulty_share=0.0, window_s=4.0)
    async with chain(fault=replace(FAULT, breaker=breaker)) as (rig, agent):
        kube = rig.kube
        await start_job(rig)
        placed = await placed_on(rig, {rig.a, rig.b})
        victim = next(p for p, n in placed.items() if n == rig.a)
        await add_spare(rig)
        rig.port("mlx5_3", up=False)

        def evicted() -> float | None:
            return rig.first(lambda v: condition_true(v, "DisruptionTarget") is not None, victim)

        async def is_evicted() -> bool:
            return evicted() is not None

        await eventually(is_evicted, CHAIN_S)
        notices = [
            json.loads(v["metadata"]["annotations"][NOTICE])
            for v in rig.versions(victim)
            if NOTICE in (v["metadata"].get("annotations") or {})
        ]
        held = [n["held"] for n in notices if "held" in n]
        assert held and held[0].startswith("breaker open: 1 of ") and "in the cluster" in held[0]
        lease_events = [
            e
            async for e in kube.list(Event, namespace=breaker.namespace)
            if e.involvedObject.kind == "Lease" and e.involvedObject.name == breaker.lease
        ]
        reasons = sorted(e.reason or "" for e in lease_events)
        assert reasons.count("RDMAFaultBreakerOpen") == 1, reasons
        assert reasons.count("RDMAFaultBreakerClosed") == 1, reasons

        async def counted() -> float:  # the agent counts the eviction once its call returns
            return await _metric(agent, "rdmaplane_agent_fault_decisions_total", verb="act")

        evictions = await eventually(counted, CHAIN_S)
        assert evictions == 1
        refused = "rdmaplane_agent_fault_breaker_answers_total"
        assert await _metric(agent, refused, verdict="refused") >= 1


async def test_the_breaker_in_observe_mode_only_says_what_it_would_hold(chain: RigFactory):
    """`mode: observe`: the same storm is judged and counted as refused, yet the eviction goes
    ahead after graceSeconds and the notice says nothing of a hold."""
    breaker = BreakerSettings(mode="observe", min_faulty_nodes=1, max_faulty_share=0.0)
    async with chain(fault=replace(FAULT, breaker=breaker)) as (rig, agent):
        await start_job(rig)
        placed = await placed_on(rig, {rig.a, rig.b})
        victim = next(p for p, n in placed.items() if n == rig.a)
        await add_spare(rig)
        rig.port("mlx5_3", up=False)

        async def is_evicted() -> bool:
            return (
                rig.first(lambda v: condition_true(v, "DisruptionTarget") is not None, victim)
                is not None
            )

        await eventually(is_evicted, CHAIN_S)
        notices = [
            json.loads(v["metadata"]["annotations"][NOTICE])
            for v in rig.versions(victim)
            if NOTICE in (v["metadata"].get("annotations") or {})
        ]
        assert notices and not any("held" in n for n in notices)
        refused = "rdmaplane_agent_fault_breaker_answers_total"
        assert await _metric(agent, refused, verdict="refused") >= 1


async def test_a_port_that_keeps_failing_is_quarantined_until_cleared(chain: RigFactory):
    """Part 3 with the agent as deployed (its credential, the own-node policies): with
    `repeat.count` 2, a port's second fatal fault quarantines it: the node tainted
    rdmaplane.io/rdma-quarantine NoSchedule and the HCA Unhealthy while the port is up again;
    the operator's clear annotation lifts both and is removed."""
    repeat = RepeatSettings(count=2, window_s=3600.0)
    async with chain(fault=replace(FAULT, repeat=repeat)) as (rig, agent):
        kube = rig.kube

        async def node() -> Node:
            return await kube.get(Node, rig.a)

        async def quarantine_taint() -> Any:
            spec = (await node()).spec
            taints = (spec.taints if spec else None) or []
            return next((t for t in taints if t.key == QUARANTINE_TAINT_KEY), None)

        def raised() -> bool:
            return ("mlx5_3", 1) in agent.faults.state.fatal

        async def fault_raised() -> bool:
            return raised()

        async def fault_cleared() -> bool:
            return not raised() and not agent.faults.state.faults

        for _ in range(2):
            rig.port("mlx5_3", up=False)
            await eventually(fault_raised, CHAIN_S)
            rig.port("mlx5_3", up=True)
            await eventually(fault_cleared, CHAIN_S)
        found = await eventually(quarantine_taint, CHAIN_S)
        assert (found.value, found.effect) == ("1-ports", "NoSchedule")
        assert not agent.node.health.hcas["mlx5_3"].healthy, "the port is up, yet out of service"
        metadata = (await node()).metadata
        assert metadata is not None and metadata.annotations is not None
        history = json.loads(metadata.annotations[HISTORY_ANNOTATION])
        assert len(history["ports"]["mlx5_3/1"]["faults"]) == 2

        await kube.patch(Node, rig.a, {"metadata": {"annotations": {CLEAR_ANNOTATION: "mlx5_3"}}})
        await eventually(lambda: absent(quarantine_taint), CHAIN_S)

        async def healthy_again() -> bool:
            return agent.node.health.hcas["mlx5_3"].healthy

        await eventually(healthy_again, CHAIN_S)
        metadata = (await node()).metadata
        assert metadata is not None and CLEAR_ANNOTATION not in (metadata.annotations or {})


async def test_api_server_away_during_the_fault_then_the_right_action(
    chain: RigFactory,
    fault_env: FaultEnv,
    workdir: Path,  # noqa: F811
):
    """While the agent cannot reach the API server, the fault is raised but nothing is done to
    the pod (its view is stale); once it can, the notice and eviction follow."""
    proxy = Proxy(int(fault_env.cluster.server.rsplit(":", 1)[1]))
    await proxy.open()

    def via_proxy(node: str) -> Path:
        """The agent's kubeconfig for `node`, its server the proxy."""
        kubeconfig = fault_env.agent_kubeconfig(node)
        config = yaml.safe_load(kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        path = workdir / "via-proxy.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    async with chain(agent_kubeconfig=via_proxy) as (rig, agent):
        await start_job(rig)
        placed = await placed_on(rig, {rig.a, rig.b})
        victim = next(p for p, n in placed.items() if n == rig.a)
        await add_spare(rig)
        await asyncio.wait_for(agent.publisher.in_sync.wait(), CHAIN_S)

        await proxy.cut()
        rig.port("mlx5_2", up=False)
        await eventually(lambda: _raised(agent), CHAIN_S)
        await eventually(lambda: _held(agent), CHAIN_S)
        await asyncio.sleep(FAULT.grace_s + 3)  # past the grace period: would have acted
        pod = await rig.kube.get(Pod, victim, namespace=rig.namespace)
        assert pod.metadata is not None and pod.metadata.deletionTimestamp is None
        assert "rdmaplane.io/fault" not in (pod.metadata.annotations or {})

        await proxy.open()
        await eventually(lambda: _evicted(rig), CHAIN_S)
        assert rig.versions_with(lambda v: condition_true(v, "RDMAFault") is not None) == [victim]


async def _evicted(rig: Rig) -> list[str]:
    return rig.versions_with(lambda v: condition_true(v, "DisruptionTarget") is not None)


async def _raised(agent: Agent) -> bool:
    return bool(agent.faults.state.faults)


async def _holds(agent: Agent, rig: Rig, pod: str) -> bool:
    return f"{rig.namespace}/{pod}" in {p.key for p in agent.node.allocations.pods}


async def _held(agent: Agent) -> bool:
    return await _metric(agent, "rdmaplane_agent_fault_decisions_total", outcome="held") > 0


async def test_stale_pod_resources_hold_then_the_right_action(chain: RigFactory):
    """While the kubelet's PodResources does not answer (its last answer older than two
    intervals), the agent does nothing to pods; once it answers, the notice and eviction follow
    for the pod it names."""
    async with chain() as (rig, agent):
        await start_job(rig)
        placed = await placed_on(rig, {rig.a, rig.b})
        victim = next(p for p, n in placed.items() if n == rig.a)
        await add_spare(rig)
        # The agent knows the victim holds A's devices before PodResources goes away (KWOK marks
        # it Running on its own clock; the kubelet stand-in and the agent poll on theirs).
        await eventually(lambda: _holds(agent, rig, victim), CHAIN_S)

        # The kubelet restarting: its PodResources socket is gone for a while.
        socket = rig.tree.parent / "kubelet/pod-resources/kubelet.sock"
        away = socket.with_suffix(".away")
        socket.rename(away)
        await asyncio.sleep(1)  # > two allocation intervals (0.2 s)
        rig.port("mlx5_1", up=False)
        await eventually(lambda: _raised(agent), CHAIN_S)
        await eventually(lambda: _held(agent), CHAIN_S)
        await asyncio.sleep(FAULT.grace_s + 3)  # past the grace period: would have acted
        assert rig.versions_with(lambda v: NOTICE in (v["metadata"].get("annotations") or {})) == []

        away.rename(socket)
        await eventually(lambda: _evicted(rig), CHAIN_S)
        assert rig.versions_with(lambda v: condition_true(v, "RDMAFault") is not None) == [victim]
