"""Whether the kubelet follows GetPreferredAllocation, and what that means for GPU-NIC pairing.

The device manager allocates each resource of a container on its own (devicemanager
`allocateContainerResources`, one resource after the other in Go map order) and asks each
resource's plugin for a preference within the NUMA affinity. No plugin sees what another one
was given. So with device plugins the kubelet can guarantee NUMA alignment (the Topology
Manager's affinity) but not that a GPU and a NIC share a PCIe root: that happens only when the
two plugins' independent preferences happen to agree. These tests show it on the kubelet's
own code (HGX H100: GPU i and NIC i share PCIe root i; node 0 holds roots 0-3).
"""

from __future__ import annotations

from tests.kubelet.differential import Container, PodShape
from tests.kubelet.harness import GPU, HCA, Admission, KubeletHarness, SampleNode


def _pod(gpus: int = 0, hcas: int = 0) -> dict[str, object]:
    return PodShape((Container("app", gpus, hcas),)).manifest("p")


def _roots(h: KubeletHarness, a: Admission, resource: str) -> list[str]:
    return sorted(h.facts[i].root or "" for i in a.devices(resource))


def _hca_preference(h: KubeletHarness, available: list[str], size: int) -> list[str]:
    """What rdmaplane's plugin answers GetPreferredAllocation with (its own resource manager)."""
    rdma = h.rdma
    assert rdma is not None
    exclusive = next(s for s in rdma.plugin.servers if s.resource_name == HCA)
    return sorted(exclusive.manager.preferred(available, [], size))


def _on_node0(h: KubeletHarness, resource: str) -> list[str]:
    return sorted(i for i, f in h.facts.items() if f.resource == resource and f.numa == (0,))


def test_each_plugins_preference_is_followed_on_its_own(nodes: dict[str, SampleNode]) -> None:
    """NICs: rdmaplane's plugin prefers those on roots 0 and 1 (the lowest IDs on node 0); GPUs:
    a plugin that prefers the highest indices gets GPUs 3 and 2. The kubelet takes both
    preferences as given: NUMA-aligned, and no GPU shares a root with a NIC."""
    with KubeletHarness(
        nodes["hgx-h100-roce"], "single-numa-node", "container", gpu_preference="reverse"
    ) as h:
        gpu = h.gpu
        assert gpu is not None
        got = h.admit(_pod(gpus=2, hcas=2))
        assert got.admitted and got.containers[0].affinity == (0,)
        (call,) = gpu.preferred_calls
        assert list(call.available) == _on_node0(h, GPU)  # the affinity's GPUs, nothing else
        assert set(call.answer) == got.devices(GPU)
        assert sorted(got.devices(HCA)) == _hca_preference(h, _on_node0(h, HCA), 2)
        gpu_roots, nic_roots = _roots(h, got, GPU), _roots(h, got, HCA)
        assert not set(gpu_roots) & set(nic_roots)


def test_agreeing_preferences_pair_only_by_coincidence(nodes: dict[str, SampleNode]) -> None:
    """With a GPU plugin that prefers the lowest indices, both plugins pick root 0 and 1 on an
    empty node: paired. Once a GPU-only pod holds GPU 0, the next GPU+NIC pod gets GPU 1 and
    NIC 0 (each plugin's first free device), though GPU 1 + NIC 1 share a root and were free."""
    with KubeletHarness(nodes["hgx-h100-roce"], "single-numa-node", "container") as h:
        first = h.admit(_pod(gpus=2, hcas=2))
        assert _roots(h, first, GPU) == _roots(h, first, HCA)
        h.delete(first.uid)
        h.admit(_pod(gpus=1))
        second = h.admit(_pod(gpus=1, hcas=1))
        assert second.admitted
        assert _roots(h, second, GPU) != _roots(h, second, HCA)


def test_not_asked_when_the_affinity_holds_exactly_enough(nodes: dict[str, SampleNode]) -> None:
    """devicesToAllocate calls GetPreferredAllocation only when the aligned devices outnumber
    the request; with exactly as many it takes them all without asking."""
    with KubeletHarness(nodes["hgx-h100-roce"], "single-numa-node", "container") as h:
        gpu = h.gpu
        assert gpu is not None
        assert h.admit(_pod(gpus=4, hcas=4)).admitted
        assert gpu.preferred_calls == []
        assert h.admit(_pod(gpus=3)).admitted  # node 1: 4 aligned for 3
        assert len(gpu.preferred_calls) == 1


def test_too_few_aligned_devices_are_completed_with_must_include(
    nodes: dict[str, SampleNode],
) -> None:
    """best-effort with an affinity that holds 1 of 2 GPUs: the device manager takes the aligned
    one, then asks for 2 out of every free GPU with that one as must-include."""
    with KubeletHarness(nodes["hgx-h100-roce"], "best-effort", "container") as h:
        gpu = h.gpu
        assert gpu is not None
        first = h.admit(_pod(hcas=4))  # node 0's NICs
        h.admit(_pod(hcas=4))  # node 1's
        h.delete(first.uid)
        h.admit(_pod(gpus=3))  # node 0: one GPU left
        calls = len(gpu.preferred_calls)
        got = h.admit(_pod(gpus=2, hcas=1))
        assert got.containers[0].affinity == (0,) and not got.containers[0].preferred
        call = gpu.preferred_calls[calls]
        assert len(call.must_include) == 1 and call.size == 2
        assert set(call.must_include) <= got.devices(GPU) == set(call.answer)


def test_without_a_preference_the_device_manager_picks_at_random(
    nodes: dict[str, SampleNode],
) -> None:
    """A plugin without GetPreferredAllocation gets whatever the device manager's set iteration
    (Go map order) yields: the same pod on the same free GPUs gets different ones."""
    with KubeletHarness(
        nodes["hgx-h100-roce"], "single-numa-node", "container", gpu_preference="none"
    ) as h:
        seen = set()
        for _ in range(20):
            got = h.admit(_pod(gpus=2))
            seen.add(frozenset(got.devices(GPU)))
            h.delete(got.uid)
        assert len(seen) > 1
