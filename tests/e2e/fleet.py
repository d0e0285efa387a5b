"""A fleet of KWOK GPU nodes for the scale tests and benchmarks (tests/e2e/test_scale.py,
bench/cluster.py, bench/fleet.py).

Every node is a bundled sample machine (HGX H100 RoCE, HGX H200 IB, DGX A100, the PCIe L40S
server) under one of the kubelet's Topology Manager policies, as its agent would leave it: the
Node with the sample's GPUs and the HCAs the device plugin offers in its capacity, the agent's
labels and `RDMAReady=True`, and the NodeResourceTopology the agent publishes for it with no pod
on it (`rdmaplane nrt --sample`: the agent's own builder). KWOK runs the pods bound there.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod

from rdmaplane.adapters.discovery import samples
from rdmaplane.adapters.kube import NodeResourceTopology
from rdmaplane.cli.nrt import agent_nrt
from rdmaplane.core import nrt
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.services.scheduler.policy import (
    devicemanager,
    nodestate,
    podrequest,
    topologymanager,
)
from tests.e2e.controlplane import (
    STARTUP_TIMEOUT_S,
    create_kwok_node,
    delete_if_there,
    kwok_node_ready,
)

T = TypeVar("T")

FLEET_LABEL = "e2e.rdmaplane.io/fleet"  # the fleet's nodes, and the pods meant for them
# The machines and kubelet policies, also the placement benchmark's (bench/placement.py); the
# fleet adds a share of pod scope.
SAMPLE_MIX = (
    ("hgx-h100-roce", 0.3),
    ("hgx-h200-ib", 0.25),
    ("dgx-a100", 0.25),
    ("pcie-l40s-split", 0.2),
)
POLICY_MIX = (("single-numa-node", 0.4), ("restricted", 0.4), ("best-effort", 0.2))
SCOPE_MIX = (("container", 0.8), ("pod", 0.2))
CREATE_PARALLEL = 24  # requests in flight while the fleet is made


@dataclass(frozen=True)
class FleetNode:
    name: str
    sample: str
    policy: str
    scope: str
    labels: Mapping[str, str]
    capacity: Mapping[str, str]  # the extended resources the kubelet would report
    nrt: Mapping[str, Any]  # the NodeResourceTopology object the agent publishes


def pick(rng: random.Random, mix: Sequence[tuple[T, float]]) -> T:
    return rng.choices([k for k, _ in mix], [w for _, w in mix])[0]


@functools.cache
def _template(sample: str, policy: str, scope: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The agent's NRT for the sample (named "template") and its node labels."""
    topo = samples.read_sample(sample)
    obj = agent_nrt(topo, "template", PluginSettings(), policy, scope)
    return obj, nrt.node_labels(topo)


def capacity_of(obj: Mapping[str, Any]) -> dict[str, str]:
    """What the kubelet reports for the devices an agent's NRT lists: each exclusive device
    sits in exactly one NUMA zone, so the NUMA zones' capacities add up to the node's."""
    counts: Counter[str] = Counter()
    for zone in obj["zones"]:
        if zone["type"] == nrt.ZONE_NUMA:
            for res in zone.get("resources") or ():
                counts[res["name"]] += int(res["capacity"])
    if nrt.HCA_SHARED in counts:
        raise ValueError("shared slots span NUMA zones: their count is not a sum")
    return {name: str(n) for name, n in sorted(counts.items())}


def plan(count: int, seed: int, prefix: str) -> list[FleetNode]:
    """`count` nodes named `<prefix>-00000`…, drawn from the mixes with `seed`."""
    rng = random.Random(seed)
    nodes = []
    for i in range(count):
        sample = pick(rng, SAMPLE_MIX)
        policy, scope = pick(rng, POLICY_MIX), pick(rng, SCOPE_MIX)
        template, labels = _template(sample, policy, scope)
        name = f"{prefix}-{i:05d}"
        obj = copy.deepcopy(template)
        obj["metadata"]["name"] = name
        nodes.append(
            FleetNode(
                name,
                sample,
                policy,
                scope,
                {**labels, FLEET_LABEL: prefix},
                capacity_of(obj),
                obj,
            )
        )
    return nodes


async def bounded(parallel: int, jobs: Iterable[Callable[[], Awaitable[None]]]) -> None:
    """Run the jobs with at most `parallel` in flight; the first failure is raised."""
    gate = asyncio.Semaphore(parallel)

    async def one(job: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            await job()

    await asyncio.gather(*(one(j) for j in jobs))


async def create(kube: AsyncClient, nodes: Sequence[FleetNode]) -> None:
    """Create the nodes (RDMAReady=True) and their NRTs, then wait until KWOK made every node
    Ready."""
    ready = {"type": nrt.CONDITION_RDMA_READY, "status": "True", "reason": "AllDevicesHealthy"}

    async def make(node: FleetNode) -> None:
        await create_kwok_node(kube, node.name, node.labels, node.capacity, [ready])
        await kube.create(NodeResourceTopology(dict(node.nrt)))

    await bounded(CREATE_PARALLEL, (functools.partial(make, n) for n in nodes))
    await wait_ready(kube, {n.name for n in nodes}, {FLEET_LABEL: nodes[0].labels[FLEET_LABEL]})


async def wait_ready(kube: AsyncClient, names: set[str], selector: Mapping[str, str]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S + len(names) / 20
    while True:
        listed = [n async for n in kube.list(Node, labels=dict(selector))]
        waiting = names - {n.metadata.name for n in listed if n.metadata and kwok_node_ready(n)}
        if not waiting:
            return
        if time.monotonic() > deadline:
            some = ", ".join(sorted(waiting)[:5])
            raise TimeoutError(f"KWOK did not make {len(waiting)} nodes Ready: {some}, …")
        await asyncio.sleep(0.5)


async def delete(kube: AsyncClient, nodes: Sequence[FleetNode]) -> None:
    """The fleet's nodes and NRTs go (the next test's scheduler sees none of them)."""

    async def drop(node: FleetNode) -> None:
        for kind in (Node, NodeResourceTopology):
            await delete_if_there(kube, kind, node.name)

    await bounded(CREATE_PARALLEL, (functools.partial(drop, n) for n in nodes))


def node_states(nodes: Iterable[FleetNode]) -> dict[str, nodestate.NodeState]:
    """The extender's view of each node as published, with no pod on it."""
    return {n.name: nodestate.node_state(nrt.from_object(n.nrt)) for n in nodes}


# ---------------------------------------------------------------- the pods


# GPUs per pod (one exclusive HCA per GPU) and how often; 0 is a CPU-only pod, which asks for
# none of the extender's managedResources, so kube-scheduler never calls the extender for it.
SHAPES = ((0, 0.2), (1, 0.35), (2, 0.2), (4, 0.15), (8, 0.1))


def stream(count: int, seed: int) -> list[int]:
    """The GPUs of each pod of a stream, drawn from `SHAPES` with `seed`."""
    rng = random.Random(seed)
    return [pick(rng, SHAPES) for _ in range(count)]


def pod_body(name: str, namespace: str, fleet: str, gpus: int) -> dict[str, Any]:
    """A pod for the fleet `fleet` (its nodeSelector): `gpus` GPUs and as many HCAs, or, with
    none, a CPU-only pod."""
    if gpus:
        limits = {nrt.GPU: str(gpus), nrt.HCA: str(gpus)}
        resources = {"limits": limits, "requests": limits}
    else:
        resources = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {FLEET_LABEL: fleet},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "trainer", "resources": resources}],
        },
    }


def gpus_of(body: Mapping[str, Any]) -> int:
    limits = body["spec"]["containers"][0]["resources"].get("limits") or {}
    return int(limits.get(nrt.GPU, 0))


@dataclass(frozen=True)
class Bound:
    """A pod the watch saw bound: where, when (monotonic), and in which order."""

    node: str
    at: float
    order: int


class Bindings:
    """Every pod of a namespace as a watch delivers it, with the moment its binding arrived."""

    def __init__(self, kube: AsyncClient, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.bound: dict[str, Bound] = {}
        self.last_at = 0.0  # when the latest binding arrived (monotonic)
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Bindings:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _watch(self) -> None:
        async for _, pod in self.kube.watch(Pod, namespace=self.namespace):
            meta, spec = pod.metadata, pod.spec
            if meta and meta.name and spec and spec.nodeName and meta.name not in self.bound:
                self.last_at = time.monotonic()
                self.bound[meta.name] = Bound(spec.nodeName, self.last_at, len(self.bound))
                self.changed.set()

    async def wait_for(
        self, names: Iterable[str], within: float, stall: float | None = None
    ) -> set[str]:
        """Wait until every pod in `names` is bound, or `within` seconds passed, or (with
        `stall`) no pod was bound for `stall` seconds; the pods still unbound."""
        wanted = set(names)
        start = time.monotonic()
        deadline = start + within
        while True:
            waiting = wanted - self.bound.keys()
            now = time.monotonic()
            left = deadline - now
            stalled = stall is not None and now - max(start, self.last_at) > stall
            if not waiting or left <= 0 or stalled:
                return waiting
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))


# ---------------------------------------------------------------- the judge


def overbooked(
    nodes: Iterable[FleetNode], pods: Mapping[str, Mapping[str, Any]], bound: Mapping[str, Bound]
) -> dict[str, str]:
    """Nodes whose bound pods ask for more GPUs or HCAs than the node has: node → what."""
    held: dict[str, Counter[str]] = {}
    for name, where in bound.items():
        limits = pods[name]["spec"]["containers"][0]["resources"].get("limits") or {}
        held.setdefault(where.node, Counter()).update({k: int(v) for k, v in limits.items()})
    out = {}
    for node in nodes:
        for resource, count in held.get(node.name, Counter()).items():
            if count > int(node.capacity.get(resource, "0")):
                out[node.name] = f"{count} {resource} bound, {node.capacity.get(resource)} there"
    return out


def refused(
    nodes: Iterable[FleetNode], pods: Mapping[str, Mapping[str, Any]], bound: Mapping[str, Bound]
) -> dict[str, str]:
    """The bound pods the kubelet would refuse, by our model of its admission (the extender's
    policy, checked against the kubelet's own code in tests/kubelet): each node's pods replayed
    in the order they were bound, on the node as its NRT publishes it. A refused pod holds
    nothing. pod name → why."""
    states = node_states(nodes)
    by_node: dict[str, list[tuple[int, str]]] = {}
    for name, where in bound.items():
        by_node.setdefault(where.node, []).append((where.order, name))
    out = {}
    for node, placed in by_node.items():
        state = states[node]
        for _, name in sorted(placed):
            request = podrequest.pod_request(pods[name])
            if not request.wants_devices:
                continue
            outcome = topologymanager.place_pod(state, request)
            if isinstance(outcome, devicemanager.Rejection):
                out[name] = f"{node}: {outcome.reason}"
            else:
                state = outcome[1]
    return out
