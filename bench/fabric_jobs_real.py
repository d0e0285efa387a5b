"""Multi-node jobs on the fabric through the real kube-scheduler on KWOK, beside the model.

bench/fabric_jobs.py's run (its figures printed first: the model over all the trace's
arrivals), then the trace's first ARRIVALS arrivals through the real thing: kube-scheduler
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
the model on the same ARRIVALS arrivals. Needs `make k8s-bins`; not run by `make bench` (about
10 minutes on the 2-core machine).

    python bench/fabric_jobs_real.py [--arrivals 600] [--jobs 1500] [--seed 11]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/layouts.py

from fabriclib.fabric import build_fabric, leaves_of
from fabriclib.model import Running, Tally, count_job, run_model
from fabriclib.report import COLUMNS, load_average, report_model, row
from fabriclib.rig import REAL_ARMS, RealArm, control_plane, finish, kwok_nodes, place, real_arms
from fabriclib.trace import Schedule, busy_schedule

from rdmaplane.core import fabric as fab
from tests.e2e.controlplane import KubeCluster


@dataclass
class RealResult:
    tally: Tally
    turned_away: int
    left_waiting: int  # gangs judged unschedulable (no leaf had room), withdrawn
    seconds: float


async def run_arm(arm: RealArm, schedule: Schedule, fabric: fab.Fabric) -> tuple[Tally, int, int]:
    """The model's loop, one job at a time through the real scheduler: finished jobs leave, an
    arrival with fewer free nodes than it needs is turned away, the rest are placed and
    tallied from their real bindings."""
    where, leaf = fabric.locations(), leaves_of(fabric)
    tally, busy = Tally(), set[str]()
    running: Running = []
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
            count_job(tally, job, placed, room, where, leaf, running, arm.name)
            seq += 1
            heapq.heappush(running, (now + duration, seq, job, {arm.name: placed}))
    return tally, turned_away, left_waiting


async def real_job_arms(
    cluster: KubeCluster, schedule: Schedule, fabric: fab.Fabric
) -> dict[str, RealResult]:
    """The whole-node trace through every arm."""

    async def run(arm: RealArm) -> tuple[Tally, int, int]:
        return await run_arm(arm, schedule, fabric)

    got = await real_arms(cluster, kwok_nodes(fabric), REAL_ARMS, run)
    return {name: RealResult(*r, seconds) for name, (r, seconds) in got.items()}


def real(schedule: Schedule, fabric: fab.Fabric) -> None:
    """The real arms on a gated control plane, beside the model on the same arrivals."""
    load = load_average()
    with control_plane() as cluster:
        results = asyncio.run(real_job_arms(cluster, schedule, fabric))
    model, _, model_turned = run_model(schedule, fabric, 0)
    report_real(results, model, model_turned, len(schedule), len(fabric.nodes), load)


def report_real(
    results: dict[str, RealResult],
    model: dict[str, Tally],
    model_turned: int,
    arrivals: int,
    nodes: int,
    load: str,
) -> None:
    print(
        f"\nthe first {arrivals} arrivals through the real kube-scheduler (v1.37.2) on {nodes} "
        f"KWOK nodes, each arm alone in turn; load average {load} at start, "
        f"{load_average()} at the end"
    )
    print(f"{COLUMNS} {'turned away':>12} {'left waiting':>13} {'wall s':>7}")
    for name, t in model.items():
        print(f"{row(f'model: {name}', t)} {model_turned:>12} {'-':>13} {'-':>7}")
    for name, r in results.items():
        print(
            f"{row(f'real: {name}', r.tally)} {r.turned_away:>12} {r.left_waiting:>13} "
            f"{r.seconds:>7.0f}"
        )
    for name, setup in REAL_ARMS.items():
        print(f"  real: {name} = {setup.label}")
    print(
        "model = rdmaplane's stand-ins on the same arrivals; real = where the real kube-scheduler "
        "bound the pods (one leaf from those bindings; hops and PD counted on our fabric model); "
        "left waiting = gangs no leaf had room for, judged unschedulable and withdrawn"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--arrivals",
        type=int,
        default=600,
        help="send the trace's first ARRIVALS arrivals through the real kube-scheduler on KWOK, "
        "four ways (needs `make k8s-bins`)",
    )
    parser.add_argument(
        "--jobs", type=int, default=1500, help="arrivals in the trace (the model runs them all)"
    )
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    fabric = build_fabric()
    schedule = busy_schedule(args.jobs, args.seed, len(fabric.nodes))
    tallies, schedulers, turned_away = run_model(schedule, fabric, args.seed)
    report_model(tallies, schedulers, args.seed, turned_away, len(schedule))
    real(schedule[: args.arrivals], fabric)


if __name__ == "__main__":
    main()
