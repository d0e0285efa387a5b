"""Upstream behaviours of the kubelet's Topology Manager and device manager, each by name.

Each one was found by the differential tests as a difference between the extender's earlier
model and the kubelet, and is reproduced here on the kubelet's own code (v1.37.2, the Go
harness) with the prediction checked against it (`differential.judge` finds no disagreement).
The source they come from is k8s.io/kubernetes pkg/kubelet/cm/{topologymanager,devicemanager}.
"""

from __future__ import annotations

from tests.kubelet.differential import Container, Outcome, PodShape, judge
from tests.kubelet.harness import GPU, HCA, KubeletHarness, SampleNode


def _app(gpus: int = 0, hcas: int = 0, shared: int = 0) -> PodShape:
    return PodShape((Container("app", gpus, hcas, shared),))


def _admit(h: KubeletHarness, shape: PodShape) -> Outcome:
    outcome = judge(h, shape, f"p{len(h.admissions)}")
    assert not outcome.disagreements, outcome.disagreements
    return outcome


def _numa(h: KubeletHarness, ids: tuple[str, ...] | frozenset[str]) -> list[int]:
    return sorted(n for i in ids for n in h.facts[i].numa)


def test_merge_is_preferred_only_when_all_resources_want_the_same_zones(
    nodes: dict[str, SampleNode],
) -> None:
    """policy.go `mergePermutation`: 1 GPU fits node 0, 5 NICs need nodes 0+1; the merged {0}
    is not preferred, so restricted refuses (TopologyAffinityError) and best-effort admits on
    the wider {0,1}, the largest of the resources' narrowest widths."""
    with KubeletHarness(nodes["hgx-h100-roce"], "restricted", "container") as h:
        refused = _admit(h, _app(gpus=1, hcas=5))
        assert refused.admission.reason == "TopologyAffinityError"
    with KubeletHarness(nodes["hgx-h100-roce"], "best-effort", "container") as h:
        admitted = _admit(h, _app(gpus=1, hcas=5)).admission
        assert (admitted.containers[0].affinity, admitted.containers[0].preferred) == (
            (0, 1),
            False,
        )


def test_best_effort_takes_every_aligned_device_then_spills(nodes: dict[str, SampleNode]) -> None:
    """GPUs free only on node 1, NICs only on node 0: the merged hints {0} and {1} are equally
    narrow (not preferred) and the lower wins; the device manager takes what the affinity holds
    (no GPU) and then asks the GPU plugin for the rest from anywhere."""
    with KubeletHarness(nodes["hgx-h100-roce"], "best-effort", "container") as h:
        _admit(h, _app(hcas=4))  # node 0's NICs
        second = _admit(h, _app(hcas=4)).admission  # node 1's
        h.delete(h.admissions[next(iter(h.admissions))].uid)  # node 0's NICs free again
        _admit(h, _app(gpus=4))  # node 0's GPUs
        assert _numa(h, second.devices(HCA)) == [1] * 4
        spilled = _admit(h, _app(gpus=1, hcas=1))
        got = spilled.admission.containers[0]
        assert (got.affinity, got.preferred) == ((0,), False)
        assert _numa(h, got.devices[GPU]) == [1] and _numa(h, got.devices[HCA]) == [0]
        assert spilled.verdict.alignment == "cross"


def test_later_containers_must_cover_the_zones_of_reusable_init_devices(
    nodes: dict[str, SampleNode],
) -> None:
    """devicemanager `generateDeviceTopologyHints` with `reusable`: an init container's devices
    go to the pod's later containers first, and their hints must hold every one of them. After
    an init container took all 8 GPUs, a 1-GPU app container gets only {0,1}, not preferred:
    restricted refuses the pod; best-effort admits it, the GPU being one of the init's."""
    shape = PodShape((Container("init", gpus=8), Container("app", gpus=1)))
    with KubeletHarness(nodes["hgx-h100-roce"], "restricted", "container") as h:
        assert _admit(h, shape).admission.reason == "TopologyAffinityError"
    with KubeletHarness(nodes["hgx-h100-roce"], "best-effort", "container") as h:
        admitted = _admit(h, shape).admission
        init, app = admitted.containers[0], admitted.containers[1]
        assert (app.affinity, app.preferred) == ((0, 1), False)
        assert set(app.devices[GPU]) <= set(init.devices[GPU])
        assert len(admitted.devices(GPU)) == 8  # the init container's GPUs stay the pod's


def test_sidecars_and_init_containers_are_admitted_before_apps(
    nodes: dict[str, SampleNode],
) -> None:
    """topologymanager scope_container: `append(InitContainers, Containers...)`. On the L40S
    server (both NICs on node 0) the sidecar's GPUs+NICs take node 0 first, the app's 3 GPUs
    then go to node 1; apps first would have left the sidecar no NIC zone."""
    shape = PodShape((Container("sidecar", 2, 2, 1), Container("app", gpus=3)))
    with KubeletHarness(nodes["pcie-l40s-split"], "single-numa-node", "container") as h:
        admitted = _admit(h, shape).admission
        assert admitted.admitted
        assert [c.affinity for c in admitted.containers] == [(0,), (1,)]


def test_a_shared_slot_is_on_every_numa_node_of_its_pool(nodes: dict[str, SampleNode]) -> None:
    """A slot of the shared pool carries every pool HCA's NUMA node; the device manager counts
    it in each hint that touches one of them, and the NRT in each zone: 4 slots, not 8."""
    with KubeletHarness(nodes["hgx-h100-roce"], "best-effort", "container", shared_slots=4) as h:
        assert _admit(h, _app(shared=2)).admission.admitted
        assert _admit(h, _app(shared=2)).admission.admitted
        refused = _admit(h, _app(shared=1)).admission
        assert refused.reason == "UnexpectedAdmissionError"
        assert [z.available("rdmaplane.io/hca-shared") for z in h.published().numa_zones()] == [
            0,
            0,
        ]


def test_pod_scope_gives_every_container_the_pods_hint(nodes: dict[str, SampleNode]) -> None:
    """scope_pod: one hint from the pod's effective request, set on every container: two
    containers of 2 GPUs + 2 NICs share node 0; 3 + 2 GPUs fit no single zone together, though
    each container alone would."""
    two = PodShape((Container("app", 2, 2), Container("app", 2, 2)))
    with KubeletHarness(nodes["hgx-h200-ib"], "single-numa-node", "pod") as h:
        admitted = _admit(h, two).admission
        assert [c.affinity for c in admitted.containers] == [(0,), (0,)]
        five = _admit(h, PodShape((Container("app", 3, 3), Container("app", 2))))
        assert five.admission.reason == "TopologyAffinityError"  # 5 GPUs: no single zone
        assert len(h.active) == 1


def test_policy_none_gives_no_affinity(nodes: dict[str, SampleNode]) -> None:
    """The none policy's scope stores no hint: every device comes from the plugins' choice."""
    with KubeletHarness(nodes["dgx-a100"], "none", "container") as h:
        admitted = _admit(h, _app(gpus=2, hcas=2))
        assert (
            admitted.admission.containers[0].affinity,
            admitted.admission.containers[0].preferred,
        ) == (None, False)
        assert admitted.verdict.alignment == "cross"  # nothing promised


def test_devices_without_a_numa_node_are_no_preference(nodes: dict[str, SampleNode]) -> None:
    """devicemanager `deviceHasTopologyAlignment`: with no device reporting a NUMA node the
    resource gets a nil hint ("any", preferred); restricted then admits the hint and only the
    allocation fails (UnexpectedAdmissionError, not TopologyAffinityError). The NRT publishes
    such devices in node-0, so the extender refuses the same pod as short of GPUs."""
    with KubeletHarness(nodes["degraded"], "restricted", "container") as h:
        refused = _admit(h, _app(gpus=5)).admission
        assert refused.reason == "UnexpectedAdmissionError"
        assert "requested number of devices unavailable for nvidia.com/gpu" in refused.message


def test_a_resource_named_with_zero_still_gets_hints(nodes: dict[str, SampleNode]) -> None:
    """devicemanager `getContainerDeviceRequest` keeps every device resource in the limits,
    0 included, and hints it: every set of its zones, the one-zone sets preferred. 8 GPUs need
    both zones (preferred); `rdmaplane.io/hca: "0"` next to them makes that merge not preferred,
    so restricted refuses what it admits without the zero."""
    with KubeletHarness(nodes["hgx-h100-roce"], "restricted", "container") as h:
        plain = _admit(h, _app(gpus=8))
        assert plain.admission.admitted
        h.delete(plain.admission.uid)
        zero = _admit(h, PodShape((Container("app", gpus=8, zeros=True),)))
        assert zero.admission.reason == "TopologyAffinityError"
