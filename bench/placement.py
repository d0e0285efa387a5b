"""Placement quality: spread vs. NUMA-only vs. rdmaplane on a fragmented GPU cluster.

A 256-node cluster built from the bundled sample nodes (HGX H100 RoCE and HGX H200 IB, one GPU
and one 400G NIC per PCIe root on 2 NUMA nodes; DGX A100 with 8 NUMA nodes and two GPUs + two
NICs per switch; a PCIe L40S server with NICs next to only two of its GPUs, all on socket 0)
plus a synthetic PCIe server whose NICs sit on their own root complexes (see
`rdmaplane.scheduler.layouts`), with a mix of
Topology Manager policies is pre-fragmented with random running pods, then a trace of
1/2/4/8-GPU jobs (one exclusive NIC per GPU) arrives while jobs finish. Every policy sees the
same trace; the kubelet is modelled the same way for all (`rdmaplane.scheduler.placement`: Topology
Manager admission, then the best achievable GPU-NIC pairing inside the NUMA zones it picks), so
the differences come from the scheduler's choice of node alone.

- spread: default scheduler, node totals only, least-allocated GPUs wins;
- numa-only: like the upstream NodeResourceTopologyMatch plugin: single-numa-node nodes filtered
  per NUMA zone, least-allocated NUMA zone wins;
- rdmaplane: this extender's filter and score.

A job is *feasible* when, at its arrival, some node can take it NUMA-aligned (every GPU with a
NIC on its NUMA zone, on the fewest zones possible). Shares are of feasible jobs.

    python bench/placement.py [--nodes 256] [--jobs 3000] [--seed 7]
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from rdmaplane.scheduler import placement as pl
from rdmaplane.scheduler.layouts import layout

T = TypeVar("T")
SIZES = ((1, 0.4), (2, 0.3), (4, 0.2), (8, 0.1))
LAYOUT_MIX = (
    ("hgx-h100-roce", 0.3),
    ("hgx-h200-ib", 0.2),
    ("dgx-a100", 0.2),
    ("pcie-l40s-split", 0.15),
    ("split-roots", 0.15),
)
POLICY_MIX = (("single-numa-node", 0.4), ("restricted", 0.4), ("best-effort", 0.2))
TARGET_UTILISATION = 0.75
PREFILL_UTILISATION = 0.6
GPU_ONLY_SHARE = 0.5
ALIGNED = ("pcie", "numa")


def _pick(rng: random.Random, mix: Sequence[tuple[T, float]]) -> T:
    return rng.choices([k for k, _ in mix], [w for _, w in mix])[0]


def _job(gpus: int, nics: bool = True) -> pl.PodRequest:
    unit = (gpus, gpus if nics else 0, 0)
    return pl.PodRequest((unit,), (), unit)


@dataclass
class Cluster:
    """One scheduler's copy of the cluster, with decisions memoised per node state."""

    states: list[pl.NodeState]
    memo: dict[tuple[pl.NodeState, pl.PodRequest], pl.Verdict] = field(default_factory=dict)

    def verdict(self, i: int, request: pl.PodRequest) -> pl.Verdict:
        key = (self.states[i], request)
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = pl.evaluate(self.states[i], request)
        return found

    def gpus(self, i: int) -> tuple[int, int]:
        zones = self.states[i].zones
        return sum(z.free[0] for z in zones), sum(z.capacity[0] for z in zones)


def _totals_fit(state: pl.NodeState, request: pl.PodRequest) -> bool:
    return all(sum(z.free[r] for z in state.zones) >= request.total[r] for r in range(3))


def choose(name: str, c: Cluster, request: pl.PodRequest, rng: random.Random) -> int | None:
    """The node a scheduler picks (ties broken at random, as kube-scheduler does)."""
    best: list[int] = []
    best_score = -1.0
    for i, state in enumerate(c.states):
        if name == "rdmaplane":
            v = c.verdict(i, request)
            if not v.fits:
                continue
            score = float(v.score)
        elif not _totals_fit(state, request):
            continue
        elif name == "spread":
            free, cap = c.gpus(i)
            score = round(10 * (free - request.total[0]) / cap)
        else:  # numa-only
            if state.policy == "single-numa-node" and not c.verdict(i, request).fits:
                continue
            score = max(
                (
                    round(10 * (z.free[0] - request.total[0]) / z.capacity[0])
                    for z in state.zones
                    if z.capacity[0] and z.free[0] >= request.total[0]
                ),
                default=0,
            )
        if score > best_score:
            best, best_score = [i], score
        elif score == best_score:
            best.append(i)
    return rng.choice(best) if best else None


@dataclass
class Tally:
    arrived: int = 0
    feasible: int = 0
    numa_aligned: int = 0
    pcie_aligned: int = 0
    misaligned: int = 0
    kubelet_rejected: int = 0
    unplaced: int = 0
    by_size: dict[int, list[int]] = field(default_factory=lambda: {g: [0, 0, 0] for g, _ in SIZES})
    placed_by_size: dict[int, int] = field(default_factory=lambda: {g: 0 for g, _ in SIZES})


def build_cluster(n: int, rng: random.Random) -> list[pl.NodeState]:
    return [
        pl.node_state(layout(_pick(rng, LAYOUT_MIX), f"n{i:03d}", policy=_pick(rng, POLICY_MIX)))
        for i in range(n)
    ]


def prefill(
    states: list[pl.NodeState], rng: random.Random, mean_life: float
) -> list[tuple[float, int, pl.UnitPlacement]]:
    """Random running pods on random nodes up to the prefill utilisation: the fragmentation.
    Half of them are GPU-only (inference), which leaves NICs without their GPU partner."""
    running: list[tuple[float, int, pl.UnitPlacement]] = []
    capacity = sum(z.capacity[0] for s in states for z in s.zones)
    used = 0
    while used < PREFILL_UTILISATION * capacity:
        i = rng.randrange(len(states))
        gpus = _pick(rng, SIZES[:3])
        placed = pl.place_pod(states[i], _job(gpus, nics=rng.random() >= GPU_ONLY_SHARE))
        if isinstance(placed, pl.Rejection):
            continue
        states[i] = placed[1]
        used += gpus
        running += [(rng.expovariate(1 / mean_life), i, p) for p in placed[0]]
    return running


def eight_gpu_jobs_that_fit(c: Cluster) -> int:
    request, count = _job(8), 0
    while True:
        fits = [
            i
            for i in range(len(c.states))
            if c.verdict(i, request).fits and c.verdict(i, request).alignment in ALIGNED
        ]
        if not fits:
            return count
        placed = pl.place_pod(c.states[fits[0]], request)
        assert not isinstance(placed, pl.Rejection)
        c.states[fits[0]] = placed[1]
        count += 1


def run(
    name: str,
    base: list[pl.NodeState],
    running0: list[tuple[float, int, pl.UnitPlacement]],
    trace: list[tuple[int, float]],
    seed: int,
) -> tuple[Tally, int, int]:
    rng = random.Random(seed)
    c = Cluster(list(base))
    running = list(running0)
    heapq.heapify(running)
    tally = Tally()
    for now, (gpus, life) in enumerate(trace):
        while running and running[0][0] <= now:
            _, i, p = heapq.heappop(running)
            c.states[i] = pl.release(c.states[i], p)
        request = _job(gpus)
        tally.arrived += 1
        feasible = any(
            c.verdict(i, request).fits and c.verdict(i, request).alignment in ALIGNED
            for i in range(len(c.states))
        )
        tally.feasible += feasible
        i = choose(name, c, request, rng)
        if i is None:
            tally.unplaced += 1
            continue
        placed = pl.place_pod(c.states[i], request)
        if isinstance(placed, pl.Rejection):
            tally.kubelet_rejected += 1
            continue
        c.states[i] = placed[1]
        tally.placed_by_size[gpus] += 1
        for p in placed[0]:
            heapq.heappush(running, (now + life, i, p))
        level = pl.alignment_level(placed[0])
        if feasible:
            tally.numa_aligned += level in ALIGNED
            tally.pcie_aligned += level == "pcie"
            tally.misaligned += level not in ALIGNED
            tally.by_size[gpus][0] += 1
            tally.by_size[gpus][1] += level in ALIGNED
            tally.by_size[gpus][2] += level == "pcie"
    free = sum(c.gpus(i)[0] for i in range(len(c.states)))
    return tally, free, eight_gpu_jobs_that_fit(c)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    base = build_cluster(args.nodes, rng)
    capacity = sum(z.capacity[0] for s in base for z in s.zones)
    mean_gpus = sum(g * w for g, w in SIZES)
    mean_life = TARGET_UTILISATION * capacity / mean_gpus  # Little's law: one arrival per tick
    running = prefill(base, rng, mean_life)
    trace = [(_pick(rng, SIZES), rng.expovariate(1 / mean_life)) for _ in range(args.jobs)]
    print(
        f"cluster: {args.nodes} nodes, {capacity} GPUs; layouts {dict(LAYOUT_MIX)}, "
        f"policies {dict(POLICY_MIX)}"
    )
    print(
        f"prefilled to {PREFILL_UTILISATION:.0%} GPUs with {len(running)} pods; "
        f"trace: {args.jobs} jobs "
        f"(1/2/4/8 GPUs, one NIC per GPU), target load {TARGET_UTILISATION:.0%}, seed {args.seed}"
    )
    print(
        f"{'policy':<10} {'placed':>6} {'feasible':>8} {'NUMA-aligned':>13} {'PCIe-aligned':>13} "
        f"{'kubelet-rejected':>16} {'unplaced':>8} {'free GPUs':>9} {'8-GPU jobs fit':>14}  "
        "placed 1/2/4/8-GPU jobs  by size (NUMA/PCIe % of feasible)"
    )
    for name in ("spread", "numa-only", "rdmaplane"):
        start = time.perf_counter()
        tally, free, eights = run(name, base, running, trace, args.seed)
        placed = tally.arrived - tally.kubelet_rejected - tally.unplaced
        f = max(tally.feasible, 1)
        sizes = " ".join(
            f"{g}:{100 * n / max(t, 1):.0f}/{100 * p / max(t, 1):.0f}"
            for g, (t, n, p) in tally.by_size.items()
        )
        print(
            f"{name:<10} {placed:>6} {tally.feasible:>8} {100 * tally.numa_aligned / f:>12.1f}% "
            f"{100 * tally.pcie_aligned / f:>12.1f}% "
            f"{tally.kubelet_rejected:>16} {tally.unplaced:>8} "
            f"{free:>9} {eights:>14}  {'/'.join(map(str, tally.placed_by_size.values())):>23}  "
            f"{sizes}  ({time.perf_counter() - start:.1f}s)"
        )


if __name__ == "__main__":
    main()
