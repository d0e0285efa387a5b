"""The extender's decider without HTTP: a prioritize call answers from the view of the filter
call it follows (`Decisions.last`), and only for that pod and those nodes."""

from __future__ import annotations

from typing import Any

from rdmaplane.core import nrt
from rdmaplane.core.settings.scheduler import FabricScoring
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.decisions import Decisions
from tests.scheduler_helpers import node, pod

NODES = ["n1", "n2"]


def _one_gpu_nodes() -> ClusterCache:
    """Two nodes with one GPU and one HCA each, under one PCIe root."""
    cache = ClusterCache()
    devices = [nrt.Device(nrt.GPU, 0, "r"), nrt.Device(nrt.HCA, 0, "r")]
    cache.replace("nrt", [nrt.to_object(nrt.build(n, devices)) for n in NODES])
    cache.replace("node", [node(n) for n in NODES])
    cache.replace("pod", [])
    return cache


def _asking(name: str) -> dict[str, Any]:
    asked = pod(name, 1, 1)
    asked["metadata"]["uid"] = f"uid-{name}"
    return asked


def _fits(decide: Decisions, asked: dict[str, Any], names: list[str]) -> list[bool]:
    return [v.fits for v in decide.prioritize(asked, names).verdicts]


def test_prioritize_answers_from_the_filter_it_follows() -> None:
    cache = _one_gpu_nodes()
    decide = Decisions(cache, FabricScoring())
    asked = _asking("a")
    assert decide.filter(asked, NODES).passed == NODES
    assert decide.last is not None and decide.last.passed == NODES
    # a bind the watch delivers between the two calls: kube-scheduler scores on its snapshot
    cache.apply("pod", "ADDED", pod("other", 1, 1, node="n1"))
    assert _fits(decide, asked, NODES) == [True, True]
    # another pod, or other nodes, is decided on the cache as it is now
    assert _fits(decide, _asking("b"), NODES) == [False, True]
    assert _fits(decide, asked, ["n1"]) == [False]


def test_a_filter_that_cannot_be_remembered_leaves_nothing_behind() -> None:
    cache = _one_gpu_nodes()
    decide = Decisions(cache, FabricScoring())
    decide.filter(_asking("a"), NODES)
    without_uid = pod("c", 1, 1)  # as `rdmaplane explain-placement` reads a file
    decide.filter(without_uid, NODES)
    assert decide.last is None
    cache.apply("pod", "ADDED", pod("other", 1, 1, node="n1"))
    assert _fits(decide, _asking("a"), NODES) == [False, True]
