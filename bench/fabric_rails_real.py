"""Matching rails at size through the real kube-scheduler on KWOK, judged by the kubelet harness.

ARRIVALS arrivals of bench/fabric_rails.py's trace (lifetimes scaled to the cluster) on the 256
nodes of bench/fabric_jobs.py's fabric as KWOK nodes of the same sample (its kubelet's capacity,
its agent's NRT with rails), through the real kube-scheduler alone and with the extender, one
arrival at a time as in bench/fabric_jobs_real.py (a job whose pods the free GPUs no longer hold
is turned away). KWOK runs no agent: as a watch sees a pod bound or gone, the bench replays that
node's pods through one kubelet harness and writes the NRT the agent would then publish (the
agent's own builder), so the extender reads what it would in a real cluster, a little late, as
from an agent. KWOK runs no kubelet either: the real bindings (which node, in binding order, and
when each pod ended) are then replayed again node by node through the harness, for the NICs the
kubelet would give each pod, so its rails; the shares are counted as in bench/fabric_rails.py,
`matchable` and the prediction on the NRTs the agent would have published after each step.

Needs `make k8s-bins` and the kubelet harness; not run by `make bench` (~11 minutes or more on
the 2-core machine). The machinery shared with the other fabric benches is in bench/fabriclib/.

    python bench/fabric_rails_real.py [--arrivals 1500] [--seed 11]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import heapq
import random
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

from fabriclib.agents import LiveAgents, Published
from fabriclib.fabric import LEAVES, build_fabric
from fabriclib.rails import RailTally, matchable, rail_cache, rail_cluster, tally_pairs
from fabriclib.replay import RailEvent, ReplayedKubelet, kubelet_replay
from fabriclib.report import RAIL_COLUMNS, RAIL_LEGEND, load_average, rail_row
from fabriclib.rig import REAL_ARMS, RealArm, control_plane, finish, kwok_nodes, place, real_arms
from fabriclib.trace import (
    RAIL_PODS,
    RAIL_SAMPLE,
    RAIL_SIZES,
    Job,
    RailArrival,
    pods_of,
    rail_job,
    rail_trace,
)

from rdmaplane.core import fabric as fab
from rdmaplane.core import nrt
from rdmaplane.services.scheduler.cache import pod_key
from rdmaplane.services.scheduler.policy import podrequest
from tests.e2e import fleet
from tests.e2e.controlplane import KubeCluster

RAIL_ARMS = ("default", "extender")


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
    """bench/fabric_rails.py's loop through the real kube-scheduler, one arrival at a time
    (finished jobs' pods deleted first); a job whose pods the free GPUs no longer hold is turned
    away. What happened goes to `events`, pods' binds in kube-scheduler's order; how many were
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


def judge_rails(
    harness: Any, nodes: list[fleet.FleetNode], events: list[RailEvent], published: Published
) -> tuple[RailTally, int]:
    """bench/fabric_rails.py's tally for a real arm's events: rails from the kubelet's replay,
    each job's `matchable` and each pod's predicted rails from an extender cache fed the NRTs
    the agent would have published as they happened; and the prediction of one fed as the real
    one was (`published`, the NRTs the live agents wrote, when they did, and the bound pods,
    each not yet in its node's NRT placed where the extender predicts the kubelet puts it).
    With the number of nodes whose last NRT written is not the kubelet replay's last."""
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
    """`count` arrivals of the rails trace on the 256-node fabric through the real
    kube-scheduler, every pod's NICs from the kubelet harness."""
    from tests.kubelet.harness import sample_node

    fabric = build_fabric()
    arrivals = rail_trace(count, random.Random(seed), len(fabric.nodes))
    load = load_average()
    with (
        sample_node(RAIL_SAMPLE) as sample,
        rail_cluster(sample, {"replay": {}}) as one,
        control_plane() as cluster,
    ):
        real = rails_of_real_arms(cluster, one.nodes["replay"], fabric, arrivals)
    print(
        f"rails at size: {len(fabric.nodes)} {RAIL_SAMPLE} KWOK nodes under {LEAVES} leaves, "
        f"one rail group; {count} jobs of {'/'.join(map(str, RAIL_PODS))} pods x "
        f"{'/'.join(str(s) for s, _ in RAIL_SIZES)} GPUs+NICs (seed {seed}); load average "
        f"{load} at start, {load_average()} at the end"
    )
    print(
        f"{RAIL_COLUMNS} {'on KWOK':>8} {'NRT writes':>11} {'behind':>7} {'turned away':>12} "
        f"{'wall s':>7}"
    )
    for name, r in real.items():
        t = r.tally
        print(
            f"{rail_row(f'real: {name}', t)} {100 * t.predicted_seen / max(1, t.pods):>7.1f}% "
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--arrivals",
        type=int,
        default=1500,
        help="jobs of the rails trace on the 256 nodes, through kube-scheduler alone and with "
        "the extender (needs `make k8s-bins`), the bindings replayed through the kubelet harness",
    )
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    real_rails(args.arrivals, args.seed)


if __name__ == "__main__":
    main()
