"""Placement quality judged by the kubelet: spread vs. NUMA-only vs. rdmaplane, one trace.

A cluster of bundled sample nodes (HGX H100 RoCE and HGX H200 IB: one GPU and one 400G NIC per
PCIe root, 2 NUMA nodes; DGX A100: 8 NUMA nodes, two GPUs + two NICs per switch; a PCIe L40S
server with NICs next to only two of its GPUs, all on socket 0) with a mix of Topology Manager
policies. Every node is a real kubelet admission: the kubelet's own device manager and Topology
Manager (the Go harness, tests/kubelet) with rdmaplane's device plugin on the sample's sysfs
tree and a GPU plugin stand-in registered. The node's NodeResourceTopology is what the agent
publishes from the kubelet's real allocations.

The cluster is prefilled to 60 % of its GPUs with random pods on random nodes (half of them
GPU-only, which leaves NICs without their GPU partner), then a trace of 1/2/4/8-GPU jobs (one
exclusive NIC per GPU) arrives, one per tick, while jobs finish. Each scheduler sees the same
trace on a fresh copy of the same cluster, chooses a node from the published NRTs, and the
kubelet decides: admitted (with the devices it really allocated) or rejected.

- spread: kube-scheduler's default scoring, node totals only, least-allocated GPUs wins;
- numa-only: a stand-in for scheduler-plugins' NodeResourceTopologyMatch (not the plugin:
  sigs.k8s.io/scheduler-plugins cannot be fetched here): single-numa-node nodes filtered per
  NUMA zone (a zone must hold the whole container), least-allocated NUMA zone wins;
- rdmaplane: this extender's filter and score (`placement.evaluate`).

NUMA-aligned: every GPU of the pod has one of its NICs on its NUMA node; PCIe-aligned: on its
PCIe root. Both from the devices the kubelet allocated. Shares are of admitted pods.

    .venv/bin/python bench/placement.py [--nodes 64] [--jobs 2000] [--seed 7]
                                        [--gpu-preference index|reverse|none]
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rdmaplane.core import nrt
from rdmaplane.services.scheduler.policy import fit, nodestate, podrequest
from tests.e2e.fleet import POLICY_MIX, pick
from tests.e2e.fleet import SAMPLE_MIX as LAYOUT_MIX
from tests.kubelet.differential import Container, PodShape
from tests.kubelet.gpu_plugin import PREFERENCES
from tests.kubelet.harness import (
    GPU,
    HCA,
    Admission,
    Backend,
    HarnessMissing,
    KubeletHarness,
    SampleNode,
    harness_binary,
    sample_node,
)

SIZES = ((1, 0.4), (2, 0.3), (4, 0.2), (8, 0.1))
TARGET_UTILISATION = 0.75
PREFILL_UTILISATION = 0.6
GPU_ONLY_SHARE = 0.5
SCHEDULERS = ("spread", "numa-only", "rdmaplane")


def _job(gpus: int, nics: bool = True) -> PodShape:
    return PodShape((Container("app", gpus, gpus if nics else 0),))


@dataclass
class Node:
    """A node of the cluster: its kubelet, and its published state as schedulers see it."""

    harness: KubeletHarness
    _state: nodestate.NodeState | None = None

    @property
    def state(self) -> nodestate.NodeState:
        if self._state is None:
            self._state = nodestate.node_state(self.harness.published())
        return self._state

    def admit(self, shape: PodShape, name: str) -> Admission:
        self._state = None
        return self.harness.admit(shape.manifest(name))

    def end(self, uid: str) -> None:
        self._state = None
        self.harness.delete(uid)


@dataclass
class Cluster:
    nodes: list[Node]
    memo: dict[tuple[nodestate.NodeState, podrequest.PodRequest], fit.Verdict] = field(
        default_factory=dict
    )

    def verdict(self, node: Node, request: podrequest.PodRequest) -> fit.Verdict:
        key = (node.state, request)
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = fit.evaluate(node.state, request)
        return found


ROOTED = (nrt.GPU, nrt.HCA)  # what the simple scorers count: GPUs and exclusive NICs


def _free(state: nodestate.NodeState, r: str) -> int:
    return sum(z.free[r] for z in state.zones)


def _cap(state: nodestate.NodeState, r: str) -> int:
    return sum(z.capacity[r] for z in state.zones)


def _spread(c: Cluster, n: Node, req: podrequest.PodRequest) -> float | None:
    s = n.state
    if any(_free(s, r) < req.total[r] for r in ROOTED):
        return None
    return round(10 * (_free(s, nrt.GPU) - req.total[nrt.GPU]) / max(_cap(s, nrt.GPU), 1))


def _numa_only(c: Cluster, n: Node, req: podrequest.PodRequest) -> float | None:
    s = n.state
    if any(_free(s, r) < req.total[r] for r in ROOTED):
        return None
    holds = [z for z in s.zones if all(z.free[r] >= req.total[r] for r in ROOTED)]
    if s.policy == "single-numa-node" and not holds:
        return None
    gpu = nrt.GPU
    scores = [
        round(10 * (z.free[gpu] - req.total[gpu]) / z.capacity[gpu])
        for z in holds
        if z.capacity[gpu]
    ]
    return max(scores, default=0)


def _rdmaplane(c: Cluster, n: Node, req: podrequest.PodRequest) -> float | None:
    v = c.verdict(n, req)
    return float(v.score) if v.fits else None


SCORERS: dict[str, Callable[[Cluster, Node, podrequest.PodRequest], float | None]] = {
    "spread": _spread,
    "numa-only": _numa_only,
    "rdmaplane": _rdmaplane,
}


def choose(name: str, c: Cluster, shape: PodShape, rng: random.Random) -> Node | None:
    """The node a scheduler picks (ties broken at random, as kube-scheduler does)."""
    request = podrequest.pod_request(shape.manifest("x"))
    best: list[Node] = []
    best_score = -1.0
    for node in c.nodes:
        score = SCORERS[name](c, node, request)
        if score is None:
            continue
        if score > best_score:
            best, best_score = [node], score
        elif score == best_score:
            best.append(node)
    return rng.choice(best) if best else None


def alignment(h: KubeletHarness, a: Admission) -> tuple[bool, bool]:
    """(NUMA-aligned, PCIe-aligned) of a GPU+NIC pod, from the devices it really got."""
    gpus = [h.facts[i] for i in a.devices(GPU)]
    hcas = [h.facts[i] for i in a.devices(HCA)]
    numa = Counter(n for f in hcas for n in f.numa)
    roots = Counter(f.root for f in hcas)
    numa_ok = pcie_ok = True
    for g in gpus:
        zone = g.numa[0] if g.numa else -1
        numa_ok &= numa[zone] > 0
        numa[zone] -= 1
        pcie_ok &= roots[g.root] > 0
        roots[g.root] -= 1
    return numa_ok, pcie_ok


@dataclass
class Tally:
    admitted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # by node policy
    unplaced: int = 0
    numa: list[int] = field(default_factory=lambda: [0, 0])  # all, multi-GPU
    pcie: list[int] = field(default_factory=lambda: [0, 0])
    multi: int = 0
    predicted_pcie: int = 0  # multi-GPU pods the extender predicted PCIe-aligned
    placed_by_size: Counter[int] = field(default_factory=Counter)


def build_cluster(
    backend: Backend,
    samples: dict[str, SampleNode],
    layout: list[tuple[str, str]],
    gpu_preference: str,
) -> Cluster:
    nodes = []
    for i, (kind, policy) in enumerate(layout):
        harness = KubeletHarness(
            samples[kind],
            policy,
            "container",
            gpu_preference=gpu_preference,
            name=f"n{i:03d}",
            backend=backend,
        )
        nodes.append(Node(harness.start()))
    return Cluster(nodes)


def prefill(c: Cluster, rng: random.Random, mean_life: float) -> list[tuple[float, int, int, str]]:
    """Random running pods on random nodes, admitted by their kubelets, up to the prefill
    utilisation: the fragmentation every scheduler starts from."""
    running: list[tuple[float, int, int, str]] = []
    capacity = sum(_cap(n.state, 0) for n in c.nodes)
    used = 0
    while used < PREFILL_UTILISATION * capacity:
        i = rng.randrange(len(c.nodes))
        gpus = pick(rng, SIZES[:3])
        shape = _job(gpus, nics=rng.random() >= GPU_ONLY_SHARE)
        admission = c.nodes[i].admit(shape, f"pre{len(running)}")
        if admission.admitted:
            used += gpus
            running.append((rng.expovariate(1 / mean_life), len(running), i, admission.uid))
    return running


def run(
    name: str,
    c: Cluster,
    running0: list[tuple[float, int, int, str]],
    trace: list[tuple[int, float]],
    seed: int,
) -> Tally:
    rng = random.Random(seed)
    running = list(running0)
    heapq.heapify(running)
    tally = Tally()
    for now, (gpus, life) in enumerate(trace):
        while running and running[0][0] <= now:
            _, _, i, uid = heapq.heappop(running)
            c.nodes[i].end(uid)
        shape = _job(gpus)
        node = choose(name, c, shape, rng)
        if node is None:
            tally.unplaced += 1
            continue
        predicted = fit.evaluate(node.state, podrequest.pod_request(shape.manifest("x")))
        admission = node.admit(shape, f"job{now}")
        if not admission.admitted:
            tally.rejected[node.harness.policy] += 1
            continue
        tally.admitted += 1
        tally.placed_by_size[gpus] += 1
        heapq.heappush(
            running, (now + life, len(running0) + now, c.nodes.index(node), admission.uid)
        )
        numa_ok, pcie_ok = alignment(node.harness, admission)
        tally.numa[0] += numa_ok
        tally.pcie[0] += pcie_ok
        if gpus > 1:
            tally.multi += 1
            tally.numa[1] += numa_ok
            tally.pcie[1] += pcie_ok
            tally.predicted_pcie += predicted.alignment == "pcie"
    return tally


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:5.1f}%" if d else "    -"


HEADER = (
    f"{'scheduler':<10} {'admitted':>8} {'rejected':>8} {'(snn/restr/b-e)':>15} {'unplaced':>8}"
    f"  {'NUMA-aligned':>12} {'PCIe-aligned':>12}  {'multi-GPU: NUMA':>15} {'PCIe':>6}"
    f" {'predicted PCIe':>14}  {'8-GPU jobs':>10}  placed 1/2/4/8"
)


def _row(name: str, t: Tally) -> str:
    by_policy = "/".join(str(t.rejected[p]) for p, _ in POLICY_MIX)
    sizes = "/".join(str(t.placed_by_size[g]) for g, _ in SIZES)
    return (
        f"{name:<10} {t.admitted:>8} {sum(t.rejected.values()):>8} {by_policy:>15}"
        f" {t.unplaced:>8}  {_pct(t.numa[0], t.admitted):>12} {_pct(t.pcie[0], t.admitted):>12}"
        f"  {_pct(t.numa[1], t.multi):>15} {_pct(t.pcie[1], t.multi):>6}"
        f" {_pct(t.predicted_pcie, t.multi):>14}  {t.placed_by_size[8]:>10}  {sizes}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--gpu-preference",
        choices=PREFERENCES,
        default="index",
        help="the GPU plugin stand-in's GetPreferredAllocation: lowest indices first (index), "
        "highest (reverse), or none (the kubelet picks at random)",
    )
    args = parser.parse_args()
    try:
        harness_binary()
    except HarnessMissing as e:
        sys.exit(f"bench/placement.py: {e}")
    rng = random.Random(args.seed)
    layout = [(pick(rng, LAYOUT_MIX), pick(rng, POLICY_MIX)) for _ in range(args.nodes)]
    trace_rng = random.Random(args.seed + 1)
    with ExitStack() as stack:
        samples = {k: stack.enter_context(sample_node(k)) for k, _ in LAYOUT_MIX}
        capacity = sum(len(samples[k].gpus()) for k, _ in layout)
        mean_gpus = sum(g * w for g, w in SIZES)
        mean_life = TARGET_UTILISATION * capacity / mean_gpus  # Little's law: one job per tick
        trace = [
            (pick(trace_rng, SIZES), trace_rng.expovariate(1 / mean_life)) for _ in range(args.jobs)
        ]
        kinds = Counter(k for k, _ in layout)
        policies = Counter(p for _, p in layout)
        print(f"cluster: {args.nodes} nodes, {capacity} GPUs; layouts {dict(kinds)}")
        print(f"policies {dict(policies)}, scope container; seed {args.seed}")
        print(
            f"prefilled to {PREFILL_UTILISATION:.0%} of GPUs (half of the pods GPU-only); "
            f"trace: {args.jobs} jobs of 1/2/4/8 GPUs with one NIC per GPU, "
            f"{TARGET_UTILISATION:.0%} target load"
        )
        print(
            "judged by the kubelet's device manager + Topology Manager v1.37.2 with rdmaplane's "
            f"device plugin and a GPU plugin preferring: {args.gpu_preference}"
        )
        print(HEADER)
        for name in SCHEDULERS:
            start = time.perf_counter()
            backend = Backend.start()
            try:
                cluster = build_cluster(backend, samples, layout, args.gpu_preference)
                running = prefill(cluster, random.Random(args.seed + 2), mean_life)
                tally = run(name, cluster, running, trace, args.seed)
            finally:
                backend.close()
            print(f"{_row(name, tally)}  ({time.perf_counter() - start:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
