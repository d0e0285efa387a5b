"""`RDMAPLANE_RAILS`, judged by the kubelet's own allocation: the rails the device plugin tells a
container are the rails of the NICs the kubelet's device manager gave it, in the order of
`RDMAPLANE_HCAS`, and (one NIC per PCIe root) the rails the extender predicted for the pod."""

from __future__ import annotations

from typing import Any

import pytest

from rdmaplane.core import nrt
from rdmaplane.core.nccl import HCAS_ENV, RAILS_ENV
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.policy import podrequest
from tests.kubelet.differential import Container, PodShape
from tests.kubelet.harness import HCA, ContainerAdmission, KubeletHarness, SampleNode

SHAPES = [  # filled in this order until the node refuses: every NIC handed out once
    PodShape((Container("app", 2, 2),)),
    PodShape((Container("app", 1, 1), Container("app", 1, 1))),
    PodShape((Container("app", 4, 4),)),
    PodShape((Container("init", 1, 1), Container("app", 1, 1))),
    PodShape((Container("app", 1),)),  # GPUs only: no NIC, no rails
]


def _cache(h: KubeletHarness) -> ClusterCache:
    """The extender's view of the node: the NRT its agent would publish now, rails included."""
    cache = ClusterCache()
    cache.replace("node", [{"metadata": {"name": h.name}}])
    cache.replace("nrt", [nrt.to_object(h.published(h.rail_uplinks()))])
    cache.replace("pod", [])
    return cache


def _told(h: KubeletHarness, c: ContainerAdmission) -> None:
    """The container's env names each of its NICs' rails, in `RDMAPLANE_HCAS`'s order."""
    held = c.devices.get(HCA, ())
    if not held:
        assert RAILS_ENV not in c.env, c
        return
    rails = [int(r) for r in c.env[RAILS_ENV].split(",")]
    rail = nrt.rail_by_hca(h.rail_uplinks())
    assert rails == [rail[x] for x in c.env[HCAS_ENV].split(",")]
    assert frozenset(rails) == h.rails_of(held), c


@pytest.mark.parametrize("sample", ["hgx-h100-roce", "dgx-a100"])
def test_each_container_is_told_the_rails_of_the_nics_the_kubelet_gave_it(
    nodes: dict[str, SampleNode], sample: str
) -> None:
    exact = sample == "hgx-h100-roce"  # one NIC per PCIe root: the extender's prediction is exact
    with KubeletHarness(nodes[sample], "best-effort", "container") as h:
        told = 0
        for k in range(12):
            body: dict[str, Any] = SHAPES[k % len(SHAPES)].manifest(f"p{k}")
            cache = _cache(h)
            predicted = cache.rails_at(h.name, cache.verdict(h.name, podrequest.pod_request(body)))
            admission = h.admit(body)
            if not admission.admitted:
                break
            for c in admission.containers:
                _told(h, c)
                told += bool(c.devices.get(HCA))
            if exact:
                assert predicted == h.rails(admission), (k, predicted)
        assert told >= 4 and h.rails_of(h.facts) == frozenset(range(len(h.rail_uplinks())))


def test_a_shared_slot_names_the_rails_of_every_nic_of_the_pool(
    nodes: dict[str, SampleNode],
) -> None:
    with KubeletHarness(nodes["hgx-h100-roce"], "best-effort", "container") as h:
        admission = h.admit(PodShape((Container("app", 1, 0, 1),)).manifest("kv"))
        assert admission.admitted
        env = admission.containers[0].env
        rail = nrt.rail_by_hca(h.rail_uplinks())
        assert env[RAILS_ENV] == ",".join(str(rail[x]) for x in env[HCAS_ENV].split(","))
        assert len(env[RAILS_ENV].split(",")) == len(rail) == 8
