"""rdmaplane's stand-in schedulers over the extender's cache, and what each job's placement
counts for: under one leaf, hops between ranks, decode pods near their prefill."""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass

from rdmaplane.core import fabric as fab
from rdmaplane.core import nrt
from rdmaplane.core.settings.scheduler import FabricScoring
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.policy import podrequest
from tests.layouts import layout

from .fabric import leaves_of, mean_hops
from .trace import Job, Schedule, pods_of

Running = list[tuple[float, int, Job, dict[str, list[str]]]]  # ends, seq, job, nodes per scheduler


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


@dataclass
class Tally:
    fit_possible: int = 0
    one_leaf: int = 0
    jobs: int = 0
    hops: float = 0.0
    decode_pods: int = 0
    decode_near: int = 0


def run_model(
    schedule: Schedule, fabric: fab.Fabric, seed: int
) -> tuple[dict[str, Tally], list[Scheduler], int]:
    """Both model schedulers in lockstep over `schedule`: tallies, schedulers, turned away."""
    where, leaf = fabric.locations(), leaves_of(fabric)
    schedulers = [Scheduler(n, fabric, seed) for n in ("default", "rdmaplane")]
    tallies = {s.name: Tally() for s in schedulers}
    running: Running = []
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
                room = free_per_leaf(s.cache, leaf)
                placed = s.run(job)
                placed_by[s.name] = placed
                count_job(tallies[s.name], job, placed, room, where, leaf, running, s.name)
            free -= job.size
            seq += 1
            heapq.heappush(running, (now + duration, seq, job, placed_by))
    return tallies, schedulers, turned_away


def free_per_leaf(cache: ClusterCache, leaf: dict[str, str]) -> dict[str, int]:
    request = podrequest.PodRequest.of({nrt.GPU: 8, nrt.HCA: 8})
    names = sorted(leaf)
    room: dict[str, int] = {}
    for n, v in zip(names, cache.verdicts(names, request), strict=True):
        room[leaf[n]] = room.get(leaf[n], 0) + v.fits
    return room


def count_job(
    tally: Tally,
    job: Job,
    placed: list[str],
    room: dict[str, int],
    where: dict[str, fab.Location],
    leaf: dict[str, str],
    running: Running,
    scheduler: str,
) -> None:
    """Count the job's placement (by `scheduler`, which `running` keys its jobs' nodes by):
    hops, one leaf when some leaf had `room` for it, a decode's pods near its prefill's."""
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
