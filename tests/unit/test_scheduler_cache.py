"""The watch-fed cache: bound pods the agent has not accounted for yet, deletions, relists,
bad objects and node readiness."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.core import nrt
from rdmaplane.services.scheduler import cache as cache_module
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.policy import fit, podrequest
from tests.layouts import layout
from tests.scheduler_helpers import node, pod


def _cache(*topologies: nrt.NodeResourceTopology) -> ClusterCache:
    cache = ClusterCache()
    cache.replace("nrt", [nrt.to_object(t) for t in topologies])
    cache.replace("node", [node(t.name) for t in topologies])
    cache.replace("pod", [])
    return cache


def _decide(cache: ClusterCache, name: str, gpus: int, hcas: int) -> fit.Verdict:
    request = podrequest.pod_request(pod("x", gpus, hcas))
    return cache.verdict(name, request)


def test_two_pods_in_a_row_do_not_take_the_same_zone() -> None:
    cache = _cache(layout("hgx", "n1", policy="single-numa-node"))
    first = _decide(cache, "n1", 4, 4)
    assert first.fits and first.placements[0].zones == (0,)
    cache.apply("pod", "ADDED", pod("a", 4, 4, node="n1"))
    second = _decide(cache, "n1", 4, 4)
    assert second.fits and second.placements[0].zones == (1,)
    cache.apply("pod", "ADDED", pod("b", 4, 4, node="n1"))
    third = _decide(cache, "n1", 1, 1)
    assert not third.fits and not third.unresolvable
    assert cache.entry("n1").unaccounted == ("default/a", "default/b")  # type: ignore[union-attr]
    cache.apply("pod", "DELETED", pod("a", 4, 4, node="n1"))
    assert _decide(cache, "n1", 4, 4).fits


def test_accounted_pods_are_not_subtracted_twice() -> None:
    devices = [nrt.Device(nrt.GPU, 0, "r", in_use=True), nrt.Device(nrt.HCA, 0, "r", in_use=True)]
    devices += [nrt.Device(nrt.GPU, 0, "s"), nrt.Device(nrt.HCA, 0, "s")]
    cache = _cache(
        nrt.build("n1", devices, policy="single-numa-node", accounted_pods=["default/a"])
    )
    cache.apply("pod", "ADDED", pod("a", 1, 1, node="n1"))
    assert _decide(cache, "n1", 1, 1).fits
    cache.apply("pod", "ADDED", pod("b", 1, 1, node="n1"))
    assert not _decide(cache, "n1", 1, 1).fits


def test_finished_pods_and_relists_release_devices() -> None:
    cache = _cache(layout("hgx", "n1", policy="single-numa-node"))
    cache.apply("pod", "ADDED", pod("a", 4, 4, node="n1"))
    cache.apply("pod", "ADDED", pod("b", 4, 4, node="n1"))
    assert not _decide(cache, "n1", 1, 1).fits
    done = pod("a", 4, 4, node="n1")
    done["status"]["phase"] = "Succeeded"
    cache.apply("pod", "MODIFIED", done)
    assert _decide(cache, "n1", 4, 4).fits
    cache.replace("pod", [])
    assert cache.entry("n1").unaccounted == ()  # type: ignore[union-attr]


def test_missing_and_malformed_topology_fail_rdma_pods_only() -> None:
    cache = _cache(layout("hgx", "n1"))
    broken = nrt.to_object(layout("hgx", "n2"))
    broken["zones"][0]["resources"][0]["available"] = "lots"
    cache.apply("nrt", "ADDED", broken)
    missing = _decide(cache, "n3", 1, 1)
    assert not missing.fits and missing.unresolvable
    assert missing.reason == "no NodeResourceTopology published for this node"
    bad = _decide(cache, "n2", 1, 1)
    assert not bad.fits and "zones[0].resources[0].available" in bad.reason
    gpu_only = _decide(cache, "n3", 1, 0)
    assert gpu_only.fits and gpu_only.score == 0
    cache.replace("nrt", [])
    assert cache.entry("n1") is None


def test_rdma_not_ready_fails_rdma_pods() -> None:
    cache = _cache(layout("hgx", "n1"))
    cache.apply("node", "MODIFIED", node("n1", "False", "mlx5_3 port 1 DOWN"))
    verdict = _decide(cache, "n1", 1, 1)
    assert not verdict.fits and verdict.reason == "RDMAReady=False: mlx5_3 port 1 DOWN"
    assert _decide(cache, "n1", 1, 0).fits
    cache.apply("node", "MODIFIED", node("n1", "True"))
    assert _decide(cache, "n1", 1, 1).fits


def test_identical_nodes_share_one_state() -> None:
    cache = _cache(layout("hgx", "n1"), layout("hgx", "n2"), layout("dgx-a100", "n3"))
    sids = {name: cache.entry(name).sid for name in ("n1", "n2", "n3")}  # type: ignore[union-attr]
    assert sids["n1"] == sids["n2"] != sids["n3"]
    assert cache.ready


def test_dead_states_are_dropped_and_decisions_stay_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "MIN_STATES", 4)
    cache = _cache(layout("hgx", "n1", policy="single-numa-node"), layout("hgx", "n2"))
    for i in range(20):  # every bind and delete makes a new state for n1
        cache.apply("pod", "ADDED", pod(f"p{i}", 1, 1, node="n1"))
        assert _decide(cache, "n1", 4, 4).fits == (i < 4)
        if i >= 4:
            cache.apply("pod", "DELETED", pod(f"p{i}", 1, 1, node="n1"))
    assert len(cache._states) <= 8
    assert _decide(cache, "n2", 8, 8).fits


_EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["bind", "finish", "delete"]),
        st.integers(0, 7),  # the pod
        st.sampled_from(["n1", "n2"]),
        st.integers(0, 9),  # its creation second
        st.sampled_from([(1, 1), (2, 2), (4, 4), (1, 0), (3, 5)]),
    ),
    max_size=30,
)


def _pod_change(
    cache: ClusterCache,
    pods: dict[str, dict[str, Any]],
    action: str,
    name: str,
    where: str,
    devices: tuple[int, int],
    second: int | None = None,
) -> None:
    """Bind (or update), finish or delete pod `name` in `cache`, keeping `pods` the same."""
    if action == "delete":
        if pods.pop(name, None) is not None:
            cache.apply("pod", "DELETED", pod(name))
        return
    obj = pods.get(name) or pod(name, *devices, node=where)
    if second is not None:
        obj["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:{second:02d}Z"
    if action == "finish":
        obj["status"]["phase"] = "Succeeded"
    pods[name] = obj
    cache.apply("pod", "MODIFIED", obj)


@settings(max_examples=150, deadline=None)
@given(_EVENTS)
def test_pods_subtracted_one_by_one_equal_a_rebuild(events: list[Any]) -> None:
    """Binding pods one after the other (the latest subtracted from the node as it is) ends in
    the same node states as a cache that lists the same pods at once, whatever the order."""
    topologies = (layout("hgx", "n1", policy="single-numa-node"), layout("dgx-a100", "n2"))
    live = _cache(*topologies)
    pods: dict[str, dict[str, Any]] = {}
    for action, i, where, second, (gpus, hcas) in events:
        _pod_change(live, pods, action, f"p{i}", where, (gpus, hcas), second)
    listed = _cache(*topologies)
    listed.replace("pod", list(pods.values()))
    for name in ("n1", "n2"):
        got, want = live.entry(name), listed.entry(name)
        assert got is not None and want is not None
        assert (got.state, got.unaccounted) == (want.state, want.unaccounted)


_NAMES = ("n1", "n2", "n3")  # n3: a node that may have no NRT
_CHANGES = st.lists(
    st.one_of(
        st.tuples(st.just("pod"), st.sampled_from(["bind", "finish", "delete"]), st.integers(0, 5),
                  st.sampled_from(_NAMES), st.sampled_from([(1, 1), (2, 2), (4, 4), (1, 0)])),
        st.tuples(st.just("ready"), st.sampled_from(_NAMES), st.booleans()),
        st.tuples(st.just("nrt"), st.sampled_from(_NAMES),
                  st.sampled_from(["hgx", "dgx-a100", "malformed", "deleted"])),
    ),
    max_size=25,
)  # fmt: skip
_ASKED = [podrequest.pod_request(pod("x", g, h)) for g, h in ((1, 1), (2, 2), (8, 8), (2, 0))]


def _nrt_object(name: str, kind: str) -> dict[str, Any]:
    obj = nrt.to_object(layout("dgx-a100" if kind == "dgx-a100" else "hgx", name))
    if kind == "malformed":
        obj["zones"][0]["resources"][0]["available"] = "lots"
    return obj


@settings(max_examples=150, deadline=None)
@given(_CHANGES)
def test_the_verdicts_asked_between_changes_are_those_of_a_fresh_cache(changes: list[Any]) -> None:
    """The request path's memo (decisions by node state) follows every change of a node's pods,
    NRT and readiness: asked after each change, the live cache answers as one that lists the
    end state at once."""
    live = ClusterCache()
    nrts = {n: _nrt_object(n, "hgx") for n in _NAMES[:2]}
    nodes = {n: node(n) for n in _NAMES}
    pods: dict[str, dict[str, Any]] = {}
    live.replace("nrt", list(nrts.values()))
    live.replace("node", list(nodes.values()))
    live.replace("pod", [])
    for change in changes:
        if change[0] == "pod":
            _, action, i, where, devices = change
            _pod_change(live, pods, action, f"p{i}", where, devices)
        elif change[0] == "ready":
            _, where, ready = change
            nodes[where] = node(where, "True" if ready else "False", "port down")
            live.apply("node", "MODIFIED", nodes[where])
        elif change[2] == "deleted":
            if nrts.pop(change[1], None) is not None:
                live.apply("nrt", "DELETED", {"metadata": {"name": change[1]}})
        else:
            nrts[change[1]] = _nrt_object(change[1], change[2])
            live.apply("nrt", "MODIFIED", nrts[change[1]])
        for request in _ASKED:
            live.verdicts([*_NAMES, "unknown"], request)
    fresh = ClusterCache()
    fresh.replace("nrt", list(nrts.values()))
    fresh.replace("node", list(nodes.values()))
    fresh.replace("pod", list(pods.values()))
    for request in _ASKED:
        names = [*_NAMES, "unknown"]
        assert list(live.verdicts(names, request)) == list(fresh.verdicts(names, request))
