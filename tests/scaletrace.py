"""The scale test's trace in-process: the fleet and the pod stream of bench/cluster.py
(tests/e2e/fleet.py), the extender fed the pod events its watch would read (as JSON lines, the
way the API server sends them) and asked as kube-scheduler asks it (`ExtenderArgs` bytes, the
nodes kube-scheduler's own filters found, rotating through the fleet), and a plain model beside
it: every node's state recomputed from its NRT and the pods bound to it, every asked node
evaluated by `fit.evaluate` on it. Used by tests/integration/test_extender_fast_path.py
(the two decide the same) and bench/extender.py `--replay` (what each costs).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from rdmaplane.core import nrt
from rdmaplane.core.settings.scheduler import ExtenderSettings
from rdmaplane.services.scheduler.cache import REASON_PREFIX, ClusterCache
from rdmaplane.services.scheduler.decisions import Decisions
from rdmaplane.services.scheduler.http import ExtenderMetrics, ExtenderShell
from rdmaplane.services.scheduler.policy import (
    devicemanager,
    fit,
    nodestate,
    podrequest,
    topologymanager,
    wire,
)
from rdmaplane.services.scheduler.watch import read_pod_event
from tests.e2e import fleet

NAMESPACE = "trace"
# What the API server adds to a pod the extender does not read: its watch skips it.
_NOISE: dict[str, Any] = {
    "managedFields": [
        {
            "manager": "kube-scheduler",
            "operation": "Update",
            "apiVersion": "v1",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {"f:conditions": {".": {}}}},
        }
    ],
}
_SPEC_NOISE: dict[str, Any] = {
    "volumes": [{"name": "kube-api-access", "projected": {"defaultMode": 420}}],
    "tolerations": [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
    ],
    "schedulerName": "default-scheduler",
    "priority": 0,
}


def feasible_to_find(nodes: int) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops (upstream
    `numFeasibleNodesToFind` with the default adaptive percentage): the names the extender is
    asked about per pod."""
    if nodes < 100:
        return nodes
    percentage = max(5, 50 - nodes // 125)
    return max(100, nodes * percentage // 100)


@dataclass(frozen=True)
class Trace:
    nodes: list[fleet.FleetNode]
    pods: list[dict[str, Any]]  # in creation (and scheduling) order


def trace(count: int, seed: int = 7, burst: int = 1000, paced: int = 300) -> Trace:
    """bench/cluster.py's fleet of `count` nodes and its burst and paced pod streams."""
    label = f"fleet{count}"
    nodes = fleet.plan(count, seed, label)
    gpus = [*fleet.stream(burst, seed), *fleet.stream(paced, seed + 1)]
    pods = []
    for i, g in enumerate(gpus):
        body = fleet.pod_body(f"pod-{i:05d}", NAMESPACE, label, g)
        created = f"2026-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
        body["metadata"] |= {"uid": f"uid-{i:05d}", "creationTimestamp": created, **_NOISE}
        body["spec"] |= _SPEC_NOISE
        pods.append(body)
    return Trace(nodes, pods)


def asks_devices(pod: dict[str, Any]) -> bool:
    return fleet.gpus_of(pod) > 0


def event_line(kind: str, pod: dict[str, Any], version: int) -> bytes:
    """One line of a pod watch, as the API server writes it."""
    obj = {**pod, "metadata": {**pod["metadata"], "resourceVersion": str(version)}}
    return orjson.dumps({"type": kind, "object": obj})


def bound(pod: dict[str, Any], node: str, phase: str) -> dict[str, Any]:
    return {**pod, "spec": {**pod["spec"], "nodeName": node}, "status": {"phase": phase}}


class Extender:
    """The extender as deployed: its cache fed from watch lines, asked in ExtenderArgs bytes."""

    def __init__(self, nodes: Sequence[fleet.FleetNode]) -> None:
        settings = ExtenderSettings()
        self.cache = ClusterCache.configured(settings)
        ready = {"type": nrt.CONDITION_RDMA_READY, "status": "True"}
        self.cache.replace("nrt", [n.nrt for n in nodes])
        self.cache.replace(
            "node",
            [
                {
                    "metadata": {"name": n.name, "labels": dict(n.labels)},
                    "status": {"conditions": [ready]},
                }
                for n in nodes
            ],
        )
        self.cache.replace("pod", [])
        self.shell = ExtenderShell(
            self.cache, Decisions(self.cache, settings.fabric), ExtenderMetrics(self.cache)
        )
        self.version = 0

    def see(self, kind: str, pod: dict[str, Any]) -> None:
        self.version += 1
        event, obj = read_pod_event(event_line(kind, pod, self.version))
        self.cache.apply("pod", event, obj)

    def answer(self, verb: str, body: bytes) -> bytes:
        """A call's reply, as the extender's HTTP service reads and writes it."""
        args = wire.parse_args(body)
        return self.shell.filter(args) if verb == "filter" else self.shell.prioritize(args)

    def filter(self, body: bytes) -> dict[str, Any]:
        reply: dict[str, Any] = orjson.loads(self.answer("filter", body))
        return reply

    def prioritize(self, body: bytes) -> list[dict[str, Any]]:
        reply: list[dict[str, Any]] = orjson.loads(self.answer("prioritize", body))
        return reply


@functools.cache
def _evaluate(state: nodestate.NodeState, request: podrequest.PodRequest) -> fit.Verdict:
    """`fit.evaluate` (pure: remembering its answers changes none)."""
    return fit.evaluate(state, request)


@dataclass
class Plain:
    """The plain path: each node's state as the NRT publishes it with the pods bound to it
    placed in order, each asked node evaluated on it."""

    nodes: Sequence[fleet.FleetNode]
    evaluate: Callable[[nodestate.NodeState, podrequest.PodRequest], fit.Verdict] = _evaluate
    states: dict[str, nodestate.NodeState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.states = fleet.node_states(self.nodes)

    def filter(self, pod: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
        request = podrequest.pod_request(pod)
        passed, failed, unresolvable = [], {}, {}
        for name in names:
            v = self.evaluate(self.states[name], request)
            if v.fits:
                passed.append(name)
            else:
                (unresolvable if v.unresolvable else failed)[name] = REASON_PREFIX + v.reason
        return {
            "Nodes": None,
            "NodeNames": passed,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }

    def prioritize(self, pod: dict[str, Any], names: Sequence[str]) -> list[dict[str, Any]]:
        request = podrequest.pod_request(pod)
        return [{"Host": n, "Score": self.evaluate(self.states[n], request).score} for n in names]

    def bind(self, pod: dict[str, Any], name: str) -> None:
        placed = topologymanager.place_pod(self.states[name], podrequest.pod_request(pod))
        if not isinstance(placed, devicemanager.Rejection):
            self.states[name] = placed[1]


@dataclass(frozen=True)
class Asked:
    """One device pod's calls: what was asked and what the extender answered."""

    pod: dict[str, Any]
    filter_body: bytes
    filtered: dict[str, Any]
    prioritize_body: bytes
    scores: list[dict[str, Any]]
    node: str | None  # where it was bound


def args(pod: dict[str, Any], names: Sequence[str]) -> bytes:
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": list(names)})


def replay(trace: Trace, extender: Extender, seed: int = 7) -> Iterator[Asked]:
    """The trace as the cluster plays it: every pod created (watched pending), then each in
    turn scheduled: a device pod's filter over the nodes kube-scheduler's own filters would
    pass (a rotating window of the nodes with room for its GPUs), prioritize over those that
    passed, bound to a best-scored one (ties at random); its binding and the kubelet's Running
    status watched. CPU-only pods are bound without the extender, as kube-scheduler does."""
    rng = random.Random(seed)
    names = [n.name for n in trace.nodes]
    gpus_free = {n.name: int(n.capacity.get(nrt.GPU, "0")) for n in trace.nodes}
    want = feasible_to_find(len(names))
    start = 0
    for pod in trace.pods:
        extender.see("ADDED", pod)
    for pod in trace.pods:
        gpus = fleet.gpus_of(pod)
        window, looked = [], 0
        while len(window) < want and looked < len(names):
            name = names[(start + looked) % len(names)]
            looked += 1
            if gpus_free[name] >= gpus:
                window.append(name)
        start = (start + looked) % len(names)
        node: str | None = window[0] if window else None
        if gpus and window:
            filter_body = args(pod, window)
            filtered = extender.filter(filter_body)
            passed = filtered["NodeNames"]
            prioritize_body = args(pod, passed)
            scores = extender.prioritize(prioritize_body)
            top = max((s["Score"] for s in scores), default=0)
            best = [s["Host"] for s in scores if s["Score"] == top]
            node = rng.choice(best) if best else None
            yield Asked(pod, filter_body, filtered, prioritize_body, scores, node)
        if node is not None:
            gpus_free[node] -= gpus
            extender.see("MODIFIED", bound(pod, node, "Pending"))
            extender.see("MODIFIED", bound(pod, node, "Running"))
