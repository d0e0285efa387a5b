"""Sets of NUMA zones as bitmasks of zone indices (bit i: the node's i-th zone, in NUMA id
order), as the kubelet's Topology Manager counts them (upstream `bitmask`), and its hints. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Hint:
    """A Topology Manager hint: a set of NUMA zones (a bitmask of zone indices) and whether it
    is preferred."""

    mask: int
    preferred: bool


def zones_of(mask: int, count: int) -> tuple[int, ...]:
    """The indices of the zones in `mask`, of a node with `count` zones."""
    return tuple(index for index in range(count) if mask >> index & 1)


def mask_sums(values: Sequence[int]) -> list[int]:
    """For every mask of len(values) zones, the sum of its zones' values (index: the mask)."""
    sums = [0] * (1 << len(values))
    for mask in range(1, len(sums)):
        low = mask & -mask
        sums[mask] = sums[mask ^ low] + values[low.bit_length() - 1]
    return sums


def mask_maxes(values: Sequence[int]) -> list[int]:
    """For every mask, the largest of its zones' values."""
    maxes = [0] * (1 << len(values))
    for mask in range(1, len(maxes)):
        low = mask & -mask
        maxes[mask] = max(maxes[mask ^ low], values[low.bit_length() - 1])
    return maxes


def narrowness(mask: int) -> tuple[int, int]:
    """Upstream's `IsNarrowerThan`: fewer NUMA zones, then the lower bitmask."""
    return (mask.bit_count(), mask)
