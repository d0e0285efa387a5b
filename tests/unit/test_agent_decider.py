"""The agent's decider without I/O: what a topology means for the pools and the ports in
service, and what the agent says when health or the pools' problems change."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rdmaplane.adapters.config.base import validate
from rdmaplane.core.model import NetnsMode, NodeTopology
from rdmaplane.core.poolplan import pool_gid_index
from rdmaplane.core.porthealth import Symptom
from rdmaplane.core.settings.deviceplugin import Pool
from rdmaplane.services.agent.policy.decider import (
    Announcement,
    PoolFacts,
    health_flip,
    pool_changes,
    pool_facts,
    ports_in_service,
)
from rdmaplane.services.agent.policy.health import HcaHealth, Transition
from rdmaplane.services.deviceplugin.manager import ResourceManager

POOLS = {
    "one exclusive": (Pool(),),
    "exclusive and shared": (Pool(), Pool(mode="shared", resource_name="rdma/shared")),
    "ib and roce": (
        validate(Pool, {"resourceName": "rdma/ib", "selectors": {"linkTypes": ["infiniband"]}}),
        validate(Pool, {"resourceName": "rdma/roce", "selectors": {"linkTypes": ["ethernet"]}}),
    ),
}


@pytest.mark.parametrize("pools", POOLS.values(), ids=POOLS.keys())
@pytest.mark.parametrize("exclusive", [False, True])
def test_pool_facts_are_what_the_pools_own_managers_make_of_the_node(
    sample_nodes: dict[str, NodeTopology], pools: tuple[Pool, ...], exclusive: bool
) -> None:
    """The agent no longer builds the plugin's resource managers to learn its pools' facts:
    the pure functions must agree with them on every sample node."""
    for topo in sample_nodes.values():
        if exclusive:
            topo = replace(topo, netns_mode=NetnsMode.EXCLUSIVE)
        managers = [ResourceManager(p, dev_root="/nonexistent") for p in pools]
        for m in managers:
            m.update(topo)
        members = {m.pool.resource_name: [h.name for h in m.members] for m in managers}
        facts = pool_facts(topo, pools)
        shared_members = [n for m in managers if m.shared for n in members[m.pool.resource_name]]
        blocked = topo.netns_mode is NetnsMode.EXCLUSIVE and bool(shared_members)
        assert (facts.netns_problem is not None) == blocked
        for name in shared_members:
            assert name in (facts.netns_problem or name)
        indexes = {i for p in pools if (i := pool_gid_index(topo, p))[0]}
        if len(indexes) == 1 and (index := next(iter(indexes))[1]) is not None:
            assert (facts.gid_index, facts.gid_problem) == (index, None)


def test_the_ports_in_service_are_the_pools_or_the_dra_drivers(
    sample_nodes: dict[str, NodeTopology],
) -> None:
    topo = sample_nodes["hgx-h100-roce"]
    ib, roce = POOLS["ib and roce"]
    both = ports_in_service(topo, (ib, roce), None)
    assert both == ports_in_service(topo, (ib,), None) | ports_in_service(topo, (roce,), None)
    manager = ResourceManager(roce, dev_root="/nonexistent")
    manager.update(topo)
    assert {hca for hca, _ in both} == {h.name for h in manager.members}
    first = topo.hcas[0]
    by_dra = ports_in_service(topo, (roce,), [first.name, "not-on-this-node"])
    assert by_dra == {(first.name, p.number) for p in first.ports}


def test_what_a_health_flip_is_said_as() -> None:
    sick = HcaHealth("mlx5_0", (Symptom("PortDown", "port 1 DOWN (DISABLED)"),))
    assert health_flip(Transition("mlx5_0", None, sick)) == (
        "unhealthy",
        Announcement(False, "RDMADeviceUnhealthy", "mlx5_0: port 1 DOWN (DISABLED)"),
    )
    well = HcaHealth("mlx5_0")
    assert health_flip(Transition("mlx5_0", sick, well))[0] == "healthy"
    assert health_flip(Transition("mlx5_0", well, None)) == (
        "gone",
        Announcement(False, "RDMADeviceGone", "mlx5_0 disappeared"),
    )


def test_pool_problems_are_said_when_they_start_and_stop() -> None:
    fine = PoolFacts(3, None, None)
    mismatch = PoolFacts(None, "pools disagree", None)
    blocked = PoolFacts(3, None, "exclusive mode blocks rdma/shared")
    shared = NetnsMode.SHARED
    assert pool_changes(None, fine, shared) == []  # nothing to say at start
    assert pool_changes(fine, fine, shared) == []
    assert pool_changes(fine, mismatch, shared) == [
        Announcement(False, "RDMAGidIndexMismatch", "pools disagree; no gid-index label")
    ]
    assert pool_changes(None, mismatch, shared)[0].reason == "RDMAGidIndexMismatch"
    assert pool_changes(mismatch, fine, shared) == [
        Announcement(True, "RDMAGidIndexAgrees", "the device plugin pools agree on the GID")
    ]
    # the netns problem is a log line only: the RDMAReady condition's flip carries the Event
    assert pool_changes(fine, blocked, NetnsMode.EXCLUSIVE) == [
        Announcement(False, None, "exclusive mode blocks rdma/shared")
    ]
    again = pool_changes(blocked, fine, shared)
    assert again == [
        Announcement(True, None, f"the shared pools are served again (RDMA netns mode {shared})")
    ]
