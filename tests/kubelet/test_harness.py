"""The harness itself: real plugins registered, requests answered, pods admitted and ended."""

from __future__ import annotations

import pytest

from tests.kubelet.differential import Container, PodShape
from tests.kubelet.harness import GPU, HCA, HCA_SHARED, HarnessError, KubeletHarness, SampleNode


def _pod(gpus: int = 0, hcas: int = 0, shared: int = 0) -> dict[str, object]:
    return PodShape((Container("app", gpus, hcas, shared),)).manifest("p")


def test_real_plugins_register_with_the_samples_devices(nodes: dict[str, SampleNode]) -> None:
    with KubeletHarness(nodes["dgx-a100"], "single-numa-node", "container") as h:
        by_resource: dict[str, list[tuple[int, ...]]] = {}
        for fact in h.facts.values():
            by_resource.setdefault(fact.resource, []).append(fact.numa)
        # start() has already checked that the device manager holds these NUMA nodes
        assert sorted(by_resource[GPU]) == [(n,) for n in (1, 1, 3, 3, 5, 5, 7, 7)]
        assert sorted(by_resource[HCA]) == [(n,) for n in (1, 1, 3, 3, 5, 5, 7, 7)]
        assert by_resource[HCA_SHARED] == [(1, 3, 5, 7)] * 4  # a slot grants the whole pool


def test_a_bad_request_is_answered_and_the_harness_carries_on(
    nodes: dict[str, SampleNode],
) -> None:
    with KubeletHarness(nodes["workstation"], "best-effort", "pod") as h:
        with pytest.raises(HarnessError, match='unknown op "resize"'):
            h.request({"op": "resize"})
        with pytest.raises(HarnessError, match="no active pod with uid nope"):
            h.request({"op": "delete", "uid": "nope"})
        assert h.admit(_pod(gpus=1)).admitted


def test_an_ended_pod_gives_its_devices_back(nodes: dict[str, SampleNode]) -> None:
    with KubeletHarness(nodes["hgx-h100-roce"], "single-numa-node", "container") as h:
        first = h.admit(_pod(gpus=4, hcas=4))
        second = h.admit(_pod(gpus=4, hcas=4))
        assert first.admitted and second.admitted
        assert first.containers[0].affinity != second.containers[0].affinity
        refused = h.admit(_pod(gpus=1))
        assert not refused.admitted and refused.reason == "TopologyAffinityError"
        h.delete(first.uid)
        again = h.admit(_pod(gpus=4, hcas=4))
        assert again.admitted
        assert again.devices(GPU) == first.devices(GPU)  # the only free ones
        assert h.published().numa_zones()[0].available(GPU) == 0
