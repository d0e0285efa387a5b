"""Matching rails across a job's pods: default vs rdmaplane, judged by the kubelet's allocation.

A job trace of 2-4 pods of 2 or 4 GPUs (+ as many NICs) on 16 rail-optimised sample nodes, each
pod admitted by its node's real kubelet admission (the harness, tests/kubelet); the share of a
job's cross-node pod pairs whose rails match, from the NICs the kubelet allocated, default
(least-allocated) vs rdmaplane; and the same share over the jobs the cluster let match as they
arrived (one node took all their pods, or as many nodes as pods offered one rail set): on a
busy cluster some jobs can match on no rails at all.

The same trace at size through the real kube-scheduler on KWOK: bench/fabric_rails_real.py.
The machinery shared with the other fabric benches is in bench/fabriclib/.

    python bench/fabric_rails.py [--jobs 1500] [--seed 11]
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/kubelet

from fabriclib.rails import RailCluster, RailTally, rail_cluster, tally_pairs
from fabriclib.report import RAIL_COLUMNS, RAIL_LEGEND, rail_row
from fabriclib.trace import (
    RAIL_NODES,
    RAIL_PODS,
    RAIL_SAMPLE,
    RAIL_SIZES,
    RailArrival,
    pods_of,
    rail_job,
    rail_trace,
)


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


def main() -> None:
    """Default vs rdmaplane on matching rails, every pod admitted by a real kubelet."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    from tests.kubelet.harness import sample_node

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
            print(rail_row(name, t))
    print(RAIL_LEGEND)


if __name__ == "__main__":
    main()
