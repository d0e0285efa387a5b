"""Multi-node jobs on the fabric: default scoring vs rdmaplane's job-aware scoring, one run.

A 256-node cluster (HGX layout: 8 GPUs + 8 NICs per node) under 16 leaves of 16 nodes, 4
leaves per spine, one core above the spines. A stream of jobs arrives, each a set of whole-node
pods (8 GPUs + 8 NICs) of 2, 4, 8 or 16 nodes, runs for a while and leaves; one arrival in five
is a prefill/decode pair instead: a prefill group of 2-4 nodes, then a decode group of 2-4 nodes
with `rdmaplane.io/kv-peers` naming the prefill group. Both schedulers see the same trace.
A job's pods are all created before the first is scheduled (as a Job controller does), then
placed one at a time, each on the best-scoring node:

- default: kube-scheduler's default scoring. Every pod takes a whole node, so every free node
  scores the same under NodeResourcesFit/BalancedAllocation: the pick is random among them;
- rdmaplane: the extender's cache (`ClusterCache.job_scores`): the node-local score composed
  with the job-aware fabric term, ties broken at random.

Jobs arriving when fewer nodes are free than they need are turned away (the same for both:
every job takes exactly its size in nodes, so free counts move identically).

Figures, all computed by rdmaplane's own fabric model (`rdmaplane.core.fabric.hops`) from where the
pods landed, not measured on a network:
- one leaf: share of jobs entirely under one leaf, of those that could fit under one leaf when
  they arrived (some leaf had enough free nodes);
- hops: mean over jobs of the mean switch hops between two of its ranks (1 under a leaf, 3
  through a spine, 5 through the core); *saved* = 5 − that, the hops saved against a job spread
  over the whole fabric;
- PD: share of decode pods under a leaf that holds one of their prefill's pods.

`--rails`: a job trace of 2-4 pods of 2 or 4 GPUs (+ as many NICs) on 16 rail-optimised sample
nodes, each pod admitted by its node's real kubelet admission (the harness, tests/kubelet); the
share of a job's cross-node pod pairs whose rails match, from the NICs the kubelet allocated,
default (least-allocated) vs rdmaplane; and the same share over the jobs the cluster let match
as they arrived (one node took all their pods, or as many nodes as pods offered one rail set):
on a busy cluster some jobs can match on no rails at all.

    python bench/fabric.py --rails [--jobs 300] [--seed 11]

`--rails --real N`: N arrivals of that trace (lifetimes scaled to the cluster) on the 256 nodes
below as KWOK nodes of the same sample (its kubelet's capacity, its agent's NRT with rails),
through the real kube-scheduler alone and with the extender, one arrival at a time as below (a
job whose pods the free GPUs no longer hold is turned away). KWOK runs no agent: as a watch sees
a pod bound or gone, the bench replays that node's pods through one kubelet harness and writes
the NRT the agent would then publish (the agent's own builder), so the extender reads what it
would in a real cluster, a little late, as from an agent. KWOK runs no kubelet either: the real
bindings (which node, in binding order, and when each pod ended) are then replayed again node by
node through the harness, for the NICs the kubelet would give each pod, so its rails; the
shares are counted as above, `matchable` and the prediction on the NRTs the agent would have
published after each step.

    python bench/fabric.py --rails --real 1500 [--seed 11]

With `--real N`, the trace's first N arrivals then go through the real thing: kube-scheduler
v1.37.2 (scripts/build-k8s.sh) on a control plane with the Workload API gates on, the 256 nodes
as KWOK nodes with the agent's tier labels and NRTs, the extender as deployed (its own process,
its RBAC). Each arm runs alone in turn on the same nodes, in a fresh namespace with a fresh
kube-scheduler, one arrival at a time: finished jobs' pods are deleted, a job's pods are created
held by a scheduling gate (and, with the extender, until it counts the job whole: the model's
"all created before the first is scheduled"), the gate lifted, and the bindings awaited:

- default: kube-scheduler alone;
- extender: with deploy/scheduler's config (httpTimeout raised to 30 s: the extender shares
  a loaded machine, and an ignorable timeout would hand the pod to the default scoring);
- extender-all: the same with `percentageOfNodesToScore: 100` (kube-scheduler's default stops
  looking after ~48 % of 256 nodes have passed its filters, so the extender sees only those);
- gangs: each job (each PD group) a Workload API gang (`gang.minCount` = its size, topology key
  the leaf label), with the extender. A gang no leaf has room for is judged unschedulable by
  kube-scheduler and withdrawn (it would wait holding nothing): *left waiting*.

One leaf, hops and PD are then counted from those bindings (hops on our fabric model), beside
the model on the same N arrivals.

    python bench/fabric.py [--jobs 1500] [--seed 11] [--real 600]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import heapq
import itertools
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/layouts.py

import httpx2
from cluster import cluster_with_kwok
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from rdmaplane.adapters.kube import NodeResourceTopology, load_config
from rdmaplane.core import fabric as fab
from rdmaplane.core import nrt
from rdmaplane.core.settings.scheduler import FabricScoring
from rdmaplane.services.agent.publisher import FREED_ANNOTATION
from rdmaplane.services.scheduler.cache import ClusterCache, pod_key
from rdmaplane.services.scheduler.policy import podrequest
from rdmaplane.services.scheduler.policy import rails as rl
from tests.e2e import fleet, scalerig
from tests.e2e.controlplane import (
    KubeCluster,
    build_dir,
    free_port,
    launch_extender,
    launch_scheduler,
)
from tests.e2e.test_fabric import _job_seen_whole
from tests.e2e.test_gangs import (
    APISERVER_FLAGS,
    GATES,
    PodGroup,
    Workload,
    gang_objects,
)
from tests.layouts import layout

LEAVES, PER_LEAF, LEAVES_PER_SPINE = 16, 16, 4
SIZES = ((2, 0.35), (4, 0.3), (8, 0.25), (16, 0.1))
PD_SHARE = 0.2
TARGET_UTILISATION = 0.7
TOP_HOPS = 5.0
JOB = "batch.kubernetes.io/job-name"
T = TypeVar("T")


def build_fabric(
    leaves: int = LEAVES, per_leaf: int = PER_LEAF, per_spine: int = LEAVES_PER_SPINE
) -> fab.Fabric:
    spines = -(-leaves // per_spine)
    switches = [fab.Switch("core", 2)]
    switches += [fab.Switch(f"spine-{s}", 1, "core") for s in range(spines)]
    switches += [fab.Switch(f"leaf-{i:02d}", 0, f"spine-{i // per_spine}") for i in range(leaves)]
    nodes = [f"gpu-{k:03d}" for k in range(leaves * per_leaf)]
    links = [fab.Link(n, f"leaf-{k // per_leaf:02d}") for k, n in enumerate(nodes)]
    return fab.build_fabric(switches, links, nodes)


def new_cache(fabric: fab.Fabric) -> ClusterCache:
    cache = ClusterCache()
    where = fabric.locations()
    cache.replace(
        "node",
        [
            {"metadata": {"name": n, "labels": fab.tier_labels(where[n], fab.DEFAULT_TIER_LABELS)}}
            for n in fabric.nodes
        ],
    )
    cache.replace("nrt", [nrt.to_object(layout("hgx", n)) for n in fabric.nodes])
    cache.replace("pod", [])
    return cache


@dataclass
class Job:
    name: str
    size: int
    labels: dict[str, str]
    prefill: str | None = None  # the prefill job a decode job reads from
    placed: list[str] = field(default_factory=list)
    gpus: int = 8  # per pod, and as many HCAs: a whole HGX node unless `--rails`
    namespace: str = "bench"


def pods_of(job: Job) -> list[dict[str, Any]]:
    limits = {nrt.GPU: str(job.gpus), nrt.HCA: str(job.gpus)}
    return [
        {
            "metadata": {
                "name": f"{job.name}-{i}",
                "namespace": job.namespace,
                "labels": job.labels,
            },
            "spec": {
                "containers": [{"name": "m", "resources": {"limits": limits, "requests": limits}}]
            },
            "status": {"phase": "Pending"},
        }
        for i in range(job.size)
    ]


class Scheduler:
    def __init__(self, name: str, fabric: fab.Fabric, seed: int) -> None:
        self.name = name
        self.cache = new_cache(fabric)
        self.rng = random.Random(seed)
        self.weights = FabricScoring() if name == "rdmaplane" else FabricScoring(0, 1)
        self.names = sorted(fabric.nodes)
        self.seconds = 0.0  # scoring time, for the ms/pod column
        self.pods = 0

    def add(self, job: Job) -> None:
        for p in pods_of(job):
            self.cache.apply("pod", "ADDED", p)

    def run(self, job: Job) -> list[str]:
        placed = []
        for p in pods_of(job):
            started = time.perf_counter()
            request = podrequest.pod_request(p)
            verdicts = self.cache.verdicts(self.names, request)
            scores, _ = self.cache.job_scores(p, self.names, request, verdicts, self.weights)
            fits = [(s, n) for s, n, v in zip(scores, self.names, verdicts, strict=True) if v.fits]
            top = max(s for s, _ in fits)
            chosen = self.rng.choice([n for s, n in fits if s == top])
            self.seconds += time.perf_counter() - started
            self.cache.apply("pod", "MODIFIED", {**p, "spec": {**p["spec"], "nodeName": chosen}})
            placed.append(chosen)
        self.pods += len(placed)
        return placed

    def finish(self, job: Job) -> None:
        for p in pods_of(job):
            self.cache.apply("pod", "DELETED", p)


def trace(count: int, rng: random.Random) -> list[tuple[Job, ...]]:
    """Arrivals: single jobs, or (prefill, decode) pairs."""
    out: list[tuple[Job, ...]] = []
    for k in range(count):
        if rng.random() < PD_SHARE:
            pre = Job(f"p{k}", rng.choice((2, 4)), {"rdmaplane.io/group": f"p{k}"})
            dec = Job(
                f"d{k}",
                rng.choice((2, 3, 4)),
                {"rdmaplane.io/group": f"d{k}", "rdmaplane.io/kv-peers": f"p{k}"},
                prefill=pre.name,
            )
            out.append((pre, dec))
        else:
            size = rng.choices([s for s, _ in SIZES], [w for _, w in SIZES])[0]
            out.append((Job(f"j{k}", size, {JOB: f"j{k}"}),))
    return out


@dataclass
class Tally:
    fit_possible: int = 0
    one_leaf: int = 0
    jobs: int = 0
    hops: float = 0.0
    decode_pods: int = 0
    decode_near: int = 0


def mean_hops(where: dict[str, fab.Location], nodes: list[str]) -> float:
    pairs = list(itertools.combinations(nodes, 2))
    return sum(fab.hops(where[a], where[b]) for a, b in pairs) / len(pairs) if pairs else 1.0


def leaves_of(fabric: fab.Fabric) -> dict[str, str]:
    return {n: loc.tiers[0] for n, loc in fabric.locations().items()}


Schedule = list[tuple[float, float, tuple[Job, ...]]]


def timed(arrivals: list[tuple[Job, ...]], gap: float, rng: random.Random) -> Schedule:
    """Each arrival's moment and how long it runs (mean 1.0): drawn once, the same for every
    scheduler, model or real."""
    out, now = [], 0.0
    for group in arrivals:
        now += rng.expovariate(1 / gap)
        out.append((now, rng.expovariate(1.0), group))
    return out


def run_model(
    schedule: Schedule, fabric: fab.Fabric, seed: int
) -> tuple[dict[str, Tally], list[Scheduler], int]:
    """Both model schedulers in lockstep over `schedule`: tallies, schedulers, turned away."""
    where, leaf = fabric.locations(), leaves_of(fabric)
    schedulers = [Scheduler(n, fabric, seed) for n in ("default", "rdmaplane")]
    tallies = {s.name: Tally() for s in schedulers}
    running: list[tuple[float, int, Job, dict[str, list[str]]]] = []
    free = len(fabric.nodes)
    turned_away, seq = 0, 0
    for now, duration, group in schedule:
        while running and running[0][0] <= now:
            _, _, done, _ = heapq.heappop(running)
            free += done.size
            for s in schedulers:
                s.finish(done)
        if sum(j.size for j in group) > free:
            turned_away += 1
            continue
        for s in schedulers:  # a job's pods (a PD pair's both groups) exist before any is placed
            for job in group:
                s.add(job)
        for job in group:
            placed_by: dict[str, list[str]] = {}
            for s in schedulers:
                room = _free_per_leaf(s.cache, leaf)
                placed = s.run(job)
                placed_by[s.name] = placed
                _count(tallies[s.name], job, placed, room, where, leaf, running, s.name)
            free -= job.size
            seq += 1
            heapq.heappush(running, (now + duration, seq, job, placed_by))
    return tallies, schedulers, turned_away


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--real",
        type=int,
        default=0,
        metavar="ARRIVALS",
        help="also send the trace's first ARRIVALS arrivals through the real kube-scheduler on "
        "KWOK, four ways (needs `make k8s-bins`); with --rails, ARRIVALS jobs of the rails "
        "trace on the 256 nodes, two ways, the bindings replayed through the kubelet harness",
    )
    parser.add_argument(
        "--rails", action="store_true", help="matching rails, judged by the kubelet harness"
    )
    args = parser.parse_args()
    if args.rails:
        rails_main(args)
        return
    fabric = build_fabric()
    rng = random.Random(args.seed)
    arrivals = trace(args.jobs, rng)
    mean_size = sum(s * w for s, w in SIZES)
    gap = mean_size / (len(fabric.nodes) * TARGET_UTILISATION)  # mean duration 1.0
    schedule = timed(arrivals, gap, rng)
    tallies, schedulers, turned_away = run_model(schedule, fabric, args.seed)
    _report(tallies, schedulers, args, turned_away, len(arrivals))
    if args.real:
        real(schedule[: args.real], fabric)


def _free_per_leaf(cache: ClusterCache, leaf: dict[str, str]) -> dict[str, int]:
    request = podrequest.PodRequest.of({nrt.GPU: 8, nrt.HCA: 8})
    names = sorted(leaf)
    room: dict[str, int] = {}
    for n, v in zip(names, cache.verdicts(names, request), strict=True):
        room[leaf[n]] = room.get(leaf[n], 0) + v.fits
    return room


def _count(
    tally: Tally,
    job: Job,
    placed: list[str],
    room: dict[str, int],
    where: dict[str, fab.Location],
    leaf: dict[str, str],
    running: list[tuple[float, int, Job, dict[str, list[str]]]],
    scheduler: str,
) -> None:
    tally.jobs += 1
    tally.hops += mean_hops(where, placed)
    if max(room.values()) >= job.size:
        tally.fit_possible += 1
        tally.one_leaf += len({leaf[n] for n in placed}) == 1
    if job.prefill is not None:
        prefill = next(p for _, _, j, p in running if j.name == job.prefill)[scheduler]
        near = {leaf[n] for n in prefill}
        tally.decode_pods += len(placed)
        tally.decode_near += sum(leaf[n] in near for n in placed)


COLUMNS = (
    f"{'scheduler':<22} {'jobs':>5} {'one leaf':>9} {'mean hops':>10} {'saved':>6} {'PD near':>8}"
)


def _row(name: str, t: Tally) -> str:
    """A scheduler's figures: one leaf, mean hops, hops saved, PD near."""
    hops = t.hops / max(1, t.jobs)
    return (
        f"{name:<22} {t.jobs:>5} {100 * t.one_leaf / max(1, t.fit_possible):>8.1f}% "
        f"{hops:>10.2f} {TOP_HOPS - hops:>6.2f} "
        f"{100 * t.decode_near / max(1, t.decode_pods):>7.1f}%"
    )


def _report(
    tallies: dict[str, Tally],
    schedulers: list[Scheduler],
    args: argparse.Namespace,
    turned_away: int,
    arrivals: int,
) -> None:
    print(
        f"fabric: {LEAVES} leaves x {PER_LEAF} nodes, {LEAVES // LEAVES_PER_SPINE} spines, 1 core;"
        f" {arrivals} arrivals (seed {args.seed}), {turned_away} turned away (cluster full)"
    )
    print(f"{COLUMNS} {'ms/pod':>7}")
    saved = {}
    for s in schedulers:
        t = tallies[s.name]
        saved[s.name] = TOP_HOPS - t.hops / t.jobs
        print(f"{_row(s.name, t)} {1000 * s.seconds / max(1, s.pods):>7.2f}")
    ratio = saved["rdmaplane"] / saved["default"] if saved["default"] > 0 else float("inf")
    print(f"hops saved, rdmaplane vs default: {ratio:.1f}x")
    print(
        "one leaf = share of jobs under one leaf, of those that could fit under one when they "
        "arrived; hops and PD by rdmaplane's own fabric model, not measured on a network"
    )


# ---------------------------------------------------------------------------------------------
# --rails: matching rails across a job's pods, judged by the kubelet's own allocation

RAIL_NODES, RAIL_SAMPLE = 16, "hgx-h100-roce"  # one GPU + one NIC per PCIe root: rail-optimised
RAIL_SIZES = ((2, 0.5), (4, 0.5))  # GPUs (and NICs) per pod
RAIL_PODS = (2, 3, 4)  # pods per job


@dataclass
class RailTally:
    pairs: int = 0  # cross-node pairs of one job's pods
    matched: int = 0  # ... whose rails (the kubelet's allocation) match
    pods: int = 0
    predicted: int = 0  # pods whose rails the extender predicted as the kubelet gave them
    predicted_seen: int = 0  # ... on the NRTs as the real extender saw them (real arms)
    unplaced: int = 0
    allowed_pairs: int = 0  # cross-node pairs of jobs the fabric let match (`matchable`)
    allowed_matched: int = 0


def matchable(cache: ClusterCache, names: list[str], pod: dict[str, Any], count: int) -> bool:
    """Whether the cluster, as the job arrives, lets all its `count` pods match: one node
    takes them all (no pair crosses nodes), or `count` nodes would each give one of them
    the same rails (by the extender's prediction on the published NRTs, exact on this
    sample)."""
    request = podrequest.pod_request(pod)
    verdicts = cache.verdicts(names, request)
    offered = Counter(cache.rails_at(n, v) for n, v in zip(names, verdicts, strict=True) if v.fits)
    whole = any(cache.slots(n, request, count) >= count for n in names)
    return whole or any(n >= count for r, n in offered.items() if r)


def rail_cache(nodes: Mapping[str, Mapping[str, str]]) -> ClusterCache:
    """An extender cache of `nodes` (name -> labels), no NRT or pod yet."""
    cache = ClusterCache()
    objs = [{"metadata": {"name": n, "labels": dict(labels)}} for n, labels in nodes.items()]
    cache.replace("node", objs)
    cache.replace("pod", [])
    return cache


class RailCluster:
    """Kubelet harnesses (one per node) and an extender cache fed their published NRTs."""

    def __init__(
        self,
        backend: Any,
        sample: Any,
        weights: FabricScoring,
        nodes: Mapping[str, Mapping[str, str]],
    ) -> None:
        """`nodes`: each node's name and labels (the agent's tier labels, if any)."""
        from tests.kubelet.harness import KubeletHarness

        self.weights = weights
        self.nodes = {
            n: KubeletHarness(sample, "best-effort", "container", name=n, backend=backend).start()
            for n in nodes
        }
        self.names = sorted(self.nodes)
        self.cache = rail_cache(nodes)
        self.cache.replace("nrt", [self._nrt(n) for n in self.names])

    def _nrt(self, name: str) -> dict[str, Any]:
        h = self.nodes[name]
        return nrt.to_object(h.published(h.rail_uplinks()))

    def choose(self, pod: dict[str, Any], rng: random.Random, rdmaplane: bool) -> str | None:
        request = podrequest.pod_request(pod)
        verdicts = self.cache.verdicts(self.names, request)
        if rdmaplane:
            scores, _ = self.cache.job_scores(pod, self.names, request, verdicts, self.weights)
        else:  # kube-scheduler's default NodeResourcesFit: least allocated GPUs
            gpus = request.total[nrt.GPU]
            scores = [self._free_gpus(n) - gpus for n in self.names]
        fits = [(s, n) for s, n, v in zip(scores, self.names, verdicts, strict=True) if v.fits]
        if not fits:
            return None
        top = max(s for s, _ in fits)
        return rng.choice([n for s, n in fits if s == top])

    def matchable(self, pod: dict[str, Any], count: int) -> bool:
        return matchable(self.cache, self.names, pod, count)

    def _free_gpus(self, name: str) -> int:
        entry = self.cache.entry(name)
        return sum(z.free[nrt.GPU] for z in entry.state.zones) if entry else 0

    def bind(self, pod: dict[str, Any], name: str) -> tuple[str, frozenset[int], bool] | None:
        """Bind the pod, let the node's kubelet admit it; (uid, its real rails, predicted?)."""
        request = podrequest.pod_request(pod)
        predicted = self.cache.rails_at(name, self.cache.verdict(name, request))
        h = self.nodes[name]
        admission = h.admit(pod)
        if not admission.admitted:
            return None
        bound = {**pod, "spec": {**pod["spec"], "nodeName": name}}
        self.cache.apply("pod", "MODIFIED", bound)
        self.cache.apply("nrt", "MODIFIED", self._nrt(name))
        got = h.rails(admission)
        return admission.uid, got, got == predicted

    def end(self, pod: dict[str, Any], name: str, uid: str) -> None:
        self.nodes[name].delete(uid)
        self.cache.apply("pod", "DELETED", pod)
        self.cache.apply("nrt", "MODIFIED", self._nrt(name))


RailArrival = tuple[str, int, int, float]  # job, pods, GPUs per pod, lifetime in arrivals


def rail_trace(count: int, rng: random.Random, nodes: int = RAIL_NODES) -> list[RailArrival]:
    """The arrivals; lifetimes grow with the cluster, so it is as busy at any size."""
    life = 12 * nodes / RAIL_NODES
    return [
        (
            f"j{k}",
            rng.choice(RAIL_PODS),
            rng.choices([s for s, _ in RAIL_SIZES], [w for _, w in RAIL_SIZES])[0],
            rng.expovariate(1 / life),
        )
        for k in range(count)
    ]


def rail_job(arrival: RailArrival) -> Job:
    name, count, gpus, _ = arrival
    return Job(name, count, {JOB: name}, gpus=gpus)


def tally_pairs(tally: RailTally, rails: list[tuple[str, frozenset[int]]], allowed: bool) -> None:
    """Count a job's cross-node pod pairs (node, rails of each placed pod) and which match."""
    for (na, ra), (nb, rb) in itertools.combinations(rails, 2):
        if na != nb:
            match = rl.rails_match(ra, rb)
            tally.pairs += 1
            tally.matched += match
            tally.allowed_pairs += allowed
            tally.allowed_matched += allowed and match


def run_rails(
    cluster: RailCluster, arrivals: list[RailArrival], seed: int, rdmaplane: bool
) -> RailTally:
    rng, tally = random.Random(seed), RailTally()
    running: list[tuple[float, int, list[tuple[dict[str, Any], str, str]]]] = []
    for now, arrival in enumerate(arrivals):
        while running and running[0][0] <= now:
            for pod, name, uid in heapq.heappop(running)[2]:
                cluster.end(pod, name, uid)
        pods = pods_of(rail_job(arrival))
        allowed = cluster.matchable(pods[0], len(pods))
        for p in pods:  # the job's pods exist before the first is scheduled
            cluster.cache.apply("pod", "ADDED", p)
        held: list[tuple[dict[str, Any], str, str]] = []
        rails: list[tuple[str, frozenset[int]]] = []
        for p in pods:
            name = cluster.choose(p, rng, rdmaplane)
            got = cluster.bind(p, name) if name is not None else None
            if name is None or got is None:
                tally.unplaced += 1
                cluster.cache.apply("pod", "DELETED", p)
                continue
            uid, real, predicted = got
            held.append((p, name, uid))
            rails.append((name, real))
            tally.pods += 1
            tally.predicted += predicted
        tally_pairs(tally, rails, allowed)
        heapq.heappush(running, (now + arrival[3], now, held))
    for _, _, held in running:
        for pod, name, uid in held:
            cluster.end(pod, name, uid)
    return tally


@contextlib.contextmanager
def rail_cluster(sample: Any, nodes: Mapping[str, Mapping[str, str]]) -> Iterator[RailCluster]:
    """A `RailCluster` on a kubelet backend of its own, closed after."""
    from tests.kubelet.harness import Backend, HarnessMissing

    try:
        backend = Backend.start()
    except HarnessMissing as exc:
        sys.exit(
            f"error: the kubelet harness is not built ({exc}); "
            "run scripts/build-k8s.sh kubelet-harness"
        )
    try:
        yield RailCluster(backend, sample, FabricScoring(), nodes)
    finally:
        backend.close()


RAIL_COLUMNS = (
    f"{'scheduler':<22} {'pods':>5} {'unplaced':>9} {'pairs':>6} {'rails match':>12} "
    f"{'allowed pairs':>14} {'match there':>12} {'predicted':>10}"
)
RAIL_LEGEND = (
    "rails match = share of a job's pod pairs on different nodes whose NICs' rails match "
    "(one's among the other's), by the kubelet's own allocation; allowed pairs / match "
    "there = the same over the jobs the fabric let match as they arrived (one node held "
    "them all, or as many nodes as pods offered one rail set, by the extender's "
    "prediction); predicted = share of pods whose rails the extender predicted as the "
    "kubelet gave them"
)


def _rail_row(name: str, t: RailTally) -> str:
    return (
        f"{name:<22} {t.pods:>5} {t.unplaced:>9} {t.pairs:>6} "
        f"{100 * t.matched / max(1, t.pairs):>11.1f}% {t.allowed_pairs:>14} "
        f"{100 * t.allowed_matched / max(1, t.allowed_pairs):>11.1f}% "
        f"{100 * t.predicted / max(1, t.pods):>9.1f}%"
    )


def rails_main(args: argparse.Namespace) -> None:
    """Default vs rdmaplane on matching rails, every pod admitted by a real kubelet."""
    from tests.kubelet.harness import sample_node

    if args.real:
        real_rails(args.real, args.seed)
        return
    arrivals = rail_trace(args.jobs, random.Random(args.seed))
    print(
        f"rails: {RAIL_NODES} {RAIL_SAMPLE} nodes (8 GPUs, NIC k on rail k), one rail group; "
        f"{len(arrivals)} jobs of {'/'.join(map(str, RAIL_PODS))} pods x "
        f"{'/'.join(str(s) for s, _ in RAIL_SIZES)} GPUs+NICs (seed {args.seed}); "
        "rails from the NICs each pod's kubelet allocated"
    )
    print(RAIL_COLUMNS)
    nodes: dict[str, dict[str, str]] = {f"node-{i:02d}": {} for i in range(RAIL_NODES)}
    with sample_node(RAIL_SAMPLE) as sample:
        for name in ("default", "rdmaplane"):
            with rail_cluster(sample, nodes) as cluster:
                t = run_rails(cluster, arrivals, args.seed, name == "rdmaplane")
            print(_rail_row(name, t))
    print(RAIL_LEGEND)


# ---------------------------------------------------------------- the real kube-scheduler (--real)


@dataclass(frozen=True)
class ArmSetup:
    label: str
    extender: bool  # kube-scheduler calls rdmaplane's extender (deploy/scheduler's config)
    gangs: bool  # each job a Workload API gang, all under one leaf
    score_all: bool = False  # percentageOfNodesToScore: 100 (default: kube-scheduler's own)


REAL_ARMS = {
    "default": ArmSetup("kube-scheduler alone", False, False),
    "extender": ArmSetup("kube-scheduler + rdmaplane's extender", True, False),
    "extender-all": ArmSetup("the same, percentageOfNodesToScore: 100", True, False, True),
    "gangs": ArmSetup("Workload API gangs, one leaf each, + the extender", True, True),
}
HOLD = "rdmaplane.io/bench-hold"  # a scheduling gate, lifted once all of a job's pods exist
PLACED_WITHIN_S = 300.0  # generous: a loaded 2-core machine
SCHEDULER_QPS = 1000.0  # kube-scheduler's default 50 QPS would pace the binds, not the judging


def kwok_nodes(
    fabric: fab.Fabric,
    sample: str = "hgx",
    capacity: Mapping[str, str] | None = None,
    nrt_of: Callable[[str], dict[str, Any]] | None = None,
) -> list[fleet.FleetNode]:
    """The fabric's nodes as KWOK nodes of `sample`: the agent's tier labels, the capacity the
    kubelet reports (an HGX's 8 GPUs + 8 HCAs unless given), the NRT its agent publishes."""
    where = fabric.locations()
    return [
        fleet.FleetNode(
            n,
            sample,
            "best-effort",
            "container",
            {**fab.tier_labels(where[n], fab.DEFAULT_TIER_LABELS), fleet.FLEET_LABEL: "fabric"},
            capacity or {nrt.GPU: "8", nrt.HCA: "8"},
            nrt_of(n) if nrt_of else nrt.to_object(layout(sample, n)),
        )
        for n in sorted(fabric.nodes)
    ]


def real_pod(body: dict[str, Any], namespace: str, pod_group: str | None) -> dict[str, Any]:
    """`pods_of`'s pod as created: held by a scheduling gate, naming its PodGroup if any."""
    spec = {**body["spec"], "terminationGracePeriodSeconds": 0, "schedulingGates": [{"name": HOLD}]}
    spec["containers"] = [{**c, "image": "trainer"} for c in spec["containers"]]
    if pod_group is not None:
        spec["schedulingGroup"] = {"podGroupName": pod_group}
    meta = {**body["metadata"], "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@dataclass
class RealArm:
    """One scheduler setup, its namespace, and the bindings a watch of it saw."""

    name: str
    kube: AsyncClient
    namespace: str
    seen: fleet.Bindings
    extender: str | None  # its URL, when kube-scheduler calls it
    gangs: bool


@dataclass
class RealResult:
    tally: Tally
    turned_away: int
    left_waiting: int  # gangs judged unschedulable (no leaf had room), withdrawn
    seconds: float


async def place(arm: RealArm, job: Job, fits_a_leaf: bool) -> list[str] | None:
    """Create the job's pods (and its gang), lift their gate once the extender counts the job
    whole, and return the nodes kube-scheduler bound them to; None for a gang it judged
    unschedulable when no leaf had room for it (withdrawn: it would wait, holding nothing)."""
    group = f"{job.name}-workers" if arm.gangs else None
    if arm.gangs:
        workload, pod_group = gang_objects(arm.namespace, job.name, job.size)
        await arm.kube.create(Workload.from_dict(workload))
        await arm.kube.create(PodGroup.from_dict(pod_group))
    bodies = [real_pod(p, arm.namespace, group) for p in pods_of(job)]
    await asyncio.gather(*(arm.kube.create(Pod.from_dict(b)) for b in bodies))
    if arm.extender is not None:  # as the model: every pod of the job exists before any binds
        await _job_seen_whole(arm.extender, bodies[0], job.size)
    names = [b["metadata"]["name"] for b in bodies]
    lift = {"spec": {"schedulingGates": None}}
    await asyncio.gather(
        *(arm.kube.patch(Pod, n, lift, namespace=arm.namespace, patch_type=PatchType.MERGE)
          for n in names)
    )  # fmt: skip
    deadline = time.monotonic() + PLACED_WITHIN_S
    while waiting := await arm.seen.wait_for(names, 1.0):
        if group is not None and not fits_a_leaf and await _unschedulable(arm, group):
            await finish(arm, job)
            return None
        if time.monotonic() > deadline:
            raise TimeoutError(f"{arm.name}: {len(waiting)} pods of {job.name} still unbound")
    return [arm.seen.bound[n].node for n in names]


async def _unschedulable(arm: RealArm, pod_group: str) -> bool:
    got = await arm.kube.get(PodGroup, pod_group, namespace=arm.namespace)
    conditions = (got.get("status") or {}).get("conditions") or []
    return any(
        c["type"] == "PodGroupInitiallyScheduled" and c["status"] == "False" for c in conditions
    )


async def finish(arm: RealArm, job: Job) -> None:
    """The job's pods go at once (grace 0), and its gang with them."""
    kube, ns = arm.kube, arm.namespace
    await asyncio.gather(
        *(kube.delete(Pod, p["metadata"]["name"], namespace=ns, grace_period=0)
          for p in pods_of(job))
    )  # fmt: skip
    if arm.gangs:
        await kube.delete(PodGroup, f"{job.name}-workers", namespace=ns)
        await kube.delete(Workload, job.name, namespace=ns)


async def run_arm(arm: RealArm, schedule: Schedule, fabric: fab.Fabric) -> tuple[Tally, int, int]:
    """The model's loop, one job at a time through the real scheduler: finished jobs leave, an
    arrival with fewer free nodes than it needs is turned away, the rest are placed and
    tallied from their real bindings."""
    where, leaf = fabric.locations(), leaves_of(fabric)
    tally, busy = Tally(), set[str]()
    running: list[tuple[float, int, Job, dict[str, list[str]]]] = []
    turned_away = left_waiting = seq = 0
    for now, duration, group in schedule:
        while running and running[0][0] <= now:
            _, _, done, placed_by = heapq.heappop(running)
            await finish(arm, done)
            busy -= set(placed_by[arm.name])
        if sum(j.size for j in group) > len(where) - len(busy):
            turned_away += 1
            continue
        for i, job in enumerate(group):
            room = dict(Counter(leaf[n] for n in where if n not in busy))
            placed = await place(arm, job, max(room.values()) >= job.size)
            if placed is None:
                left_waiting += len(group) - i  # a decode waits on its prefill
                break
            busy |= set(placed)
            _count(tally, job, placed, room, where, leaf, running, arm.name)
            seq += 1
            heapq.heappush(running, (now + duration, seq, job, {arm.name: placed}))
    return tally, turned_away, left_waiting


async def one_arm(
    cluster: KubeCluster, kube: AsyncClient, name: str, extender: str,
    run: Callable[[RealArm], Awaitable[T]],
) -> tuple[T, float]:  # fmt: skip
    """A fresh namespace and kube-scheduler for arm `name`, `run` through it, and how long it
    took; the cluster emptied after it."""
    setup = REAL_ARMS[name]
    namespace = await scalerig.create_namespace(kube, f"fabric-{name}")
    url = extender if setup.extender else None
    config = scalerig.scheduler_config(url, SCHEDULER_QPS)
    # a pod tried while its nodes' previous pods were still being deleted retries in 1 s
    config.update(podInitialBackoffSeconds=1, podMaxBackoffSeconds=1)
    if setup.score_all:
        config["percentageOfNodesToScore"] = 100
    if url is not None:  # the extender shares 2 loaded cores: judge its answers, not its speed
        config["extenders"][0]["httpTimeout"] = "30s"
    scheduler = launch_scheduler(cluster, config, [GATES] if setup.gangs else [])
    started = time.monotonic()
    try:
        async with fleet.Bindings(kube, namespace) as seen:
            got = await run(RealArm(name, kube, namespace, seen, url, setup.gangs))
    finally:
        scheduler.stop()
    seconds = time.monotonic() - started
    await kube.deletecollection(PodGroup, namespace=namespace)
    await kube.deletecollection(Workload, namespace=namespace)
    await scalerig.empty(kube, namespace, [extender])
    return got, seconds


async def real_arms(
    cluster: KubeCluster,
    nodes: list[fleet.FleetNode],
    arms: Iterable[str],
    run: Callable[[RealArm], Awaitable[T]],
) -> dict[str, tuple[T, float]]:
    """`nodes` as KWOK nodes, the extender as deployed (its own process, its RBAC), then `run`
    through each arm in turn on the same nodes."""
    config = load_config(cluster.kubeconfig)
    async with AsyncClient(config, timeout=httpx2.Timeout(120.0), trust_env=False) as kube:
        await fleet.create(kube, nodes)
        port = free_port()
        kubeconfig = scalerig.extender_kubeconfig(cluster)
        extender = await asyncio.to_thread(launch_extender, cluster, kubeconfig, port)
        url = f"http://127.0.0.1:{port}"
        try:
            return {name: await one_arm(cluster, kube, name, url, run) for name in arms}
        finally:
            extender.stop()


async def real_job_arms(
    cluster: KubeCluster, schedule: Schedule, fabric: fab.Fabric
) -> dict[str, RealResult]:
    """The whole-node trace through every arm."""

    async def run(arm: RealArm) -> tuple[Tally, int, int]:
        return await run_arm(arm, schedule, fabric)

    got = await real_arms(cluster, kwok_nodes(fabric), REAL_ARMS, run)
    return {name: RealResult(*r, seconds) for name, (r, seconds) in got.items()}


def _control_plane() -> contextlib.AbstractContextManager[KubeCluster]:
    """The gated control plane with KWOK, or exit 2 naming what `make k8s-bins` would build."""
    bin_dir, kwok_bin = build_dir("--bin-dir"), build_dir("--kwok-bin-dir") / "kwok"
    missing = [str(p) for p in (bin_dir / "kube-apiserver", kwok_bin) if not p.is_file()]
    if missing:
        sys.exit(f"error: --real: {', '.join(missing)} missing: run `make k8s-bins` first")
    return cluster_with_kwok(bin_dir, kwok_bin, APISERVER_FLAGS)


def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def real(schedule: Schedule, fabric: fab.Fabric) -> None:
    """The real arms on a gated control plane, beside the model on the same arrivals."""
    load = _load()
    with _control_plane() as cluster:
        results = asyncio.run(real_job_arms(cluster, schedule, fabric))
    model, _, model_turned = run_model(schedule, fabric, 0)
    _report_real(results, model, model_turned, len(schedule), len(fabric.nodes), load)


def _report_real(
    results: dict[str, RealResult],
    model: dict[str, Tally],
    model_turned: int,
    arrivals: int,
    nodes: int,
    load: str,
) -> None:
    print(
        f"\nthe first {arrivals} arrivals through the real kube-scheduler (v1.37.2) on {nodes} "
        f"KWOK nodes, each arm alone in turn; load average {load} at start, {_load()} at the end"
    )
    print(f"{COLUMNS} {'turned away':>12} {'left waiting':>13} {'wall s':>7}")
    for name, t in model.items():
        print(f"{_row(f'model: {name}', t)} {model_turned:>12} {'-':>13} {'-':>7}")
    for name, r in results.items():
        print(
            f"{_row(f'real: {name}', r.tally)} {r.turned_away:>12} {r.left_waiting:>13} "
            f"{r.seconds:>7.0f}"
        )
    for name, setup in REAL_ARMS.items():
        print(f"  real: {name} = {setup.label}")
    print(
        "model = rdmaplane's stand-ins on the same arrivals; real = where the real kube-scheduler "
        "bound the pods (one leaf from those bindings; hops and PD counted on our fabric model); "
        "left waiting = gangs no leaf had room for, judged unschedulable and withdrawn"
    )


# ------------------------------------------- --rails --real: rails from the real bindings

RAIL_ARMS = ("default", "extender")


@dataclass(frozen=True)
class RailEvent:
    """What the real arm did, in order: a job arrived, or one of its pods bound or ended."""

    kind: str  # "arrive", "bind" or "end"
    job: Job
    pod: int = -1  # which of the job's pods (bind, end)
    node: str = ""

    @property
    def body(self) -> dict[str, Any]:
        return pods_of(self.job)[self.pod]


def rail_kwok_nodes(harness: Any, fabric: fab.Fabric) -> list[fleet.FleetNode]:
    """The fabric's nodes as KWOK nodes of the rail-optimised sample, as its kubelet reports
    them and its agent publishes their NRT, empty (rails included): read off an empty
    harness."""
    empty = harness.published(harness.rail_uplinks())
    facts = list(harness.facts.values())
    capacity = {r: str(sum(f.resource == r for f in facts)) for r in harness.resources[:2]}

    def nrt_of(name: str) -> dict[str, Any]:
        obj: dict[str, Any] = nrt.to_object(dataclasses.replace(empty, name=name))
        return obj

    return kwok_nodes(fabric, RAIL_SAMPLE, capacity, nrt_of)


async def run_rail_arm(
    arm: RealArm, arrivals: list[RailArrival], gpus: Mapping[str, int], events: list[RailEvent]
) -> int:
    """`run_rails`'s loop through the real kube-scheduler, one arrival at a time (finished
    jobs' pods deleted first); a job whose pods the free GPUs no longer hold is turned away.
    What happened goes to `events`, pods' binds in kube-scheduler's order; how many were
    turned away."""
    free = dict(gpus)
    running: list[tuple[float, int, Job, list[str]]] = []
    turned_away = 0
    for now, arrival in enumerate(arrivals):
        while running and running[0][0] <= now:
            _, _, done, placed = heapq.heappop(running)
            await finish(arm, done)
            for i, n in enumerate(placed):
                free[n] += done.gpus
                events.append(RailEvent("end", done, i, n))
        job = dataclasses.replace(rail_job(arrival), namespace=arm.namespace)
        events.append(RailEvent("arrive", job))
        if sum(f // job.gpus for f in free.values()) < job.size:  # pods alike: any order fits
            turned_away += 1
            continue
        placed = await place(arm, job, True) or []  # None only for a gang
        for n in placed:
            free[n] -= job.gpus
        bound = [arm.seen.bound[f"{job.name}-{i}"] for i in range(job.size)]
        for i in sorted(range(job.size), key=lambda i: bound[i].order):
            events.append(RailEvent("bind", job, i, bound[i].node))
        heapq.heappush(running, (now + arrival[3], now, job, placed))
    return turned_away


Step = tuple[bool, Mapping[str, Any]]  # a pod bound (True) or ended (False) on a node


class ReplayedKubelet:
    """One kubelet harness standing in for many nodes' kubelets, one node at a time: it holds
    the state the node's steps left (the kubelet's own allocations), and what its agent would
    publish from them."""

    def __init__(self, harness: Any) -> None:
        self.harness = harness
        self.node = ""
        self.done = 0  # how many of the node's steps the harness holds
        self.uids: dict[str, str] = {}  # pod key -> its uid in the harness
        self.empty("")

    def empty(self, node: str) -> None:
        """Hold `node`, with no pod on it."""
        self.harness.reset()
        self.node, self.done, self.uids = node, 0, {}

    def step(self, step: Step) -> frozenset[int] | None:
        """Admit or end one pod; the rails of the NICs an admitted pod got."""
        bind, body = step
        key = pod_key(body)
        self.done += 1
        if not bind:
            if key in self.uids:
                self.harness.delete(self.uids.pop(key))
            return None
        admission = self.harness.admit(body)
        if not admission.admitted:
            return None
        self.uids[key] = admission.uid
        rails: frozenset[int] = self.harness.rails(admission)
        return rails

    def hold(self, node: str, steps: Sequence[Step]) -> None:
        """The state `steps` (the node's, from empty) leave: only the new ones when the
        harness already holds the node's earlier ones."""
        if node != self.node or self.done > len(steps):
            self.empty(node)
        for s in steps[self.done :]:
            self.step(s)

    def allocated(self) -> dict[str, dict[str, frozenset[str]]]:
        """Each pod held: its devices per resource."""
        h = self.harness
        return {
            key: {r: h.admissions[uid].devices(r) for r in h.resources}
            for key, uid in self.uids.items()
        }

    def compact(self, node: str, steps: Sequence[Step]) -> list[Step]:
        """Steps as short as can be that leave the node's allocations as `steps` did: its live
        pods alone, ordered by their devices, when the kubelet then gives each the devices it
        has (checked); else `steps`, replayed again."""
        self.hold(node, steps)
        had = self.allocated()
        bodies = {pod_key(b): b for bind, b in steps if bind}
        by_devices = sorted(had, key=lambda k: sorted(d for ds in had[k].values() for d in ds))
        live: list[Step] = [(True, bodies[k]) for k in by_devices]
        self.empty(node)
        for s in live:
            self.step(s)
        if self.allocated() == had:
            return live
        self.empty(node)
        self.hold(node, steps)
        return list(steps)

    def nrt(self) -> dict[str, Any]:
        """The NRT the node's agent would publish now."""
        h = self.harness
        obj: dict[str, Any] = nrt.to_object(
            dataclasses.replace(h.published(h.rail_uplinks()), name=self.node)
        )
        return obj


def kubelet_replay(
    harness: Any, events: list[RailEvent]
) -> tuple[dict[str, frozenset[int]], dict[int, dict[str, Any]]]:
    """Each node's binds and ends, in order, through one kubelet harness (emptied between
    nodes): the rails of the NICs the kubelet gave each pod it admitted, and the NRT the agent
    would publish after each event."""
    by_node: dict[str, list[int]] = {}
    for i, e in enumerate(events):
        if e.node:
            by_node.setdefault(e.node, []).append(i)
    kubelet = ReplayedKubelet(harness)
    rails: dict[str, frozenset[int]] = {}
    published: dict[int, dict[str, Any]] = {}
    for node, indices in by_node.items():
        kubelet.empty(node)
        for i in indices:
            body = events[i].body
            got = kubelet.step((events[i].kind == "bind", body))
            if got is not None:
                rails[pod_key(body)] = got
            published[i] = kubelet.nrt()
    kubelet.empty("")
    return rails, published


Published = list[tuple[int, dict[str, Any]]]  # (how many events had happened, the NRT)


class LiveAgents:
    """The node agents KWOK does not run: from a watch of the arm's pods, each node's binds and
    ends replayed through the kubelet harness, and the NRT its agent would publish then written
    to the API server, after the watch shows the change (as an agent does after PodResources
    changes); a node that changed again meanwhile is published once, with all of it, and an
    NRT that frees devices stamps the Node (`FREED_ANNOTATION`), as the agent's does. On
    leaving, the agents catch up with `events`, and every node they wrote gets its empty NRT
    back (the next arm starts as this one did)."""

    def __init__(
        self, arm: RealArm, kubelet: ReplayedKubelet, nodes: list[fleet.FleetNode],
        events: Sequence[RailEvent],
    ) -> None:  # fmt: skip
        self.kube, self.namespace = arm.kube, arm.namespace
        self.kubelet, self.events = kubelet, events
        self.empty = {n.name: n.nrt for n in nodes}
        self.steps: dict[str, list[Step]] = {}  # per node, as short as leaves it as it is
        self.seen = 0  # steps the watch delivered
        self.dirty: dict[str, None] = {}  # nodes to publish, in the order they changed
        self.busy = False
        self.changed, self.progress = asyncio.Event(), asyncio.Event()
        self.published: Published = []
        self.written: set[str] = set()
        self.last: dict[str, Mapping[str, Any]] = {}  # per node, the NRT last written
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> LiveAgents:
        self._tasks = [asyncio.create_task(self._watch()), asyncio.create_task(self._publish())]
        return self

    async def __aexit__(self, *_: object) -> None:
        try:
            async with asyncio.timeout(PLACED_WITHIN_S):
                while not self._caught_up():
                    self.progress.clear()
                    waiter = asyncio.ensure_future(self.progress.wait())
                    # a task that failed sets no progress: wake for it too (`_caught_up` raises)
                    await asyncio.wait([waiter, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
        except TimeoutError:
            happened = sum(bool(e.node) for e in self.events)
            raise RuntimeError(
                f"the stand-in agents did not catch up in {PLACED_WITHIN_S:.0f} s: the watch "
                f"saw {self.seen} of {happened} binds and ends, {len(self.dirty)} nodes unwritten"
            ) from None
        finally:
            for t in self._tasks:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        await fleet.bounded(
            fleet.CREATE_PARALLEL,
            (functools.partial(self._write, n, self.empty[n]) for n in self.written),
        )

    def _caught_up(self) -> bool:
        if any(t.done() for t in self._tasks):  # one failed: say why
            next(t for t in self._tasks if t.done()).result()
        happened = sum(bool(e.node) for e in self.events)
        return self.seen >= happened and not self.dirty and not self.busy

    async def _watch(self) -> None:
        where: dict[str, str] = {}  # pod key -> its node
        async for kind, pod in self.kube.watch(Pod, namespace=self.namespace):
            body = pod.to_dict()
            key, node = pod_key(body), (pod.spec.nodeName if pod.spec else None) or ""
            if kind == "DELETED" and key not in where and node:  # bound and gone unseen
                self._changed(node, (True, body))
                self._changed(node, (False, body))
            elif kind == "DELETED" and key in where:
                self._changed(where.pop(key), (False, body))
            elif kind != "DELETED" and node and key not in where:
                where[key] = node
                self._changed(node, (True, body))

    def _changed(self, node: str, step: Step) -> None:
        self.steps.setdefault(node, []).append(step)
        self.seen += 1
        self.dirty[node] = None
        self.changed.set()
        self.progress.set()

    async def _publish(self) -> None:
        while True:
            await self.changed.wait()
            self.changed.clear()
            while self.dirty:
                node = next(iter(self.dirty))
                del self.dirty[node]
                self.busy = True
                steps = list(self.steps[node])
                obj, shorter = await asyncio.to_thread(self._nrt_after, node, steps)
                self.steps[node][: len(steps)] = shorter  # any that came meanwhile stay after
                await self._write(node, obj)
                self.published.append((len(self.events), obj))
                self.busy = False
                self.progress.set()

    def _nrt_after(self, node: str, steps: list[Step]) -> tuple[dict[str, Any], list[Step]]:
        """The node's NRT after `steps`, and steps as short as can be that leave it so."""
        if steps[-1][0]:
            self.kubelet.hold(node, steps)
        else:  # a pod ended: the node's history may shrink
            steps = self.kubelet.compact(node, steps)
        return self.kubelet.nrt(), steps

    async def _write(self, node: str, obj: Mapping[str, Any]) -> None:
        """Write the node's NRT; when it frees devices, stamp the Node as the agent does (so
        kube-scheduler looks again at the pods the extender refused meanwhile)."""
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        await self.kube.patch(NodeResourceTopology, node, body, patch_type=PatchType.MERGE)
        before = self.last.get(node, self.empty[node])
        self.last[node] = obj
        self.written.add(node)
        if nrt.frees(nrt.from_object(before), nrt.from_object(obj)):
            stamp = {FREED_ANNOTATION: f"{time.time():.6f}"}
            await self.kube.patch(
                Node, node, {"metadata": {"annotations": stamp}}, patch_type=PatchType.MERGE
            )


def judge_rails(
    harness: Any, nodes: list[fleet.FleetNode], events: list[RailEvent], published: Published
) -> tuple[RailTally, int]:
    """`run_rails`'s tally for a real arm's events: rails from the kubelet's replay, each job's
    `matchable` and each pod's predicted rails from an extender cache fed the NRTs the agent
    would have published as they happened; and the prediction of one fed as the real one was
    (`published`, the NRTs the live agents wrote, when they did, and the bound pods, each not
    yet in its node's NRT placed where the extender predicts the kubelet puts it). With the
    number of nodes whose last NRT written is not the kubelet replay's last."""
    rails, replayed = kubelet_replay(harness, events)
    labels = {n.name: n.labels for n in nodes}
    cache, seen = rail_cache(labels), rail_cache(labels)
    for c in (cache, seen):
        c.replace("nrt", [n.nrt for n in nodes])
    names = sorted(labels)
    tally = RailTally()
    arrived: list[tuple[Job, bool]] = []
    placed: dict[str, list[tuple[str, frozenset[int]]]] = {}
    written = iter(published)
    pending = next(written, None)
    for i, e in enumerate(events):
        while pending is not None and pending[0] <= i:
            seen.apply("nrt", "MODIFIED", pending[1])
            pending = next(written, None)
        if e.kind == "arrive":
            arrived.append((e.job, matchable(cache, names, pods_of(e.job)[0], e.job.size)))
            continue
        body = e.body
        key = pod_key(body)
        if e.kind == "bind" and key in rails:
            request = podrequest.pod_request(body)
            tally.pods += 1
            tally.predicted += cache.rails_at(e.node, cache.verdict(e.node, request)) == rails[key]
            predicted_seen = seen.rails_at(e.node, seen.verdict(e.node, request))
            tally.predicted_seen += predicted_seen == rails[key]
            placed.setdefault(e.job.name, []).append((e.node, rails[key]))
        if e.kind == "bind":  # one second per arrival: the order the extender sorts pods in
            at = f"{datetime.fromtimestamp(len(arrived), UTC):%Y-%m-%dT%H:%M:%SZ}"
            meta = {**body["metadata"], "creationTimestamp": at}
            spec = {**body["spec"], "nodeName": e.node}
            seen.apply("pod", "MODIFIED", {**body, "metadata": meta, "spec": spec})
        else:
            seen.apply("pod", "DELETED", body)
        cache.apply("nrt", "MODIFIED", replayed[i])
    for job, allowed in arrived:
        got = placed.get(job.name, [])
        tally.unplaced += job.size - len(got)
        tally_pairs(tally, got, allowed)
    replayed_last = {events[i].node: obj for i, obj in sorted(replayed.items())}
    written_last = {obj["metadata"]["name"]: obj for _, obj in published}
    return tally, sum(written_last.get(n) != obj for n, obj in replayed_last.items())


@dataclass
class RealRails:
    tally: RailTally  # from the real bindings, replayed through the kubelet harness
    turned_away: int
    seconds: float
    writes: int  # NRTs the live agents wrote
    behind: int  # nodes whose last NRT the live agents wrote is not the kubelet replay's last


def rails_of_real_arms(
    cluster: KubeCluster, harness: Any, fabric: fab.Fabric, arrivals: list[RailArrival]
) -> dict[str, RealRails]:
    """The rails trace through kube-scheduler alone and with the extender on the fabric's
    nodes as KWOK nodes of the rail-optimised sample, their NRTs kept by `LiveAgents`; then
    each arm's bindings replayed through `harness` (empty) for the NICs, so the rails, the
    kubelet would give."""
    nodes = rail_kwok_nodes(harness, fabric)
    gpus = {n.name: int(n.capacity[nrt.GPU]) for n in nodes}

    async def run(arm: RealArm) -> tuple[int, list[RailEvent], Published]:
        events: list[RailEvent] = []
        async with LiveAgents(arm, ReplayedKubelet(harness), nodes, events) as agents:
            turned_away = await run_rail_arm(arm, arrivals, gpus, events)
        return turned_away, events, agents.published

    got = asyncio.run(real_arms(cluster, nodes, RAIL_ARMS, run))
    out = {}
    for name, ((turned_away, events, published), seconds) in got.items():
        tally, behind = judge_rails(harness, nodes, events, published)
        out[name] = RealRails(tally, turned_away, seconds, len(published), behind)
    return out


def real_rails(count: int, seed: int) -> None:
    """`--rails --real N`: N arrivals of the rails trace on the 256-node fabric through the
    real kube-scheduler, every pod's NICs from the kubelet harness."""
    from tests.kubelet.harness import sample_node

    fabric = build_fabric()
    arrivals = rail_trace(count, random.Random(seed), len(fabric.nodes))
    load = _load()
    with (
        sample_node(RAIL_SAMPLE) as sample,
        rail_cluster(sample, {"replay": {}}) as one,
        _control_plane() as cluster,
    ):
        real = rails_of_real_arms(cluster, one.nodes["replay"], fabric, arrivals)
    print(
        f"rails at size: {len(fabric.nodes)} {RAIL_SAMPLE} KWOK nodes under {LEAVES} leaves, "
        f"one rail group; {count} jobs of {'/'.join(map(str, RAIL_PODS))} pods x "
        f"{'/'.join(str(s) for s, _ in RAIL_SIZES)} GPUs+NICs (seed {seed}); load average "
        f"{load} at start, {_load()} at the end"
    )
    print(
        f"{RAIL_COLUMNS} {'on KWOK':>8} {'NRT writes':>11} {'behind':>7} {'turned away':>12} "
        f"{'wall s':>7}"
    )
    for name, r in real.items():
        t = r.tally
        print(
            f"{_rail_row(f'real: {name}', t)} {100 * t.predicted_seen / max(1, t.pods):>7.1f}% "
            f"{r.writes:>11} {r.behind:>7} {r.turned_away:>12} {r.seconds:>7.0f}"
        )
    for name in RAIL_ARMS:
        print(f"  real: {name} = {REAL_ARMS[name].label}")
    print(RAIL_LEGEND)
    print(
        "real = where the real kube-scheduler bound the pods, each node's NRT kept by the bench "
        "as its agent would (its pods replayed through the kubelet harness after the watch saw "
        "them bound or gone, the agent's NRT written), each node's pods then replayed again in "
        "binding order for the rails; unplaced = pods of jobs turned away (the free GPUs could "
        "not hold them); predicted = an extender cache fed the NRTs the agent would have "
        "published after each step; on KWOK = one fed as the real extender was (the NRTs as "
        "written, when they were, the bound pods not yet in them placed in creation order); "
        "NRT writes = NRTs the bench's agents wrote; behind = nodes whose last NRT written is "
        "not the replay's last"
    )


if __name__ == "__main__":
    main()
