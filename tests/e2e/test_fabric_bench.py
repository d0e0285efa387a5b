"""`bench/fabric.py --real`'s code path, small: a few arrivals through every real arm on 8 KWOK
nodes under 2 leaves, on a control plane with the Workload API gates on.

It keeps the bench from rotting (the gang objects, the scheduling gate, the gated scheduler, the
bindings it tallies) and checks what holds whatever the trace: kube-scheduler's gang plugin binds
a gang only under one leaf, never one that no leaf had room for, and the pod-by-pod arms admit
the same jobs (every job takes its size in whole nodes).
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

from tests.e2e.test_gangs import APISERVER_FLAGS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import fabric as bench  # bench/fabric.py
from cluster import cluster_with_kwok  # bench/cluster.py


def test_the_real_arms_place_a_small_trace(k8s_bin_dir: Path, kwok_bin: Path) -> None:
    small = bench.build_fabric(leaves=2, per_leaf=4, per_spine=2)
    rng = random.Random(5)
    arrivals = bench.trace(10, rng)
    schedule = bench.timed(arrivals, 0.5, rng)
    with cluster_with_kwok(k8s_bin_dir, kwok_bin, APISERVER_FLAGS) as cluster:
        results = asyncio.run(bench.real_arms(cluster, schedule, small))
    assert set(results) == set(bench.REAL_ARMS)
    gangs = results["gangs"].tally
    assert gangs.jobs > 0
    assert gangs.one_leaf == gangs.fit_possible == gangs.jobs, gangs
    pod_by_pod = {name: r.tally.jobs for name, r in results.items() if name != "gangs"}
    assert len(set(pod_by_pod.values())) == 1, pod_by_pod
    # a job bigger than a leaf's 4 nodes was admitted, bound pod by pod, and left waiting as a gang
    assert results["gangs"].left_waiting > 0, results["gangs"]
