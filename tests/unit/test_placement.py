"""The placement policy's pure parts: reading pods, hand-checked layouts, and invariants.

Whether the prediction matches the kubelet is not judged here: tests/kubelet runs the kubelet's
own device manager and Topology Manager with real device plugins and compares (random sequences
in test_differential.py, each upstream rule by name in test_upstream_behaviours.py). The cases
below are the same situations on the synthetic layouts, each checked against the harness once
(the docstrings say what upstream does), so a change to the model shows here in milliseconds.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.core import nrt
from rdmaplane.core.pod import KINDS, parse_count
from rdmaplane.core.resources import DEFAULT, NONE, Amounts
from rdmaplane.services.scheduler.policy import (
    devicemanager,
    fit,
    nodestate,
    podrequest,
    topologymanager,
)
from tests.layouts import layout


def _v(gpus: int, hcas: int, shared: int) -> Amounts:
    """GPUs, exclusive HCAs and shared slots by the default names."""
    return Amounts({nrt.GPU: gpus, nrt.HCA: hcas, nrt.HCA_SHARED: shared})


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


def _gpus_nics(g: int, h: int) -> podrequest.PodRequest:
    return podrequest.PodRequest.of(_v(g, h, 0))


def _state(kind: str, policy: str, scope: str = "container") -> nodestate.NodeState:
    return nodestate.node_state(layout(kind, "n", policy=policy, scope=scope))


def test_pod_request_is_in_the_kubelets_order_with_the_effective_total() -> None:
    pod = _pod(
        {nrt.GPU: 2, nrt.HCA: 1},
        {nrt.GPU: 1, "cpu": 3},
        init=({nrt.GPU: 4}, {nrt.HCA_SHARED: 1, "restartPolicy": "Always"}, {nrt.HCA: 1}),
    )
    request = podrequest.pod_request(pod)
    assert [(s.kind, s.devices) for s in request.steps] == [
        ("init", _v(4, 0, 0)),
        ("sidecar", _v(0, 0, 1)),
        ("init", _v(0, 1, 0)),
        ("app", _v(2, 1, 0)),
        ("app", _v(1, 0, 0)),
    ]
    assert request.containers == (_v(0, 0, 1), _v(2, 1, 0), _v(1, 0, 0))
    assert request.init == (_v(4, 0, 0), _v(0, 1, 0))
    # apps + sidecars (3, 1, 1); the first init container alone (4, 0, 0); the second with the
    # sidecar started before it (0, 1, 1)
    assert request.total == _v(4, 1, 1)
    assert DEFAULT.wants_rdma(request.total)


def test_the_limit_counts_and_requests_must_equal_it() -> None:
    """The API server's rule (`rdmaplane.core.pod`): the request defaults to the limit, and a
    request that differs from it, or has none, is refused as the API server refuses it."""
    both = {"limits": {nrt.GPU: 2}, "requests": {nrt.GPU: "2"}}
    assert podrequest.pod_request({"spec": {"containers": [{"resources": both}]}}).total == _v(
        2, 0, 0
    )
    assert parse_count("2k") == 2000


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
        (
            {
                "spec": {
                    "containers": [
                        {"resources": {"limits": {nrt.GPU: 2}, "requests": {nrt.GPU: "1"}}}
                    ]
                }
            },
            "Pod.spec.containers[0].resources.requests[nvidia.com/gpu]",
        ),
        (
            {"spec": {"initContainers": [{"resources": {"requests": {nrt.HCA: "1"}}}]}},
            "Pod.spec.initContainers[0].resources.requests[rdmaplane.io/hca]",
        ),
    ],
)
def test_bad_pods_name_the_field(pod: dict[str, object], field: str) -> None:
    with pytest.raises(podrequest.RequestError) as err:
        podrequest.pod_request(pod)
    assert str(err.value).startswith(field + ":")


def test_pass_through_pod() -> None:
    verdict = fit.evaluate(
        _state("hgx", "single-numa-node"), podrequest.pod_request(_pod({"cpu": 4}))
    )
    assert verdict == fit.PASS_THROUGH


def test_single_numa_node_cannot_take_eight_gpus_on_two_sockets() -> None:
    verdict = fit.evaluate(_state("hgx", "single-numa-node"), _gpus_nics(8, 8))
    assert not verdict.fits and verdict.unresolvable
    assert "single-numa-node" in verdict.reason
    restricted = fit.evaluate(_state("hgx", "restricted"), _gpus_nics(8, 8))
    assert restricted.alignment == "pcie"
    assert [(p.zones, p.preferred) for p in restricted.placements] == [((0, 1), True)]


def test_full_zone_is_resolvable_but_fails() -> None:
    placed = topologymanager.place_pod(_state("hgx", "single-numa-node"), _gpus_nics(3, 3))
    assert not isinstance(placed, devicemanager.Rejection)
    placed = topologymanager.place_pod(placed[1], _gpus_nics(3, 3))  # goes to node-1
    assert not isinstance(placed, devicemanager.Rejection)
    assert placed[0][0].zones == (1,)
    verdict = fit.evaluate(placed[1], _gpus_nics(2, 2))
    assert not verdict.fits and not verdict.unresolvable


def test_restricted_refuses_resources_that_need_different_widths() -> None:
    """1 GPU fits one zone, 5 NICs need two: the merged {0} is not preferred, because a merge
    is preferred only when every resource's hint is preferred and they are all equal
    (upstream `mergePermutation`). restricted refuses; best-effort admits on both zones."""
    refused = fit.evaluate(_state("hgx", "restricted"), _gpus_nics(1, 5))
    assert not refused.fits and refused.unresolvable
    admitted = fit.evaluate(_state("hgx", "best-effort"), _gpus_nics(1, 5))
    assert admitted.fits and admitted.alignment == "cross"
    assert [(p.zones, p.preferred) for p in admitted.placements] == [((0, 1), False)]


def test_dgx_four_and_four_is_preferred_on_two_zones() -> None:
    """GPUs and NICs two per zone on NUMA 1, 3, 5, 7: both need two zones, the same two."""
    verdict = fit.evaluate(_state("dgx-a100", "restricted"), _gpus_nics(4, 4))
    assert verdict.fits and verdict.alignment == "pcie"
    assert [(p.zones, p.preferred, p.spilled) for p in verdict.placements] == [((1, 3), True, ())]


def test_container_scope_places_containers_one_by_one() -> None:
    two = podrequest.pod_request(_pod({nrt.GPU: 4, nrt.HCA: 4}, {nrt.GPU: 4, nrt.HCA: 4}))
    verdict = fit.evaluate(_state("hgx", "single-numa-node", "container"), two)
    assert verdict.fits and [p.zones for p in verdict.placements] == [(0,), (1,)]
    assert not fit.evaluate(_state("hgx", "single-numa-node", "pod"), two).fits


def test_sidecars_are_admitted_before_app_containers() -> None:
    """The kubelet admits init containers and sidecars before apps: the sidecar's NICs take
    node-0, then the app's GPUs go to node-1 (apps first would strand the sidecar)."""
    pod = _pod({nrt.GPU: 3}, init=({nrt.GPU: 2, nrt.HCA: 2, "restartPolicy": "Always"},))
    state = nodestate.node_state(
        nrt.build(
            "n",
            [nrt.Device(nrt.GPU, z, f"r{z}{i}") for z in (0, 1) for i in range(4)]
            + [nrt.Device(nrt.HCA, 0, "r00"), nrt.Device(nrt.HCA, 0, "r01")],
            policy="single-numa-node",
        )
    )
    verdict = fit.evaluate(state, podrequest.pod_request(pod))
    assert verdict.fits
    assert [(p.kind, p.zones) for p in verdict.placements] == [("sidecar", (0,)), ("app", (1,))]


def test_init_container_spanning_both_zones_pins_later_containers_to_both() -> None:
    """A later container's hints must cover every NUMA zone of the devices it may reuse from
    init containers (upstream `generateDeviceTopologyHints` with `reusable`): after an init
    container took all 8 GPUs, a 1-GPU app container gets only the two-zone, not preferred
    hint, so restricted refuses the pod and best-effort admits it unaligned."""
    pod = podrequest.pod_request(_pod({nrt.GPU: 1}, init=({nrt.GPU: 8},)))
    assert not fit.evaluate(_state("hgx", "restricted"), pod).fits
    admitted = fit.evaluate(_state("hgx", "best-effort"), pod)
    assert admitted.fits
    app = admitted.placements[-1]
    assert (app.kind, app.zones, app.preferred) == ("app", (0, 1), False)
    assert not app.shared_taken and not any(h[nrt.GPU] for z in app.taken for h in z)  # reused


def test_shared_slots_span_the_pools_zones() -> None:
    """Every slot grants the whole pool, so the device plugin gives it the NUMA nodes of all
    pool HCAs and the NRT counts it in each: 16 slots, not 32."""
    state = _state("hgx-shared", "best-effort")
    assert [z.capacity[nrt.HCA_SHARED] for z in state.zones] == [16, 16]
    assert fit.evaluate(state, podrequest.PodRequest.of(_v(0, 0, 16))).fits
    assert not fit.evaluate(state, podrequest.PodRequest.of(_v(0, 0, 17))).fits
    placed = topologymanager.place_pod(state, podrequest.PodRequest.of(_v(0, 0, 5)))
    assert not isinstance(placed, devicemanager.Rejection)
    assert [z.free[nrt.HCA_SHARED] for z in placed[1].zones] == [11, 11]


def test_shared_slot_pairs_every_gpu_on_a_pool_root() -> None:
    verdict = fit.evaluate(
        _state("hgx-shared", "single-numa-node"), podrequest.PodRequest.of(_v(4, 0, 1))
    )
    assert verdict.fits and verdict.alignment == "pcie"


def test_policy_none_promises_no_alignment() -> None:
    verdict = fit.evaluate(_state("hgx", "none"), _gpus_nics(2, 2))
    assert verdict.fits and verdict.alignment == "cross"
    assert [p.zones for p in verdict.placements] == [()]
    aligned = fit.evaluate(_state("hgx", "single-numa-node"), _gpus_nics(2, 2))
    assert aligned.score > verdict.score


def test_nics_on_one_socket_score_below_paired_nodes() -> None:
    paired = fit.evaluate(_state("hgx", "best-effort"), _gpus_nics(8, 8))
    lopsided = fit.evaluate(_state("one-socket-nics", "best-effort"), _gpus_nics(8, 8))
    assert paired.alignment == "pcie" and lopsided.alignment == "cross"
    assert paired.score > lopsided.score


def test_packing_prefers_the_fragment_over_a_fresh_node() -> None:
    fresh = _state("hgx", "single-numa-node")
    placed = topologymanager.place_pod(fresh, _gpus_nics(3, 3))
    assert not isinstance(placed, devicemanager.Rejection)
    one = _gpus_nics(1, 1)
    assert fit.evaluate(placed[1], one).score > fit.evaluate(fresh, one).score


def test_pcie_beats_numa_only_alignment() -> None:
    # node-0 of a two-socket node: GPUs and NICs on different roots of the same NUMA zone
    devices = [nrt.Device(nrt.GPU, 0, "pci0000:15"), nrt.Device(nrt.HCA, 0, "pci0000:37")]
    numa_only = nodestate.node_state(nrt.build("n", devices, policy="single-numa-node"))
    paired = nodestate.node_state(
        nrt.build(
            "p",
            [nrt.Device(nrt.GPU, 0, "r"), nrt.Device(nrt.HCA, 0, "r")],
            policy="single-numa-node",
        )
    )
    a, b = fit.evaluate(numa_only, _gpus_nics(1, 1)), fit.evaluate(paired, _gpus_nics(1, 1))
    assert (a.alignment, b.alignment) == ("numa", "pcie")
    assert b.score > a.score


# ---- invariants over random nodes and pods -------------------------------------------------


@st.composite
def nodes(draw: st.DrawFn) -> nodestate.NodeState:
    devices = []
    zones = draw(st.integers(1, 4))
    for numa in range(zones):
        for r in range(draw(st.integers(0, 3))):
            root = f"pci0000:{numa}{r}"
            for resource in (nrt.GPU, nrt.HCA):
                for _ in range(draw(st.integers(0, 2))):
                    devices.append(nrt.Device(resource, numa, root, in_use=draw(st.booleans())))
        if draw(st.booleans()):  # a zone may also have no device at all
            devices.append(nrt.Device(nrt.GPU, numa, None, healthy=False))
    for _ in range(draw(st.integers(0, 3))):  # shared slots: each spans every zone
        used = draw(st.booleans())
        devices += [nrt.Device(nrt.HCA_SHARED, numa, in_use=used) for numa in range(zones)]
    topology = nrt.build(
        "n",
        devices,
        policy=draw(st.sampled_from(nrt.POLICIES)),
        scope=draw(st.sampled_from(nrt.SCOPES)),
        shared_pool_hcas=[
            nrt.PoolHca(nrt.HCA_SHARED, d.numa, d.pcie_root)
            for d in devices
            if d.resource == nrt.HCA
        ],
    )
    return nodestate.node_state(topology)


UNITS = (
    st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 2))
    .filter(lambda u: u != (0, 0, 0))
    .map(lambda u: _v(*u))
)
STEPS = st.lists(
    st.builds(podrequest.ContainerRequest, st.sampled_from(KINDS), UNITS), min_size=1, max_size=3
)


def _request(steps: list[podrequest.ContainerRequest]) -> podrequest.PodRequest:
    total = NONE
    for s in steps:
        total = total | s.devices
    return podrequest.PodRequest(tuple(steps), total)


@settings(max_examples=300, deadline=None)
@given(nodes(), STEPS)
def test_placements_take_only_free_devices_and_give_them_all_back(
    state: nodestate.NodeState, steps: list[podrequest.ContainerRequest]
) -> None:
    placed = topologymanager.place_pod(state, _request(steps))
    if isinstance(placed, devicemanager.Rejection):
        return
    placements, after = placed
    for zone in after.zones:
        assert min(zone.free.values(), default=0) >= 0
        assert all(min(r.free.values(), default=0) >= 0 for r in zone.roots)
    for p, step in zip(placements, steps, strict=True):  # each container got what it asked for
        got = p.shared_taken + p.shared_reused
        for z in p.devices:
            for held in z:
                got = got + held
        assert got == step.devices
        if state.policy == "single-numa-node":
            assert len(p.zones) == 1 or len(p.zones) == len(state.zones)
    back = after
    for p in placements:
        back = devicemanager.release(back, p)
    assert back == state


@settings(max_examples=200, deadline=None)
@given(nodes(), UNITS)
def test_score_in_range_and_failures_explain(state: nodestate.NodeState, unit: Amounts) -> None:
    verdict = fit.evaluate(state, podrequest.PodRequest.of(unit))
    assert 0 <= verdict.score <= 10
    assert verdict.reason
    if verdict.unresolvable:  # nothing freed would help: it fails on the empty node too
        assert not fit.evaluate(state.fresh(), podrequest.PodRequest.of(unit)).fits


@settings(max_examples=200, deadline=None)
@given(nodes(), UNITS)
def test_an_admitted_preferred_unit_inside_one_zone_is_numa_aligned(
    state: nodestate.NodeState, unit: Amounts
) -> None:
    state = replace(state, policy="single-numa-node")
    verdict = fit.evaluate(state, podrequest.PodRequest.of(unit))
    if verdict.fits and len(state.zones) > 1:
        (p,) = verdict.placements
        assert p.aligned and len(p.zones) == 1 and p.numa_pairs == p.needed


def test_a_resource_named_with_zero_spoils_a_two_zone_merge() -> None:
    """Upstream hints a device resource named with a count of 0 too (one-zone sets preferred),
    so 8 GPUs with `rdmaplane.io/hca: "0"` have no preferred merge: restricted refuses."""
    zero = podrequest.pod_request(_pod({nrt.GPU: 8, nrt.HCA: 0}))
    assert zero.steps[0].zero == (nrt.HCA,) and zero.zero == (nrt.HCA,)
    assert fit.evaluate(
        _state("hgx", "restricted"), podrequest.pod_request(_pod({nrt.GPU: 8}))
    ).fits
    assert not fit.evaluate(_state("hgx", "restricted"), zero).fits
    assert fit.evaluate(_state("hgx", "best-effort"), zero).fits


def _all_unhealthy(state: nodestate.NodeState, r: str) -> nodestate.NodeState:
    """Every device of resource r still registered (the NRT's capacity), none healthy."""

    def sick(z: nodestate.ZoneState) -> nodestate.ZoneState:
        return replace(
            z,
            capacity=Amounts({**z.capacity, r: 0}),
            free=Amounts({**z.free, r: 0}),
            installed=z.registered,
        )

    return replace(state, zones=tuple(sick(z) for z in state.zones))


@pytest.mark.parametrize("policy", ["none", "best-effort", "single-numa-node"])
def test_naming_a_resource_with_no_healthy_device_is_refused_even_with_zero(policy: str) -> None:
    """devicemanager `devicesToAllocate` checks health before the count: a container naming
    `rdmaplane.io/hca: "0"` is refused where every HCA is registered but unhealthy (as a shared
    pool's slots on a node in exclusive RDMA netns mode), and a pod naming nothing else is no
    pass-through."""
    state = _all_unhealthy(_state("hgx", policy), nrt.HCA)
    zero_only = fit.evaluate(state, podrequest.pod_request(_pod({nrt.HCA: 0})))
    assert not zero_only.fits and "no healthy rdmaplane.io/hca " in zero_only.reason
    with_gpus = fit.evaluate(state, podrequest.pod_request(_pod({nrt.GPU: 2, nrt.HCA: 0})))
    assert not with_gpus.fits and "no healthy rdmaplane.io/hca " in with_gpus.reason
    assert fit.evaluate(state, podrequest.pod_request(_pod({nrt.GPU: 2}))).fits
    healthy = _state("hgx", policy)
    assert fit.evaluate(healthy, podrequest.pod_request(_pod({nrt.HCA: 0}))) == fit.PASS_THROUGH


def test_a_gb300_pairs_each_gpu_with_its_connectx8_by_the_data_direct_root() -> None:
    """The extender's PCIe score reads the NRT's PCIe-root zones: a ConnectX-8 sits in the
    zone of its Data Direct function's root, the GPU's, though its own function is elsewhere."""
    from rdmaplane.adapters.discovery.samples import read_sample

    topo = read_sample("gb300-cx8")
    state = nodestate.node_state(
        nrt.build("gb300", nrt.devices_from_topology(topo), policy="single-numa-node")
    )
    verdict = fit.evaluate(state, _gpus_nics(2, 2))
    assert verdict.fits and verdict.alignment == "pcie"
    own_roots = [
        nrt.Device(d.resource, d.numa, h.pci.root if h is not None and h.pci else d.pcie_root)
        for d, h in zip(
            nrt.devices_from_topology(topo),
            [None] * len(topo.gpus) + [topo.hca(f"mlx5_{k}") for k in range(4)],
            strict=True,
        )
    ]  # the same node paired by each NIC's own function: NUMA pairs only
    own = nodestate.node_state(nrt.build("own", own_roots, policy="single-numa-node"))
    by_own = fit.evaluate(own, _gpus_nics(2, 2))
    assert by_own.alignment == "numa" and verdict.score > by_own.score
