"""The placement policy against hand-checked layouts and a brute-force restatement of the
Topology Manager's rules."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations, product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane import nrt
from rdmaplane.scheduler import placement as pl
from rdmaplane.scheduler.layouts import layout


def _pod(
    *containers: dict[str, int], init: tuple[dict[str, object], ...] = ()
) -> dict[str, object]:
    def container(req: dict[str, object]) -> dict[str, object]:
        extra = {k: v for k, v in req.items() if k == "restartPolicy"}
        limits = {k: str(v) for k, v in req.items() if k != "restartPolicy"}
        return {"name": "c", "resources": {"limits": limits}, **extra}

    return {
        "spec": {
            "containers": [container(c) for c in containers],
            "initContainers": [container(c) for c in init],
        }
    }


def _gpus_nics(g: int, h: int) -> pl.PodRequest:
    return pl.pod_request(_pod({nrt.GPU: g, nrt.HCA: h}))


def test_pod_request_sums_containers_and_takes_init_max() -> None:
    pod = _pod(
        {nrt.GPU: 2, nrt.HCA: 1},
        {nrt.GPU: 1, "cpu": 3},
        init=({nrt.GPU: 4}, {nrt.HCA_SHARED: 1, "restartPolicy": "Always"}, {nrt.HCA: 1}),
    )
    request = pl.pod_request(pod)
    assert request.containers == ((2, 1, 0), (1, 0, 0), (0, 0, 1))
    assert request.init == ((4, 0, 0), (0, 1, 1))
    assert request.total == (4, 1, 1)
    assert request.wants_rdma


def test_requests_win_over_limits_and_quantities_parse() -> None:
    pod = {
        "spec": {
            "containers": [{"resources": {"limits": {nrt.GPU: 2}, "requests": {nrt.GPU: "1"}}}]
        }
    }
    assert pl.pod_request(pod).total == (1, 0, 0)
    assert pl.parse_count("2k", "x") == 2000


@pytest.mark.parametrize(
    ("pod", "field"),
    [
        ({"spec": []}, "Pod.spec"),
        ({"spec": {"containers": {}}}, "Pod.spec.containers"),
        (
            {"spec": {"containers": [{"resources": {"limits": {nrt.GPU: "1.5"}}}]}},
            "Pod.spec.containers[0].resources.limits[nvidia.com/gpu]",
        ),
        (
            {"spec": {"containers": [{"resources": {"requests": []}}]}},
            "Pod.spec.containers[0].resources.requests",
        ),
    ],
)
def test_bad_pods_name_the_field(pod: dict[str, object], field: str) -> None:
    with pytest.raises(pl.RequestError) as err:
        pl.pod_request(pod)
    assert str(err.value).startswith(field + ":")


def test_pass_through_pod() -> None:
    state = pl.node_state(layout("hgx", "n", policy="single-numa-node"))
    verdict = pl.evaluate(state, pl.pod_request(_pod({"cpu": 4})))
    assert verdict == pl.PASS_THROUGH


def test_single_numa_node_cannot_take_eight_gpus_on_two_sockets() -> None:
    state = pl.node_state(layout("hgx", "n", policy="single-numa-node"))
    verdict = pl.evaluate(state, _gpus_nics(8, 8))
    assert not verdict.fits and verdict.unresolvable
    assert "single-numa-node" in verdict.reason
    restricted = pl.node_state(layout("hgx", "n", policy="restricted"))
    assert pl.evaluate(restricted, _gpus_nics(8, 8)).alignment == "pcie"


def test_full_zone_is_resolvable_but_fails() -> None:
    state = pl.node_state(layout("hgx", "n", policy="single-numa-node"))
    placed = pl.place_pod(state, _gpus_nics(3, 3))
    assert not isinstance(placed, pl.Rejection)
    state = placed[1]
    placed = pl.place_pod(state, _gpus_nics(3, 3))  # goes to node-1
    assert not isinstance(placed, pl.Rejection)
    assert placed[0][0].zones == (1,)
    verdict = pl.evaluate(placed[1], _gpus_nics(2, 2))
    assert not verdict.fits and not verdict.unresolvable


def test_nics_on_one_socket_score_below_paired_nodes() -> None:
    paired = pl.evaluate(pl.node_state(layout("hgx", "a", policy="best-effort")), _gpus_nics(8, 8))
    lopsided = pl.evaluate(
        pl.node_state(layout("one-socket-nics", "b", policy="best-effort")), _gpus_nics(8, 8)
    )
    assert paired.alignment == "pcie" and lopsided.alignment == "cross"
    assert paired.score > lopsided.score


def test_packing_prefers_the_fragment_over_a_fresh_node() -> None:
    fresh = pl.node_state(layout("hgx", "a", policy="single-numa-node"))
    placed = pl.place_pod(fresh, _gpus_nics(3, 3))
    assert not isinstance(placed, pl.Rejection)
    fragment = placed[1]
    one = _gpus_nics(1, 1)
    assert pl.evaluate(fragment, one).score > pl.evaluate(fresh, one).score


def test_pcie_beats_numa_only_alignment() -> None:
    # node-0 of a two-socket node: GPUs and NICs on different roots of the same NUMA zone
    devices = [nrt.Device(nrt.GPU, 0, "pci0000:15"), nrt.Device(nrt.HCA, 0, "pci0000:37")]
    numa_only = pl.node_state(nrt.build("n", devices, policy="single-numa-node"))
    paired = pl.node_state(
        nrt.build(
            "p",
            [nrt.Device(nrt.GPU, 0, "r"), nrt.Device(nrt.HCA, 0, "r")],
            policy="single-numa-node",
        )
    )
    a, b = pl.evaluate(numa_only, _gpus_nics(1, 1)), pl.evaluate(paired, _gpus_nics(1, 1))
    assert (a.alignment, b.alignment) == ("numa", "pcie")
    assert b.score > a.score


def test_container_scope_places_containers_one_by_one() -> None:
    state = pl.node_state(layout("hgx", "n", policy="single-numa-node", scope="container"))
    two = pl.pod_request(_pod({nrt.GPU: 4, nrt.HCA: 4}, {nrt.GPU: 4, nrt.HCA: 4}))
    verdict = pl.evaluate(state, two)
    assert verdict.fits and [p.zones for p in verdict.placements] == [(0,), (1,)]
    pod_scope = pl.node_state(layout("hgx", "n", policy="single-numa-node", scope="pod"))
    assert not pl.evaluate(pod_scope, two).fits


def test_shared_slot_pairs_every_gpu_on_a_pool_root() -> None:
    state = pl.node_state(layout("hgx-shared", "n", policy="single-numa-node"))
    verdict = pl.evaluate(state, pl.pod_request(_pod({nrt.GPU: 4, nrt.HCA_SHARED: 1})))
    assert verdict.fits and verdict.alignment == "pcie"


# ---- brute force --------------------------------------------------------------------------------


@st.composite
def nodes(draw: st.DrawFn) -> pl.NodeState:
    devices = []
    for numa in range(draw(st.integers(1, 4))):
        for r in range(draw(st.integers(0, 3))):
            root = f"pci0000:{numa}{r}"
            for resource in (nrt.GPU, nrt.HCA):
                for _ in range(draw(st.integers(0, 2))):
                    devices.append(nrt.Device(resource, numa, root, in_use=draw(st.booleans())))
        for _ in range(draw(st.integers(0, 2))):
            devices.append(nrt.Device(nrt.HCA_SHARED, numa, None, in_use=draw(st.booleans())))
        if draw(st.booleans()):  # a zone may also have no device at all
            devices.append(nrt.Device(nrt.GPU, numa, None, healthy=False))
    topology = nrt.build(
        "n",
        devices,
        policy=draw(st.sampled_from(nrt.POLICIES)),
        scope="pod",
        shared_pool_hcas=[(d.numa, d.pcie_root) for d in devices if d.resource == nrt.HCA],
    )
    return pl.node_state(topology)


UNITS = st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 2)).filter(
    lambda u: u != (0, 0, 0)
)


def _brute_force_admits(state: pl.NodeState, unit: pl.Vec) -> bool:
    """The Topology Manager's admission, restated over every mask without shortcuts."""
    n = len(state.zones)
    masks = [frozenset(c) for k in range(1, n + 1) for c in combinations(range(n), k)]
    if any(sum(z.free[r] for z in state.zones) < unit[r] for r in range(3)):
        return False
    if state.policy in ("none", "best-effort"):
        return True
    hint_sets = []
    for r in (r for r in range(3) if unit[r]):
        fitting = [m for m in masks if sum(state.zones[i].capacity[r] for i in m) >= unit[r]]
        if not fitting:
            return False
        width = min(len(m) for m in fitting)
        if state.policy == "single-numa-node" and width > 1:
            return False
        hint_sets.append(
            [
                m
                for m in fitting
                if len(m) == width and sum(state.zones[i].free[r] for i in m) >= unit[r]
            ]
        )
    return any(frozenset.intersection(*combo) for combo in product(*hint_sets))


@settings(max_examples=300, deadline=None)
@given(nodes(), UNITS)
def test_filter_agrees_with_brute_force(state: pl.NodeState, unit: pl.Vec) -> None:
    verdict = pl.evaluate(state, pl.PodRequest((unit,), (), unit))
    assert verdict.fits == _brute_force_admits(state, unit)


@settings(max_examples=300, deadline=None)
@given(nodes(), UNITS)
def test_placement_is_real_and_maximally_paired(state: pl.NodeState, unit: pl.Vec) -> None:
    placed = pl.place_unit(state, unit)
    if isinstance(placed, pl.Rejection):
        return
    after = pl.apply(state, placed)
    for zone in after.zones:  # never more than was free, and the books balance
        assert min(zone.free) >= 0
        assert all(r.free_gpus >= 0 and r.free_hcas >= 0 for r in zone.roots)
    took = [
        sum(b.free[r] - a.free[r] for b, a in zip(state.zones, after.zones, strict=True))
        for r in range(3)
    ]
    assert tuple(took) == unit
    chosen = [state.zones[i] for i in placed.zones]
    if all(sum(z.free[r] for z in chosen) >= unit[r] for r in range(3)):
        assert set(
            i for i, (b, a) in enumerate(zip(state.zones, after.zones, strict=True)) if b != a
        ) <= set(placed.zones)
        if unit[1]:  # every pair the chosen zones allow on a shared PCIe root is made
            possible = sum(min(r.free_gpus, r.free_hcas) for z in chosen for r in z.roots if r.name)
            assert placed.pcie_pairs == min(unit[0], unit[1], possible)
    if state.policy == "single-numa-node":
        assert len(placed.zones) == 1


@settings(max_examples=200, deadline=None)
@given(nodes(), UNITS)
def test_score_in_range_and_failures_explain(state: pl.NodeState, unit: pl.Vec) -> None:
    verdict = pl.evaluate(state, pl.PodRequest((unit,), (), unit))
    assert 0 <= verdict.score <= 10
    assert verdict.reason
    if verdict.unresolvable:  # nothing freed would help: it fails on the empty node too
        assert not pl.evaluate(state.fresh(), pl.PodRequest((unit,), (), unit)).fits


def _containers_fit_somewhere(state: pl.NodeState, units: tuple[pl.Vec, ...]) -> bool:
    """Brute force: each container on one NUMA zone, together within the zones' free devices."""
    for choice in product(range(len(state.zones)), repeat=len(units)):
        used = [[0, 0, 0] for _ in state.zones]
        for z, unit in zip(choice, units, strict=True):
            for r in range(3):
                used[z][r] += unit[r]
        if all(
            used[z][r] <= state.zones[z].free[r] for z in range(len(state.zones)) for r in range(3)
        ):
            return True
    return False


@settings(max_examples=300, deadline=None)
@given(nodes(), st.lists(UNITS, min_size=1, max_size=3))
def test_container_scope_single_numa_pod_that_passes_really_fits(
    state: pl.NodeState, units: list[pl.Vec]
) -> None:
    state = replace(state, policy="single-numa-node", scope="container")
    total = tuple(sum(u[r] for u in units) for r in range(3))
    request = pl.PodRequest(tuple(units), (), total)  # type: ignore[arg-type]
    verdict = pl.evaluate(state, request)
    if verdict.fits:
        assert _containers_fit_somewhere(state, tuple(units))
        assert all(len(p.zones) == 1 for p in verdict.placements)
        assert verdict.state_after is not None
        for zone in verdict.state_after.zones:
            assert min(zone.free) >= 0
    elif len(units) == 1:  # one container: the kubelet's choice is not greedy, so this is exact
        assert not _containers_fit_somewhere(state, tuple(units))


def test_affinity_narrower_than_the_request_is_not_promised_alignment() -> None:
    # GPUs and NICs 2+2 on NUMA zones 1, 3, 5, 7: preferred hints {1,3} and {1,5} merge into {1}
    dgx = pl.node_state(layout("dgx-a100", "d", policy="restricted"))
    verdict = pl.evaluate(dgx, _gpus_nics(4, 4))
    assert verdict.fits
    (placed,) = verdict.placements
    assert placed.zones == (1,) and placed.preferred and placed.spilled == (3,)
    assert verdict.alignment == "cross" and "rest from node-3, unaligned" in verdict.reason
    hgx = pl.evaluate(pl.node_state(layout("hgx", "h", policy="restricted")), _gpus_nics(4, 4))
    assert hgx.alignment == "pcie" and hgx.score > verdict.score
    two = pl.evaluate(dgx, _gpus_nics(2, 2))  # fits one zone: promised
    assert two.alignment == "pcie" and not two.placements[0].spilled
