"""`bench/fabric_jobs_real.py`'s and `bench/fabric_rails_real.py`'s code paths, small: a few
arrivals through every real arm on 8 KWOK nodes under 2 leaves, on a control plane with the
Workload API gates on.

It keeps the benches from rotting (the gang objects, the scheduling gate, the gated scheduler,
the bindings it tallies) and checks what holds whatever the trace: kube-scheduler's gang plugin
binds a gang only under one leaf, never one that no leaf had room for, and the pod-by-pod arms
admit the same jobs (every job takes its size in whole nodes). The rails arms
(`bench/fabric_rails_real.py`) put part-node pods on rail-optimised KWOK nodes whose NRTs the
bench keeps as their agents would (each node's pods replayed through the kubelet harness as the
watch sees them bound or gone), and their bindings are replayed again through the harness (the
kubelet's own device manager): every bound pod gets NICs, so rails, from it, and every node's
last NRT written is the one that replay leaves.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

from tests.e2e.test_gangs import APISERVER_FLAGS
from tests.kubelet.harness import sample_node

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import fabric_jobs_real  # bench/fabric_jobs_real.py
import fabric_rails_real  # bench/fabric_rails_real.py
from cluster import cluster_with_kwok  # bench/cluster.py
from fabriclib.fabric import build_fabric  # bench/fabriclib/
from fabriclib.rails import rail_cluster
from fabriclib.rig import REAL_ARMS
from fabriclib.trace import RAIL_SAMPLE, rail_trace, timed, trace


def test_the_real_arms_place_a_small_trace(k8s_bin_dir: Path, kwok_bin: Path) -> None:
    small = build_fabric(leaves=2, per_leaf=4, per_spine=2)
    rng = random.Random(5)
    arrivals = trace(10, rng)
    schedule = timed(arrivals, 0.5, rng)
    with cluster_with_kwok(k8s_bin_dir, kwok_bin, APISERVER_FLAGS) as cluster:
        results = asyncio.run(fabric_jobs_real.real_job_arms(cluster, schedule, small))
    assert set(results) == set(REAL_ARMS)
    gangs = results["gangs"].tally
    assert gangs.jobs > 0
    assert gangs.one_leaf == gangs.fit_possible == gangs.jobs, gangs
    pod_by_pod = {name: r.tally.jobs for name, r in results.items() if name != "gangs"}
    assert len(set(pod_by_pod.values())) == 1, pod_by_pod
    # a job bigger than a leaf's 4 nodes was admitted, bound pod by pod, and left waiting as a gang
    assert results["gangs"].left_waiting > 0, results["gangs"]


def test_the_real_rails_arms_bind_part_node_pods_the_kubelet_then_admits(
    k8s_bin_dir: Path, kwok_bin: Path
) -> None:
    small = build_fabric(leaves=2, per_leaf=4, per_spine=2)
    arrivals = rail_trace(12, random.Random(5), len(small.nodes))
    with (
        sample_node(RAIL_SAMPLE) as sample,
        rail_cluster(sample, {"replay": {}}) as one,
        cluster_with_kwok(k8s_bin_dir, kwok_bin, APISERVER_FLAGS) as cluster,
    ):
        harness = one.nodes["replay"]
        results = fabric_rails_real.rails_of_real_arms(cluster, harness, small, arrivals)
    assert set(results) == set(fabric_rails_real.RAIL_ARMS)
    offered = sum(n for _, n, _, _ in arrivals)
    for name, r in results.items():
        t = r.tally
        # every pod either bound and admitted by the kubelet, or of a job turned away
        assert t.pods > 0 and t.pods + t.unplaced == offered, (name, t)
        assert (r.turned_away == 0) == (t.unplaced == 0), (name, r)
        # a rails share from the kubelet's allocation: some job crossed nodes
        assert t.pairs > 0 and 0 <= t.matched <= t.pairs, (name, t)
        # the NRTs replayed after each step are the kubelet's: on this sample (one NIC per GPU
        # root) the extender's prediction from them is the kubelet's allocation, pod for pod
        assert t.predicted == t.pods, (name, t)
        # the live agents wrote NRTs as pods came and went, and caught up: each node's last
        # one is what the replay of all its binds and ends leaves
        assert r.writes > 0 and r.behind == 0, (name, r)
