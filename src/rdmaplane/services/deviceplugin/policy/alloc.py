"""Preferred allocation: which of the available devices a container should get.

Pure core behind the device plugin's `GetPreferredAllocation`. The kubelet asks for `size`
devices out of `available`, some of which (`must_include`) are already decided. We answer with
the set that, in this order of importance,

1. spans the fewest NUMA nodes (memory and CPU stay local to the NICs),
2. then the fewest PCIe root complexes (peer traffic stays below one host bridge),
3. then holds the best devices: compared best-first, a device ranks above another when it is
   healthy and the other is not, then when it is faster, then by ID.

Criterion 3 compares the sets' rank lists lexicographically, which makes the answer unique and
therefore deterministic. A device without a known NUMA node shares one "unknown" NUMA group with
the others like it; a device without a PCIe root (a software RDMA device) is its own root.

The search is exact but not exhaustive: the best counts (NUMA nodes, roots) come from the group
capacities, and the devices are then taken greedily best-first, each only while the set can
still be completed within those counts (checked through the NUMA subsets, of which a node has at
most 2^8). `tests/test_alloc.py` holds it against brute force.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

from rdmaplane.core.errors import InputError

NumaKey = int | None
RootKey = tuple[NumaKey, str]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A device the kubelet may hand out, with what the choice depends on."""

    id: str
    numa: int | None = None
    pcie_root: str | None = None
    healthy: bool = True
    rate_gbps: float = 0.0

    @property
    def root_key(self) -> RootKey:
        return (self.numa, self.pcie_root if self.pcie_root else f"device:{self.id}")


class AllocationRequestError(InputError):
    """The request cannot be answered: unknown IDs, or a size that does not fit."""


def rank_order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Best first: healthy, then fastest, then by ID."""
    return sorted(candidates, key=lambda c: (not c.healthy, -c.rate_gbps, c.id))


def preferred_allocation(
    available: Sequence[Candidate], must_include: Sequence[str], size: int
) -> list[str]:
    """The IDs of the preferred set of `size` devices, best device first."""
    by_id = {c.id: c for c in available}
    missing = sorted(set(must_include) - by_id.keys())
    if missing:
        raise AllocationRequestError(f"must-include devices not available: {', '.join(missing)}")
    must = [by_id[i] for i in dict.fromkeys(must_include)]
    if size < len(must):
        raise AllocationRequestError(
            f"allocation size {size} is smaller than the {len(must)} must-include devices"
        )
    if size > len(by_id):
        raise AllocationRequestError(f"allocation size {size} exceeds {len(by_id)} available")
    plan = _Plan(list(by_id.values()), size, must)
    chosen = list(must)
    for c in rank_order(by_id.values()):
        if len(chosen) == size:
            break
        if c not in chosen and plan.completable([*chosen, c]):
            chosen.append(c)
    return [c.id for c in rank_order(chosen)]


class _Plan:
    """Group capacities and the best achievable (NUMA count, root count) for one request."""

    def __init__(self, devices: list[Candidate], size: int, must: list[Candidate]) -> None:
        self.size = size
        self.root_capacity: dict[RootKey, int] = {}
        for d in devices:
            self.root_capacity[d.root_key] = self.root_capacity.get(d.root_key, 0) + 1
        self.numas: list[NumaKey] = sorted(
            {r[0] for r in self.root_capacity}, key=lambda n: (n is None, n or 0)
        )
        self.numa_best, self.roots_best = self._best_counts(must)

    def completable(self, chosen: list[Candidate]) -> bool:
        """Whether `chosen` extends to `size` devices within the best counts."""
        numa_best, roots_best = self.numa_best, self.roots_best
        roots = {c.root_key for c in chosen}
        if len(roots) > roots_best or len(chosen) + roots_best - len(roots) > self.size:
            return False
        return any(
            self._capacity(roots, numa_set, roots_best) >= self.size
            for numa_set in self._numa_sets({r[0] for r in roots}, numa_best)
        )

    def _best_counts(self, must: list[Candidate]) -> tuple[int, int]:
        roots = {c.root_key for c in must}
        numas = {r[0] for r in roots}
        for numa_count in range(max(len(numas), 1), len(self.numas) + 1):
            fewest = [
                self._fewest_roots(roots, numa_set)
                for numa_set in self._numa_sets(numas, numa_count)
            ]
            possible = [n for n in fewest if n is not None]
            if possible:
                return numa_count, min(possible)
        raise AllocationRequestError(f"no set of {self.size} devices holds the must-include ones")

    def _numa_sets(self, required: set[NumaKey], count: int) -> Iterable[frozenset[NumaKey]]:
        if count < len(required):
            return
        others = [n for n in self.numas if n not in required]
        for extra in combinations(others, count - len(required)):
            yield frozenset(required).union(extra)

    def _others(self, roots: set[RootKey], numa_set: frozenset[NumaKey]) -> list[int]:
        """Capacities of the roots inside `numa_set` not yet in `roots`, largest first."""
        return sorted(
            (n for r, n in self.root_capacity.items() if r[0] in numa_set and r not in roots),
            reverse=True,
        )

    def _capacity(self, roots: set[RootKey], numa_set: frozenset[NumaKey], total: int) -> int:
        """Most devices `total` roots can hold: `roots` plus the largest others in `numa_set`."""
        others = self._others(roots, numa_set)
        if len(roots) + len(others) < total:
            return 0
        return sum(self.root_capacity[r] for r in roots) + sum(others[: total - len(roots)])

    def _fewest_roots(self, roots: set[RootKey], numa_set: frozenset[NumaKey]) -> int | None:
        held = sum(self.root_capacity[r] for r in roots)
        count = len(roots)
        for capacity in self._others(roots, numa_set):
            if held >= self.size:
                break
            held += capacity
            count += 1
        return count if held >= self.size else None
