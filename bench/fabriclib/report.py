"""What the fabric benches print: the columns, a scheduler's row and the legends, for the jobs
on the fabric and for the rails; the machine's load average."""

from __future__ import annotations

import os

from .fabric import LEAVES, LEAVES_PER_SPINE, PER_LEAF, TOP_HOPS
from .model import Scheduler, Tally
from .rails import RailTally

COLUMNS = (
    f"{'scheduler':<22} {'jobs':>5} {'one leaf':>9} {'mean hops':>10} {'saved':>6} {'PD near':>8}"
)


def row(name: str, t: Tally) -> str:
    """A scheduler's figures: one leaf, mean hops, hops saved, PD near."""
    hops = t.hops / max(1, t.jobs)
    return (
        f"{name:<22} {t.jobs:>5} {100 * t.one_leaf / max(1, t.fit_possible):>8.1f}% "
        f"{hops:>10.2f} {TOP_HOPS - hops:>6.2f} "
        f"{100 * t.decode_near / max(1, t.decode_pods):>7.1f}%"
    )


def report_model(
    tallies: dict[str, Tally],
    schedulers: list[Scheduler],
    seed: int,
    turned_away: int,
    arrivals: int,
) -> None:
    """The model schedulers' figures over `arrivals` arrivals (seed `seed`)."""
    print(
        f"fabric: {LEAVES} leaves x {PER_LEAF} nodes, {LEAVES // LEAVES_PER_SPINE} spines, 1 core;"
        f" {arrivals} arrivals (seed {seed}), {turned_away} turned away (cluster full)"
    )
    print(f"{COLUMNS} {'ms/pod':>7}")
    saved = {}
    for s in schedulers:
        t = tallies[s.name]
        saved[s.name] = TOP_HOPS - t.hops / t.jobs
        print(f"{row(s.name, t)} {1000 * s.seconds / max(1, s.pods):>7.2f}")
    ratio = saved["rdmaplane"] / saved["default"] if saved["default"] > 0 else float("inf")
    print(f"hops saved, rdmaplane vs default: {ratio:.1f}x")
    print(
        "one leaf = share of jobs under one leaf, of those that could fit under one when they "
        "arrived; hops and PD by rdmaplane's own fabric model, not measured on a network"
    )


RAIL_COLUMNS = (
    f"{'scheduler':<22} {'pods':>5} {'unplaced':>9} {'pairs':>6} {'rails match':>12} "
    f"{'allowed pairs':>14} {'match there':>12} {'predicted':>10}"
)
RAIL_LEGEND = (
    "rails match = share of a job's pod pairs on different nodes whose NICs' rails match "
    "(one's among the other's), by the kubelet's own allocation; allowed pairs / match "
    "there = the same over the jobs the fabric let match as they arrived (one node held "
    "them all, or as many nodes as pods offered one rail set, by the extender's "
    "prediction); predicted = share of pods whose rails the extender predicted as the "
    "kubelet gave them"
)


def rail_row(name: str, t: RailTally) -> str:
    return (
        f"{name:<22} {t.pods:>5} {t.unplaced:>9} {t.pairs:>6} "
        f"{100 * t.matched / max(1, t.pairs):>11.1f}% {t.allowed_pairs:>14} "
        f"{100 * t.allowed_matched / max(1, t.allowed_pairs):>11.1f}% "
        f"{100 * t.predicted / max(1, t.pods):>9.1f}%"
    )


def load_average() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())
