"""Faults at fleet scale on the real API server (issue 27). Part 1, the blast-radius breaker's
budget: 200 KWOK nodes in 8 leaves with their NRTs, the agents' `FaultBudget`s taking tokens
from one Lease with optimistic concurrency. One leaf of 25 losing every port opens the breaker
once and no node acts; once the faults are older than the breaker's window it closes once, and
the hurt nodes act at the budget's pace; agents racing for the last token: one wins; an API
server away, or a budget this version cannot read: nothing acts. Part 3, repeat offenders: a
port's fault history on its Node outlives agent restarts, and the operator's clear releases
it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import pytest_asyncio
import yaml
from lightkube import AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node

from rdmaplane import breaker as B
from rdmaplane import repeat
from rdmaplane.agent.budget import BUDGET_ANNOTATION, FaultBudget
from rdmaplane.agent.offenders import Offenders
from rdmaplane.agent.settings import BreakerSettings
from rdmaplane.fabric import TOPOGRAPH_TIER
from rdmaplane.faults import FAULT_SINCE_LABEL
from tests.e2e import fleet, scalerig
from tests.e2e.conftest import KwokCluster
from tests.e2e.faultrig import Proxy

NODES, LEAVES = 200, 8
PER_LEAF = NODES // LEAVES
WINDOW_S = 3.0  # a node counts as faulty this long: the storm's span in this test
PER_MINUTE = 5
# One fleet for the module: its tests and fixture share one event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass
class Fleet:
    kube: AsyncClient
    nodes: list[str]
    namespace: str

    def leaf(self, i: int) -> list[str]:
        return self.nodes[i * PER_LEAF : (i + 1) * PER_LEAF]

    def settings(self, **changed: object) -> BreakerSettings:
        base = {
            "max_nodes_per_minute": PER_MINUTE,
            "window_s": WINDOW_S,
            "lease": f"budget-{uuid.uuid4().hex[:6]}",
            "namespace": self.namespace,
        }
        return BreakerSettings(**{**base, **changed})  # type: ignore[arg-type]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fault_fleet(kwok_cluster: KwokCluster) -> AsyncIterator[Fleet]:
    planned = fleet.plan(NODES, seed=27, prefix=f"storm-{uuid.uuid4().hex[:5]}")
    tier = TOPOGRAPH_TIER.format("")
    planned = [
        replace(
            node,
            labels={
                **{k: v for k, v in node.labels.items() if not k.startswith(tier)},
                TOPOGRAPH_TIER.format(0): f"leaf-{i // PER_LEAF}",
                TOPOGRAPH_TIER.format(1): "spine-0",
            },
        )
        for i, node in enumerate(planned)
    ]
    async with kwok_cluster.cluster.async_client() as kube:
        try:
            await fleet.create(kube, planned)
            namespace = await scalerig.create_namespace(kube, "budget")
            yield Fleet(kube, [n.name for n in planned], namespace)
        finally:
            await fleet.delete(kube, planned)


async def mark_faulty(kube: AsyncClient, nodes: list[str], since: float | None) -> None:
    value = None if since is None else str(int(since))
    patch = {"metadata": {"labels": {FAULT_SINCE_LABEL: value}}}
    await fleet.bounded(20, [lambda n=n: kube.patch(Node, n, patch) for n in nodes])


async def take_all(budgets: list[FaultBudget]) -> list[tuple[B.Answer, list[B.Change]]]:
    return list(await asyncio.gather(*(b.take() for b in budgets)))


async def test_a_leaf_storm_opens_the_breaker_and_it_closes_by_itself(fault_fleet: Fleet):
    kube, config = fault_fleet.kube, fault_fleet.settings()
    hurt = fault_fleet.leaf(3)
    budgets = [FaultBudget(kube, n, config) for n in hurt]
    elsewhere = FaultBudget(kube, fault_fleet.leaf(5)[0], config)
    try:
        await mark_faulty(kube, hurt, time.time())
        answers = await take_all(budgets)
        assert all(a.verdict == B.Verdict.REFUSED and a.storming for a, _ in answers)
        opened = [c for _, changes in answers for c in changes if c.opened]
        assert len({c.scope for c in opened}) == len(opened), "each scope opened once"
        assert {c.scope for c in opened} <= {B.CLUSTER, f"{TOPOGRAPH_TIER.format(0)}=leaf-3"}
        assert any(c.scope == f"{TOPOGRAPH_TIER.format(0)}=leaf-3" for c in opened)
        leaf_reason = next(c.reason for c in opened if c.scope != B.CLUSTER)
        assert leaf_reason.startswith(f"{PER_LEAF} of {PER_LEAF} nodes under ")
        # A node of another leaf: the cluster's share (25 of 200, over 10 %) holds it too.
        other, _ = await elsewhere.take()
        assert other.verdict == B.Verdict.REFUSED and "in the cluster" in other.why

        await asyncio.sleep(WINDOW_S)  # the faults are now older than the breaker's window
        answers = await take_all(budgets)
        granted = [a for a, _ in answers if a.verdict == B.Verdict.GRANTED]
        assert len(granted) == PER_MINUTE and all(a.fresh for a in granted)
        refused = [a for a, _ in answers if a.verdict != B.Verdict.GRANTED]
        assert all(a.verdict == B.Verdict.REFUSED and not a.storming for a in refused)
        closed = [c for _, changes in answers for c in changes if not c.opened]
        assert {c.scope for c in closed} == {c.scope for c in opened}
        assert len(closed) == len(opened), "each scope closed once"
        lease = await kube.get(Lease, config.lease, namespace=config.namespace)
        held = json.loads(lease.metadata.annotations[BUDGET_ANNOTATION])
        assert held["open"] == [] and len(held["tokens"]) == PER_MINUTE
        # The five that act keep their token for its minute: asked again, still granted.
        winners = [b for b, (a, _) in zip(budgets, answers, strict=True) if a.fresh]
        again = await take_all(winners)
        assert all(a.verdict == B.Verdict.GRANTED and not a.fresh for a, _ in again)
    finally:
        await mark_faulty(kube, hurt, None)


async def test_agents_racing_for_the_last_token_one_wins(fault_fleet: Fleet):
    config = fault_fleet.settings(max_nodes_per_minute=1)
    racers = [FaultBudget(fault_fleet.kube, n, config) for n in fault_fleet.leaf(1)[:6]]
    answers = [a for a, _ in await take_all(racers)]
    assert sorted(a.verdict.value for a in answers) == ["granted"] + ["refused"] * 5
    assert all("budget spent: 1 nodes" in a.why for a in answers if a.verdict != B.Verdict.GRANTED)


async def test_no_agent_acts_on_a_budget_it_could_not_read(
    fault_fleet: Fleet, kwok_cluster: KwokCluster, tmp_path: Path
) -> None:
    """The node loses the API server (a relay cut between them): the answer is `unknown`,
    never a token; a Lease with a budget this version cannot read is left as it is."""
    config = fault_fleet.settings()
    cluster = kwok_cluster.cluster
    proxy = Proxy(int(cluster.server.rsplit(":", 1)[1]))
    await proxy.open()
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    (tmp_path / "via-proxy").write_text(yaml.safe_dump(kubeconfig))
    via = AsyncClient(KubeConfig.from_file(tmp_path / "via-proxy"), timeout=2.0)
    try:
        budget = FaultBudget(via, fault_fleet.nodes[0], config)
        first, _ = await budget.take()
        assert first.verdict == B.Verdict.GRANTED
        await proxy.cut()
        answer, changes = await FaultBudget(via, fault_fleet.nodes[1], config).take()
    finally:
        await via.close()
    assert answer.verdict == B.Verdict.UNKNOWN and changes == []
    assert answer.why.startswith("the fault budget could not be read: ")
    # A Lease holding a budget of a version this agent does not know: read, not overwritten.
    unreadable = json.dumps({"v": 2, "tokens": []})
    config = fault_fleet.settings()
    meta = ObjectMeta(
        name=config.lease, namespace=config.namespace, annotations={BUDGET_ANNOTATION: unreadable}
    )
    await fault_fleet.kube.create(Lease(metadata=meta))
    answer, _ = await FaultBudget(fault_fleet.kube, fault_fleet.nodes[0], config).take()
    assert answer.verdict == B.Verdict.UNKNOWN and "budget version 2, not 1" in answer.why
    lease = await fault_fleet.kube.get(Lease, config.lease, namespace=config.namespace)
    assert lease.metadata is not None and lease.metadata.annotations is not None
    assert lease.metadata.annotations[BUDGET_ANNOTATION] == unreadable


async def test_a_port_that_keeps_failing_stays_out_until_cleared(fault_fleet: Fleet) -> None:
    """Part 3 on a real Node: three fatal faults of one port within the window, counted across
    two agent restarts (the history lives in the Node's annotation), quarantine it; a third
    agent finds it quarantined at once; the operator's `rdmaplane.io/fault-clear` releases it
    and is answered (removed); its faults are forgotten."""
    kube, node, key = fault_fleet.kube, fault_fleet.leaf(6)[0], ("mlx5_0", 1)
    rules = repeat.RepeatRules(count=3, window_s=3600.0)
    now, events = [1_000_000.0], []

    def agent() -> Offenders:
        return Offenders(
            kube, node, rules, lambda *e: events.append(e[1]), clock=lambda: now[0], recheck_s=0.0
        )

    async def episode(offenders: Offenders) -> None:
        await offenders.sync({key}, set())
        now[0] += 60.0
        await offenders.sync(set(), set())
        now[0] += 60.0

    first = agent()
    await episode(first)
    await episode(first)
    assert first.quarantined == {}
    second = agent()  # a restart: the count goes on where it was
    await episode(second)
    assert list(second.quarantined) == [key] and events == ["RDMAPortQuarantined"]
    third = agent()
    await third.sync(set(), set())
    assert list(third.quarantined) == [key]
    annotations = (await kube.get(Node, node)).metadata.annotations  # type: ignore[union-attr]
    assert json.loads(annotations[repeat.HISTORY_ANNOTATION])["ports"]["mlx5_0/1"]["quarantined"]

    patch = {"metadata": {"annotations": {repeat.CLEAR_ANNOTATION: "mlx5_0/1"}}}
    await kube.patch(Node, node, patch)
    await third.sync(set(), set())
    assert third.quarantined == {} and events[-1] == "RDMAPortReleased"
    annotations = (await kube.get(Node, node)).metadata.annotations  # type: ignore[union-attr]
    assert repeat.CLEAR_ANNOTATION not in annotations
    assert json.loads(annotations[repeat.HISTORY_ANNOTATION])["ports"] == {}
    fourth = agent()
    await episode(fourth)
    assert fourth.quarantined == {}, "the count starts again after a clear"
