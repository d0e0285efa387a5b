"""The preferred-allocation core against brute force, and the cases users will recognise."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.services.deviceplugin.policy.alloc import (
    AllocationRequestError,
    Candidate,
    preferred_allocation,
    rank_order,
)


def brute_force(available: list[Candidate], must: list[str], size: int) -> list[str]:
    """Every set of `size` devices holding `must`, scored by (NUMA nodes, roots, ranks)."""
    rank = {c.id: i for i, c in enumerate(rank_order(available))}

    def score(group: tuple[Candidate, ...]) -> tuple[int, int, list[int]]:
        return (
            len({c.numa for c in group}),
            len({c.root_key for c in group}),
            sorted(rank[c.id] for c in group),
        )

    sets = [g for g in combinations(available, size) if set(must) <= {c.id for c in g}]
    best = min(sets, key=score)
    return [c.id for c in rank_order(best)]


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[Candidate], list[str], int]:
    numas = draw(st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=1, max_size=3))
    count = draw(st.integers(1, 9))
    devices = []
    for i in range(count):
        numa = draw(st.sampled_from(numas))
        root = draw(st.sampled_from([None, "pci0000:00", "pci0000:17", "pci0000:80"]))
        devices.append(
            Candidate(
                id=f"0000:{i:02x}:00.0",
                numa=numa,
                pcie_root=None if root is None else f"{root}-{numa}",
                healthy=draw(st.booleans()),
                rate_gbps=draw(st.sampled_from([100.0, 200.0, 400.0])),
            )
        )
    available = draw(st.lists(st.sampled_from(devices), min_size=1, unique=True))
    size = draw(st.integers(1, len(available)))
    must = draw(st.lists(st.sampled_from([c.id for c in available]), max_size=size, unique=True))
    return available, must, size


@settings(max_examples=400, deadline=None)
@given(requests())
def test_matches_brute_force(request: tuple[list[Candidate], list[str], int]) -> None:
    available, must, size = request
    got = preferred_allocation(available, must, size)
    assert got == brute_force(available, must, size)
    assert len(got) == size and set(must) <= set(got)


def hgx() -> list[Candidate]:
    """Eight 400G NICs, one per root complex, four per NUMA node."""
    return [
        Candidate(id=f"nic{i}", numa=i // 4, pcie_root=f"pci0000:{i:02x}", rate_gbps=400.0)
        for i in range(8)
    ]


def test_stays_on_one_numa_node_when_it_can() -> None:
    assert preferred_allocation(hgx(), [], 4) == ["nic0", "nic1", "nic2", "nic3"]
    assert preferred_allocation(hgx(), ["nic5"], 2) == ["nic4", "nic5"]


def test_honours_must_include_across_numa_nodes() -> None:
    got = preferred_allocation(hgx(), ["nic0", "nic7"], 3)
    assert got == ["nic0", "nic1", "nic7"]


def test_prefers_healthy_then_faster() -> None:
    devices = [
        Candidate("a", numa=0, pcie_root="r0", healthy=False, rate_gbps=400.0),
        Candidate("b", numa=0, pcie_root="r1", rate_gbps=100.0),
        Candidate("c", numa=0, pcie_root="r2", rate_gbps=400.0),
    ]
    assert preferred_allocation(devices, [], 1) == ["c"]
    assert preferred_allocation(devices, [], 2) == ["c", "b"]


def test_fewer_roots_beat_faster_devices() -> None:
    devices = [
        Candidate("fast0", numa=0, pcie_root="r0", rate_gbps=400.0),
        Candidate("fast1", numa=0, pcie_root="r1", rate_gbps=400.0),
        Candidate("slow0", numa=0, pcie_root="r2", rate_gbps=100.0),
        Candidate("slow1", numa=0, pcie_root="r2", rate_gbps=100.0),
    ]
    assert preferred_allocation(devices, [], 2) == ["slow0", "slow1"]


@pytest.mark.parametrize(
    ("must", "size", "message"),
    [
        (["nope"], 1, "must-include devices not available: nope"),
        (["nic0", "nic1"], 1, "smaller than the 2 must-include"),
        ([], 9, "exceeds 8 available"),
    ],
)
def test_bad_requests_say_why(must: list[str], size: int, message: str) -> None:
    with pytest.raises(AllocationRequestError, match=message):
        preferred_allocation(hgx(), must, size)
