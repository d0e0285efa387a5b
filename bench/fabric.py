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

Figures, all computed by rdmaplane's own fabric model (`rdmaplane.fabric.hops`) from where the
pods landed, not measured on a network:
- one leaf: share of jobs entirely under one leaf, of those that could fit under one leaf when
  they arrived (some leaf had enough free nodes);
- hops: mean over jobs of the mean switch hops between two of its ranks (1 under a leaf, 3
  through a spine, 5 through the core); *saved* = 5 − that, the hops saved against a job spread
  over the whole fabric;
- PD: share of decode pods under a leaf that holds one of their prefill's pods.

    python bench/fabric.py [--jobs 1500] [--seed 11]

`--rails`: a job trace of 2-4 pods of 2 or 4 GPUs (+ as many NICs) on 16 rail-optimised sample
nodes, each pod admitted by its node's real kubelet admission (the harness, tests/kubelet); the
share of a job's cross-node pod pairs whose rails match, from the NICs the kubelet allocated,
default (least-allocated) vs rdmaplane.

    python bench/fabric.py --rails [--jobs 300] [--seed 11]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/layouts.py

from rdmaplane import fabric as fab
from rdmaplane import nrt
from rdmaplane.scheduler import placement as pl
from rdmaplane.scheduler import rails as rl
from rdmaplane.scheduler.cache import ClusterCache
from rdmaplane.scheduler.settings import FabricScoring
from tests.layouts import layout

LEAVES, PER_LEAF, LEAVES_PER_SPINE = 16, 16, 4
SIZES = ((2, 0.35), (4, 0.3), (8, 0.25), (16, 0.1))
PD_SHARE = 0.2
TARGET_UTILISATION = 0.7
TOP_HOPS = 5.0
JOB = "batch.kubernetes.io/job-name"


def build_fabric() -> fab.Fabric:
    spines = LEAVES // LEAVES_PER_SPINE
    switches = [fab.Switch("core", 2)]
    switches += [fab.Switch(f"spine-{s}", 1, "core") for s in range(spines)]
    switches += [
        fab.Switch(f"leaf-{i:02d}", 0, f"spine-{i // LEAVES_PER_SPINE}") for i in range(LEAVES)
    ]
    nodes = [f"gpu-{k:03d}" for k in range(LEAVES * PER_LEAF)]
    links = [fab.Link(n, f"leaf-{k // PER_LEAF:02d}") for k, n in enumerate(nodes)]
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


def pods_of(job: Job) -> list[dict[str, Any]]:
    limits = {nrt.GPU: "8", nrt.HCA: "8"}
    return [
        {
            "metadata": {"name": f"{job.name}-{i}", "namespace": "bench", "labels": job.labels},
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
            request = pl.pod_request(p)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--rails", action="store_true", help="matching rails, judged by the kubelet harness"
    )
    args = parser.parse_args()
    if args.rails:
        rails_main(args)
        return
    fabric = build_fabric()
    where = fabric.locations()
    leaf = {n: loc.tiers[0] for n, loc in where.items()}
    rng = random.Random(args.seed)
    arrivals = trace(args.jobs, rng)
    mean_size = sum(s * w for s, w in SIZES)
    gap = mean_size / (len(fabric.nodes) * TARGET_UTILISATION)  # mean duration 1.0
    schedulers = [Scheduler(n, fabric, args.seed) for n in ("default", "rdmaplane")]
    tallies = {s.name: Tally() for s in schedulers}
    running: list[tuple[float, int, Job, dict[str, list[str]]]] = []
    free = len(fabric.nodes)
    now, turned_away, seq = 0.0, 0, 0
    for group in arrivals:
        now += rng.expovariate(1 / gap)
        while running and running[0][0] <= now:
            _, _, job, placed = heapq.heappop(running)
            free += job.size
            for s in schedulers:
                s.finish(job)
        if sum(j.size for j in group) > free:
            turned_away += 1
            continue
        duration = rng.expovariate(1.0)
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
    _report(tallies, schedulers, args, turned_away, len(arrivals))


def _free_per_leaf(cache: ClusterCache, leaf: dict[str, str]) -> dict[str, int]:
    request = pl.PodRequest.of({nrt.GPU: 8, nrt.HCA: 8})
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
    print(
        f"{'scheduler':<10} {'jobs':>5} {'one leaf':>9} {'mean hops':>10} {'saved':>6} "
        f"{'PD near':>8} {'ms/pod':>7}"
    )
    saved = {}
    for s in schedulers:
        t = tallies[s.name]
        hops = t.hops / t.jobs
        saved[s.name] = TOP_HOPS - hops
        print(
            f"{s.name:<10} {t.jobs:>5} {100 * t.one_leaf / max(1, t.fit_possible):>8.1f}% "
            f"{hops:>10.2f} {saved[s.name]:>6.2f} "
            f"{100 * t.decode_near / max(1, t.decode_pods):>7.1f}% "
            f"{1000 * s.seconds / max(1, s.pods):>7.2f}"
        )
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
    unplaced: int = 0


class RailCluster:
    """Kubelet harnesses (one per node) and an extender cache fed their published NRTs."""

    def __init__(self, backend: Any, sample: Any, weights: FabricScoring, prefix: str) -> None:
        from tests.kubelet.harness import KubeletHarness

        self.weights = weights
        self.nodes = {
            f"{prefix}{i:02d}": KubeletHarness(
                sample, "best-effort", "container", name=f"{prefix}{i:02d}", backend=backend
            ).start()
            for i in range(RAIL_NODES)
        }
        self.names = sorted(self.nodes)
        self.cache = ClusterCache()
        self.cache.replace("node", [{"metadata": {"name": n}} for n in self.names])
        self.cache.replace("nrt", [self._nrt(n) for n in self.names])
        self.cache.replace("pod", [])

    def _nrt(self, name: str) -> dict[str, Any]:
        h = self.nodes[name]
        return nrt.to_object(h.published(h.rail_uplinks()))

    def choose(self, pod: dict[str, Any], rng: random.Random, rdmaplane: bool) -> str | None:
        request = pl.pod_request(pod)
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

    def _free_gpus(self, name: str) -> int:
        entry = self.cache.entry(name)
        return sum(z.free[nrt.GPU] for z in entry.state.zones) if entry else 0

    def bind(self, pod: dict[str, Any], name: str) -> tuple[str, frozenset[int], bool] | None:
        """Bind the pod, let the node's kubelet admit it; (uid, its real rails, predicted?)."""
        request = pl.pod_request(pod)
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


def rail_pod(job: str, i: int, gpus: int) -> dict[str, Any]:
    limits = {nrt.GPU: str(gpus), nrt.HCA: str(gpus)}
    return {
        "metadata": {"name": f"{job}-{i}", "namespace": "bench", "labels": {JOB: job}},
        "spec": {
            "containers": [{"name": "m", "resources": {"limits": limits, "requests": limits}}]
        },
        "status": {"phase": "Pending"},
    }


def rail_trace(count: int, rng: random.Random) -> list[tuple[str, int, int, float]]:
    """(job, pods, GPUs per pod, lifetime in arrivals) per arrival."""
    return [
        (
            f"j{k}",
            rng.choice(RAIL_PODS),
            rng.choices([s for s, _ in RAIL_SIZES], [w for _, w in RAIL_SIZES])[0],
            rng.expovariate(1 / 12),
        )
        for k in range(count)
    ]


def run_rails(
    cluster: RailCluster, arrivals: list[tuple[str, int, int, float]], seed: int, rdmaplane: bool
) -> RailTally:
    rng, tally = random.Random(seed), RailTally()
    running: list[tuple[float, int, list[tuple[dict[str, Any], str, str]]]] = []
    for now, (job, count, gpus, life) in enumerate(arrivals):
        while running and running[0][0] <= now:
            for pod, name, uid in heapq.heappop(running)[2]:
                cluster.end(pod, name, uid)
        pods = [rail_pod(job, i, gpus) for i in range(count)]
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
        for (na, ra), (nb, rb) in itertools.combinations(rails, 2):
            if na != nb:
                tally.pairs += 1
                tally.matched += rl.rails_match(ra, rb)
        heapq.heappush(running, (now + life, now, held))
    for _, _, held in running:
        for pod, name, uid in held:
            cluster.end(pod, name, uid)
    return tally


def rails_main(args: argparse.Namespace) -> None:
    """Default vs rdmaplane on matching rails, every pod admitted by a real kubelet."""
    from tests.kubelet.harness import Backend, HarnessMissing, sample_node

    arrivals = rail_trace(args.jobs, random.Random(args.seed))
    try:
        backend = Backend.start()
    except HarnessMissing as exc:
        sys.exit(
            f"error: the kubelet harness is not built ({exc}); "
            "run scripts/build-k8s.sh kubelet-harness"
        )
    print(
        f"rails: {RAIL_NODES} {RAIL_SAMPLE} nodes (8 GPUs, NIC k on rail k), one rail group; "
        f"{len(arrivals)} jobs of {'/'.join(map(str, RAIL_PODS))} pods x "
        f"{'/'.join(str(s) for s, _ in RAIL_SIZES)} GPUs+NICs (seed {args.seed}); "
        "rails from the NICs each pod's kubelet allocated"
    )
    print(
        f"{'scheduler':<10} {'pods':>5} {'unplaced':>9} {'pairs':>6} {'rails match':>12} "
        f"{'predicted':>10}"
    )
    try:
        with sample_node(RAIL_SAMPLE) as sample:
            for name in ("default", "rdmaplane"):
                cluster = RailCluster(backend, sample, FabricScoring(), name)
                t = run_rails(cluster, arrivals, args.seed, name == "rdmaplane")
                print(
                    f"{name:<10} {t.pods:>5} {t.unplaced:>9} {t.pairs:>6} "
                    f"{100 * t.matched / max(1, t.pairs):>11.1f}% "
                    f"{100 * t.predicted / max(1, t.pods):>9.1f}%"
                )
    finally:
        backend.close()
    print(
        "rails match = share of a job's pod pairs on different nodes whose NICs' rails match "
        "(one's among the other's), by the kubelet's own allocation; predicted = share of pods "
        "whose rails the extender predicted as the kubelet gave them"
    )


if __name__ == "__main__":
    main()
