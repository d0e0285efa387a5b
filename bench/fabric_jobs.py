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

The same trace through the real kube-scheduler on KWOK: bench/fabric_jobs_real.py. The
machinery shared with the other fabric benches is in bench/fabriclib/.

    python bench/fabric_jobs.py [--jobs 1500] [--seed 11]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/layouts.py

from fabriclib.fabric import build_fabric
from fabriclib.model import run_model
from fabriclib.report import report_model
from fabriclib.trace import busy_schedule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    fabric = build_fabric()
    schedule = busy_schedule(args.jobs, args.seed, len(fabric.nodes))
    tallies, schedulers, turned_away = run_model(schedule, fabric, args.seed)
    report_model(tallies, schedulers, args.seed, turned_away, len(schedule))


if __name__ == "__main__":
    main()
