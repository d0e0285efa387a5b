"""Faults at fleet scale on the real API server (issue 27). Part 1, the blast-radius breaker's
budget: 200 KWOK nodes in 8 leaves with their NRTs, the agents' `FaultBudget`s taking tokens
from one Lease with optimistic concurrency. One leaf of 25 losing every port opens the breaker
once and no node acts; once the faults are older than the breaker's window it closes once, and
the hurt nodes act at the budget's pace; the same storm with 25 full agents acting: each pod
still hurt evicted once through the eviction subresource, within the budget; agents racing for
the last token: one wins; an API server away, or a budget this version cannot read: nothing
acts. Part 3, repeat offenders: a
port's fault history on its Node outlives agent restarts, and the operator's clear releases
it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import shutil
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio
import yaml
from lightkube import AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Event, Node, Pod

from rdmaplane.core import breaker as B
from rdmaplane.core import faults as F
from rdmaplane.core import repeat
from rdmaplane.core.fabric import TOPOGRAPH_TIER
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.names import FAULT_SINCE_LABEL
from rdmaplane.core.notice import ANNOTATION
from rdmaplane.core.settings.agent import BreakerSettings, FaultSettings
from rdmaplane.services.agent.breaker import BUDGET_ANNOTATION, FaultBudget
from rdmaplane.services.agent.repeat import Offenders
from rdmaplane.services.agent.root import Agent
from tests.e2e import fleet, scalerig
from tests.e2e.conftest import KwokCluster
from tests.e2e.faultrig import PUBLISH, Proxy, holding, pod_resources_server
from tests.e2e.test_agent import Lister, eventually, running_agent

V = TypeVar("V")
NODES, LEAVES = 200, 8
PER_LEAF = NODES // LEAVES
WINDOW_S = 3.0  # a node counts as faulty this long: the storm's span in this test
PER_MINUTE = 5
# One fleet for the module: its tests and fixture share one event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass
class Fleet:
    kube: AsyncClient
    planned: list[fleet.FleetNode]
    namespace: str

    @property
    def nodes(self) -> list[str]:
        return [n.name for n in self.planned]

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
            yield Fleet(kube, planned, namespace)
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
        assert all(a.verdict == B.BudgetVerdict.REFUSED and a.storming for a, _ in answers)
        opened = [c for _, changes in answers for c in changes if c.opened]
        assert len({c.scope for c in opened}) == len(opened), "each scope opened once"
        assert {c.scope for c in opened} <= {B.CLUSTER, f"{TOPOGRAPH_TIER.format(0)}=leaf-3"}
        assert any(c.scope == f"{TOPOGRAPH_TIER.format(0)}=leaf-3" for c in opened)
        leaf_reason = next(c.reason for c in opened if c.scope != B.CLUSTER)
        assert leaf_reason.startswith(f"{PER_LEAF} of {PER_LEAF} nodes under ")
        # A node of another leaf: the cluster's share (25 of 200, over 10 %) holds it too.
        other, _ = await elsewhere.take()
        assert other.verdict == B.BudgetVerdict.REFUSED and "in the cluster" in other.why

        await asyncio.sleep(WINDOW_S)  # the faults are now older than the breaker's window
        answers = await take_all(budgets)
        granted = [a for a, _ in answers if a.verdict == B.BudgetVerdict.GRANTED]
        assert len(granted) == PER_MINUTE and all(a.fresh for a in granted)
        refused = [a for a, _ in answers if a.verdict != B.BudgetVerdict.GRANTED]
        assert all(a.verdict == B.BudgetVerdict.REFUSED and not a.storming for a in refused)
        closed = [c for _, changes in answers for c in changes if not c.opened]
        assert {c.scope for c in closed} == {c.scope for c in opened}
        assert len(closed) == len(opened), "each scope closed once"
        lease = await kube.get(Lease, config.lease, namespace=config.namespace)
        held = json.loads(lease.metadata.annotations[BUDGET_ANNOTATION])
        assert held["open"] == [] and len(held["tokens"]) == PER_MINUTE
        # The five that act keep their token for its minute: asked again, still granted.
        winners = [b for b, (a, _) in zip(budgets, answers, strict=True) if a.fresh]
        again = await take_all(winners)
        assert all(a.verdict == B.BudgetVerdict.GRANTED and not a.fresh for a, _ in again)
    finally:
        await mark_faulty(kube, hurt, None)


async def test_agents_racing_for_the_last_token_one_wins(fault_fleet: Fleet):
    config = fault_fleet.settings(max_nodes_per_minute=1)
    racers = [FaultBudget(fault_fleet.kube, n, config) for n in fault_fleet.leaf(1)[:6]]
    answers = [a for a, _ in await take_all(racers)]
    assert sorted(a.verdict.value for a in answers) == ["granted"] + ["refused"] * 5
    assert all(
        "budget spent: 1 nodes" in a.why for a in answers if a.verdict != B.BudgetVerdict.GRANTED
    )


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
        assert first.verdict == B.BudgetVerdict.GRANTED
        await proxy.cut()
        answer, changes = await FaultBudget(via, fault_fleet.nodes[1], config).take()
    finally:
        await via.close()
    assert answer.verdict == B.BudgetVerdict.UNKNOWN and changes == []
    assert answer.why.startswith("the fault budget could not be read: ")
    # A Lease holding a budget of a version this agent does not know: read, not overwritten.
    unreadable = json.dumps({"v": 2, "tokens": []})
    config = fault_fleet.settings()
    meta = ObjectMeta(
        name=config.lease, namespace=config.namespace, annotations={BUDGET_ANNOTATION: unreadable}
    )
    await fault_fleet.kube.create(Lease(metadata=meta))
    answer, _ = await FaultBudget(fault_fleet.kube, fault_fleet.nodes[0], config).take()
    assert answer.verdict == B.BudgetVerdict.UNKNOWN and "budget version 2, not 1" in answer.why
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


# ---------------------------------------------------------------- the storm, with agents acting

STORM_PER_MINUTE = 12  # the 22 pods still hurt take two of the budget's minutes: 12, then 10
STORM_WINDOW_S = 20.0
RECOVERING = 3  # nodes of the dead leaf whose ports come back while the breaker is open
# Short fault timings: fatal 1 s after the symptom, evict 3 s after the notice.
STORM_FAULT = FaultSettings(fatal_after_s=1.0, clear_after_s=2.0, grace_s=3.0)
# An agent refused asks again after the fault decisions' retry (`faults.DecisionRules.retry_s`,
# 10 s, no setting); a token lasts the breaker's minute (`breaker.MINUTE_S`, no setting).
RETRY_S = F.DecisionRules(F.Action.EVICT, 0.0, 1).retry_s


@dataclass
class Recorded:
    """What the API server said while the storm ran, each with the (wall-clock) time the watch
    delivered it: every version of the test's pods (None: deleted), and of the budget's Lease."""

    pods: dict[str, list[tuple[float, dict[str, Any] | None]]] = field(default_factory=dict)
    budgets: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    def evicted_at(self, pod: str) -> list[float]:
        """When the pod was evicted through the eviction subresource (the API server's
        DisruptionTarget condition appearing), each time it appeared."""
        versions = self.pods.get(pod, [])
        return [
            t for on, t in _flips(versions, lambda v: v is not None and _evicted_by_api(v)) if on
        ]

    def deleted(self, pod: str) -> bool:
        return any(v is None for _, v in self.pods.get(pod, []))

    def notices(self, pod: str) -> list[dict[str, Any]]:
        out = []
        for _, v in self.pods.get(pod, []):
            text = ((v or {}).get("metadata", {}).get("annotations") or {}).get(ANNOTATION)
            if text:
                out.append(json.loads(text))
        return out


def _evicted_by_api(version: dict[str, Any]) -> bool:
    conditions = version.get("status", {}).get("conditions") or []
    return any(
        c["type"] == "DisruptionTarget"
        and c["status"] == "True"
        and c.get("reason") == "EvictionByEvictionAPI"
        for c in conditions
    )


async def _record_pods(kube: AsyncClient, namespace: str, out: Recorded) -> None:
    async for kind, pod in kube.watch(Pod, namespace=namespace):
        assert pod.metadata is not None and pod.metadata.name is not None
        version = None if kind == "DELETED" else pod.to_dict()
        out.pods.setdefault(pod.metadata.name, []).append((time.time(), version))


async def _record_budget(kube: AsyncClient, config: BreakerSettings, out: Recorded) -> None:
    found = kube.watch(Lease, namespace=config.namespace, fields={"metadata.name": config.lease})
    async for _, lease in found:
        text = ((lease.metadata.annotations if lease.metadata else None) or {}).get(
            BUDGET_ANNOTATION
        )
        if text:
            out.budgets.append((time.time(), json.loads(text)))


async def _stand_in_kubelets(kube: AsyncClient, namespace: str, listers: dict[str, Lister]) -> None:
    """Each node's PodResources in step with the pods bound to it."""
    while True:
        pods = [p async for p in kube.list(Pod, namespace=namespace)]
        for node, lister in listers.items():
            lister.pods = holding(lister, pods, node)
        await asyncio.sleep(0.2)


def _ports(tree: Path, up: bool) -> None:
    """Every port of every HCA up or down, the way the kernel shows it in sysfs."""
    for port in sorted(tree.glob("class/infiniband/*/ports/*")):
        (port / "state").write_text("4: ACTIVE\n" if up else "1: DOWN\n")
        (port / "phys_state").write_text("5: LinkUp\n" if up else "3: Disabled\n")


def _bound_pod(name: str, namespace: str, node: fleet.FleetNode) -> Pod:
    """A trainer bound to `node` holding all its devices. It tolerates the agent's NoExecute
    taint, so every eviction it meets is an agent's, through the eviction subresource."""
    return Pod.from_dict(  # type: ignore[return-value]
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeName": node.name,
                "containers": [
                    {
                        "name": "trainer",
                        "image": "busybox",
                        "resources": {"limits": {**node.capacity}},
                    }
                ],
                "tolerations": [{"key": F.TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}],
            },
        }
    )


def _open_scopes(budget: Mapping[str, Any]) -> set[str]:
    return {o["scope"] for o in budget.get("open") or ()}


def _scope_open(scope: str, budget: Mapping[str, Any]) -> bool:
    return scope in _open_scopes(budget)


def _flips(
    versions: Sequence[tuple[float, V]], test: Callable[[V], bool]
) -> list[tuple[bool, float]]:
    """When `test` became true (True) and false again (False), version by version."""
    out, before = [], False
    for t, version in versions:
        now = test(version)
        if now != before:
            out.append((now, t))
        before = now
    return out


async def test_a_leaf_storm_evicts_every_pod_still_hurt_once_within_the_budget(
    fault_fleet: Fleet,
    kwok_cluster: KwokCluster,
    sample_trees: dict[str, Path],
    sample_nodes: dict[str, NodeTopology],
    short_dir: Path,
) -> None:
    """Part 1 with the agents acting: a full rdmaplane agent (`Agent.run`, as
    tests/e2e/test_faults.py runs one: a sysfs tree of the node's sample, the embedded device
    plugin, PodResources from a gRPC stand-in generated from the kubelet's protos, the
    publisher and the fault actor) for each of the 25 nodes of one leaf, all in this process,
    each with one pod bound on KWOK holding all of the node's devices. Every port of the leaf
    goes down at once. The agents find the storm through the budget's census (their own
    `fault-since` labels) and hold (the notices say why); each scope opens and closes once; 3
    nodes whose ports come back meanwhile keep their pods, and each of the 22 pods still hurt is
    evicted once through the real API server's eviction subresource, at most
    `maxNodesPerMinute` nodes taking a token within any minute. A node that asked before the
    storm was visible (for its NoExecute taint, at once) may hold a token from then: it evicts
    after graceSeconds. Evictions are counted from the API server: the pods' versions
    (DisruptionTarget by the eviction API, then deletion) and the Events. A token's minute is
    fixed (`breaker.MINUTE_S`) and a refused agent asks again after 10 s, so the test takes
    about two minutes."""
    kube, namespace = fault_fleet.kube, fault_fleet.namespace
    leaf = fault_fleet.planned[7 * PER_LEAF : 8 * PER_LEAF]
    breaker = fault_fleet.settings(max_nodes_per_minute=STORM_PER_MINUTE, window_s=STORM_WINDOW_S)
    config = {
        "fault": replace(STORM_FAULT, breaker=breaker),
        "publish": PUBLISH,
        "poll_interval_s": 1.0,
        "allocation_interval_s": 1.0,
    }
    recorded = Recorded()
    pods = {node.name: f"trainer-{i:02d}" for i, node in enumerate(leaf)}
    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        agents: dict[str, Agent] = {}
        listers: dict[str, Lister] = {}
        trees: dict[str, Path] = {}
        for i, node in enumerate(leaf):
            workdir = short_dir / f"{i:02d}"
            trees[node.name] = Path(
                shutil.copytree(sample_trees[node.sample], workdir / "sys", symlinks=True)
            )
            listers[node.name] = await stack.enter_async_context(
                pod_resources_server(workdir / "kubelet", sample_nodes[node.sample])
            )
            agents[node.name] = await stack.enter_async_context(
                running_agent(
                    kwok_cluster.cluster.kubeconfig,
                    node.name,
                    trees[node.name],
                    workdir,
                    topology_manager_policy=node.policy,
                    topology_manager_scope=node.scope,
                    **config,
                )
            )
        tasks = [
            asyncio.create_task(_stand_in_kubelets(kube, namespace, listers)),
            asyncio.create_task(_record_pods(kube, namespace, recorded)),
            asyncio.create_task(_record_budget(kube, breaker, recorded)),
        ]
        stack.push_async_callback(_cancel, tasks)
        stack.push_async_callback(kube.deletecollection, Pod, namespace=namespace, grace_period=0)
        for node in leaf:
            await kube.create(_bound_pod(pods[node.name], namespace, node))

        async def every_agent_holds_its_pod() -> bool:
            return all(
                f"{namespace}/{pods[n]}" in {p.key for p in a.node.allocations.pods}
                for n, a in agents.items()
            )

        await eventually(every_agent_holds_its_pod, 60)
        ready_s = time.monotonic() - started

        cut = time.time()
        for tree in trees.values():
            _ports(tree, up=False)
        leaf_scope = f"{TOPOGRAPH_TIER.format(0)}={leaf[0].labels[TOPOGRAPH_TIER.format(0)]}"

        async def breaker_open() -> bool:
            return any(leaf_scope in _open_scopes(b) for _, b in recorded.budgets)

        await eventually(breaker_open, 30)
        # Three nodes that took no token before the storm was seen get their ports back.
        took = {t["node"] for _, b in recorded.budgets for t in b["tokens"]}
        recovering = [n for n in leaf if n.name not in took][-RECOVERING:]
        for node in recovering:
            _ports(trees[node.name], up=True)
        still_hurt = [n.name for n in leaf if n not in recovering]

        async def all_evicted() -> bool:
            return all(
                recorded.evicted_at(pods[n]) and recorded.deleted(pods[n]) for n in still_hurt
            )

        minutes = -(-len(still_hurt) // STORM_PER_MINUTE)
        await eventually(all_evicted, STORM_WINDOW_S + minutes * (60 + RETRY_S) + 60)
        for node in recovering:  # its ports came back: its pod runs on, never evicted
            assert not agents[node.name].faults.state.faults
            pod = await kube.get(Pod, pods[node.name], namespace=namespace)
            assert pod.metadata is not None and pod.metadata.deletionTimestamp is None
        events = [e async for e in kube.list(Event, namespace=namespace)]
    run_s = time.monotonic() - started

    # Exactly once, by the API server's word: one eviction per pod still hurt, none else.
    evictions = {n: recorded.evicted_at(pods[n]) for n in pods}
    said = Counter(e.involvedObject.name for e in events if e.reason == "RDMAFaultEviction")
    for name in still_hurt:
        assert len(evictions[name]) == 1 and said[pods[name]] == 1, (name, evictions[name])
    for node in recovering:
        assert evictions[node.name] == [] and said[pods[node.name]] == 0

    # The breaker: each scope it opened (the leaf's among them) opened once and closed once.
    scopes = set().union(*(_open_scopes(b) for _, b in recorded.budgets))
    assert leaf_scope in scopes
    flips = {s: _flips(recorded.budgets, functools.partial(_scope_open, s)) for s in scopes}
    assert all([o for o, _ in f] == [True, False] for f in flips.values()), flips
    opened_at = min(f[0][1] for f in flips.values())
    closed_at = max(f[1][1] for f in flips.values())
    lease_events = Counter(
        (e.reason, (e.message or "").split(";")[0])
        for e in events
        if e.involvedObject.kind == "Lease" and e.involvedObject.name == breaker.lease
    )
    reasons = Counter(r for r, _ in lease_events.elements())
    assert reasons == {"RDMAFaultBreakerOpen": len(scopes), "RDMAFaultBreakerClosed": len(scopes)}
    assert all(n == 1 for n in lease_events.values()), lease_events

    # The budget: each node still hurt took one token, none while a scope was open, at most
    # the budget's share within any minute, each eviction within its node's token. A node
    # whose fault is seen before the storm is (fewer than `minFaultyNodes` labels published)
    # asks at once for its NoExecute taint and may get a token: "early"; its token does not
    # outlive the storm, so it too evicts only once the breaker closed. Every other pod's
    # notice said why it waited (an early one's first notice may predate the storm).
    tokens: dict[str, float] = {}
    early: set[str] = set()
    storm_seen = False
    for _, budget in recorded.budgets:
        opened = bool(_open_scopes(budget))
        storm_seen |= opened
        for token in budget["tokens"]:
            if token["node"] not in tokens:
                assert not opened, f"a token given while open: {budget}"
                tokens[token["node"]] = token["at"]
                if not storm_seen:
                    early.add(token["node"])
    assert sorted(tokens) == sorted(still_hurt)
    grants = sorted(tokens.values())
    busiest = max(sum(1 for g in grants if at <= g < at + B.MINUTE_S) for at in grants)
    assert busiest <= STORM_PER_MINUTE
    for name in still_hurt:
        (evicted,) = evictions[name]
        assert tokens[name] <= evicted < tokens[name] + B.MINUTE_S, (name, tokens[name], evicted)
    for name in set(still_hurt) - early:
        held = [n["held"] for n in recorded.notices(pods[name]) if "held" in n]
        assert held and held[0].startswith("breaker open: "), (name, recorded.notices(pods[name]))

    evicted_at = sorted(evictions[n][0] for n in still_hurt)
    assert evicted_at[0] >= closed_at, ("evicted while the breaker was open", evicted_at, closed_at)
    per_minute = Counter(int((e - closed_at) // B.MINUTE_S) for e in evicted_at if e >= closed_at)
    print(
        f"\nstorm: {len(leaf)} nodes of {NODES} lose every port; agents up in {ready_s:.1f} s; "
        f"breaker open {opened_at - cut:.1f} s after the cut ({len(scopes)} scopes), closed at "
        f"{closed_at - cut:.1f} s (window {STORM_WINDOW_S:g} s); tokens before the storm was seen: "
        f"{len(early)}; evictions per minute after the close: "
        f"{[per_minute[m] for m in range(max(per_minute) + 1)]} (max {STORM_PER_MINUTE}); "
        f"busiest minute of tokens {busiest}; evictions from {evicted_at[0] - cut:.1f} s to "
        f"{evicted_at[-1] - cut:.1f} s after the cut; run {run_s:.0f} s"
    )


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
