"""The jobs, their pods, and the traces both kinds of bench replay: whole-node jobs and
prefill/decode pairs on the fabric (with each arrival's moment and lifetime), and part-node jobs
for the rails."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from rdmaplane.core import nrt

SIZES = ((2, 0.35), (4, 0.3), (8, 0.25), (16, 0.1))
PD_SHARE = 0.2
TARGET_UTILISATION = 0.7
JOB = "batch.kubernetes.io/job-name"

RAIL_NODES, RAIL_SAMPLE = 16, "hgx-h100-roce"  # one GPU + one NIC per PCIe root: rail-optimised
RAIL_SIZES = ((2, 0.5), (4, 0.5))  # GPUs (and NICs) per pod
RAIL_PODS = (2, 3, 4)  # pods per job


@dataclass
class Job:
    name: str
    size: int
    labels: dict[str, str]
    prefill: str | None = None  # the prefill job a decode job reads from
    placed: list[str] = field(default_factory=list)
    gpus: int = 8  # per pod, and as many HCAs: a whole HGX node unless a rails job
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


Schedule = list[tuple[float, float, tuple[Job, ...]]]


def timed(arrivals: list[tuple[Job, ...]], gap: float, rng: random.Random) -> Schedule:
    """Each arrival's moment and how long it runs (mean 1.0): drawn once, the same for every
    scheduler, model or real."""
    out, now = [], 0.0
    for group in arrivals:
        now += rng.expovariate(1 / gap)
        out.append((now, rng.expovariate(1.0), group))
    return out


def busy_schedule(count: int, seed: int, nodes: int) -> Schedule:
    """`count` arrivals of `trace` (seed `seed`), timed to keep `nodes` nodes about
    `TARGET_UTILISATION` busy."""
    rng = random.Random(seed)
    arrivals = trace(count, rng)
    mean_size = sum(s * w for s, w in SIZES)
    gap = mean_size / (nodes * TARGET_UTILISATION)  # mean duration 1.0
    return timed(arrivals, gap, rng)


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
