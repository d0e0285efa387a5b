"""The resource manager without sockets: devices, health, preferred sets, allocations."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rdmaplane.adapters.config.base import validate
from rdmaplane.core.model import Hca, NetnsMode, NodeTopology, PhysState, PortState
from rdmaplane.core.netns import NETNS_EXCLUSIVE
from rdmaplane.core.poolplan import pool_gid_index, pool_members
from rdmaplane.core.settings.deviceplugin import Pool
from rdmaplane.core.usability import (
    DEVICE_GONE,
    NO_NCCL_PLAN,
    NO_VERBS_DEVICE,
    PORT_DOWN,
    REPORTED_FAULT,
    Unusable,
)
from rdmaplane.services.deviceplugin.manager import AllocateError, ResourceManager, device_id


@pytest.fixture
def hgx(sample_nodes: dict[str, NodeTopology]) -> NodeTopology:
    return sample_nodes["hgx-h100-roce"]


def device_nodes(topo: NodeTopology, root: Path) -> Path:
    """A node's /dev as the plugin sees it: every HCA's verbs, umad and issm node."""
    folder = root / "infiniband"
    folder.mkdir(parents=True)
    for hca in topo.hcas:
        for name in (hca.uverbs, *(n for p in hca.ports for n in (p.umad, p.issm))):
            if name:
                (folder / name).touch()
    return root


@pytest.fixture
def dev(hgx: NodeTopology, tmp_path: Path) -> Path:
    return device_nodes(hgx, tmp_path / "dev")


def manager(pool: dict[str, object], dev_root: Path | str) -> ResourceManager:
    return ResourceManager(validate(Pool, pool), dev_root=str(dev_root))


def down(topo: NodeTopology, name: str) -> NodeTopology:
    def port_down(h: Hca) -> Hca:
        ports = tuple(
            replace(p, state=PortState.DOWN, phys_state=PhysState.DISABLED) for p in h.ports
        )
        return replace(h, ports=ports) if h.name == name else h

    return replace(topo, hcas=tuple(port_down(h) for h in topo.hcas))


def test_exclusive_devices_are_pci_addresses_with_numa(hgx: NodeTopology, dev: Path) -> None:
    m = manager({}, dev)
    assert m.update(hgx)
    assert [(d.id, d.numa_nodes, d.hcas) for d in m.devices] == sorted(
        (h.pci.address, (h.numa,), (h.name,)) for h in hgx.hcas if h.pci
    )
    assert not m.update(hgx)  # nothing changed, nothing to re-send


def test_software_device_is_named_and_has_no_topology(hgx: NodeTopology, dev: Path) -> None:
    rxe = replace(hgx.hcas[0], name="rxe0", pci=None)
    m = manager({"selectors": {"hcaNames": ["rxe0"]}}, dev)
    m.update(replace(hgx, hcas=(rxe,)))
    assert [(d.id, d.numa_nodes) for d in m.devices] == [("rxe0", ())]
    assert device_id(rxe) == "rxe0"


def test_selectors_pick_the_pool(hgx: NodeTopology, dev: Path) -> None:
    m = manager({"selectors": {"ifNames": ["ens108np0", "bond0"]}}, dev)
    m.update(hgx)
    assert sorted(h.name for h in m.members) == ["mlx5_0", "mlx5_bond_0"]
    assert pool_members(hgx, m.pool) == [h.name for h in m.members]  # the agent's view of it


def test_port_down_is_unhealthy_with_a_reason(hgx: NodeTopology, dev: Path) -> None:
    m = manager({}, dev)
    m.update(hgx)
    assert m.update(down(hgx, "mlx5_2"))
    bad = [d for d in m.devices if not d.healthy]
    assert [d.hcas for d in bad] == [("mlx5_2",)]
    assert bad[0].problem == Unusable(
        PORT_DOWN, "mlx5_2: no port ACTIVE and LinkUp (port 1 DOWN/DISABLED)"
    )


def test_fault_from_outside_is_unhealthy_until_cleared(hgx: NodeTopology, dev: Path) -> None:
    """The agent's counter verdicts arrive as faults; the reason is theirs, not a port state."""
    m = manager({}, dev)
    m.update(hgx)
    fault = "port 1 symbol_error +12 within 60 s (max 10)"
    assert m.update(hgx, {"mlx5_2": fault, "not-in-pool": "ignored"})
    bad = [d for d in m.devices if not d.healthy]
    assert [(d.hcas, d.problem) for d in bad] == [
        (("mlx5_2",), Unusable(REPORTED_FAULT, f"mlx5_2: {fault}"))
    ]
    with pytest.raises(AllocateError, match="symbol_error"):
        m.allocate([bad[0].id])
    assert m.update(hgx) and all(d.healthy for d in m.devices)


def test_shared_slots_grant_the_pool_and_fail_only_when_all_ports_do(
    hgx: NodeTopology, dev: Path
) -> None:
    m = manager(
        {"mode": "shared", "slots": 3, "selectors": {"hcaNames": ["mlx5_0", "mlx5_4"]}}, dev
    )
    m.update(hgx)
    assert [(d.id, d.healthy, d.numa_nodes, d.hcas) for d in m.devices] == [
        (f"hca-shared-{i:04d}", True, (0, 1), ("mlx5_0", "mlx5_4")) for i in range(3)
    ]
    m.update(down(hgx, "mlx5_0"))
    assert all(d.healthy for d in m.devices)
    m.update(down(down(hgx, "mlx5_0"), "mlx5_4"))
    assert not any(d.healthy for d in m.devices)
    with pytest.raises(AllocateError, match="hca-shared-0001 is unhealthy: mlx5_0: no port"):
        m.allocate(["hca-shared-0001"])


def test_a_shared_pool_on_an_exclusive_netns_node_is_unhealthy_with_the_reason(
    hgx: NodeTopology, dev: Path
) -> None:
    """Each slot grants HCAs that stay in the node's network namespace: in exclusive mode the
    pods would see none, so no slot is handed out. Exclusive pools are served as ever."""
    pool = {"mode": "shared", "slots": 2, "selectors": {"hcaNames": ["mlx5_0", "mlx5_4"]}}
    shared, exclusive = manager(pool, dev), manager({}, dev)
    exclusive_mode = replace(hgx, netns_mode=NetnsMode.EXCLUSIVE)
    fault = {"mlx5_0": "port 1 symbol_error +12 within 60 s (max 10)"}
    assert shared.update(exclusive_mode, fault) and exclusive.update(exclusive_mode)
    assert all(d.healthy for d in exclusive.devices)
    said = Unusable(
        NETNS_EXCLUSIVE,
        "mlx5_0: RDMA netns mode is exclusive; a shared pool needs shared (its pods would not "
        "see it); mlx5_4: RDMA netns mode is exclusive; a shared pool needs shared (its pods "
        "would not see it)",
    )
    assert [(d.healthy, d.problem) for d in shared.devices] == [(False, said)] * 2
    with pytest.raises(AllocateError, match="hca-shared-0000 is unhealthy: mlx5_0: RDMA netns"):
        shared.allocate(["hca-shared-0000"])
    for mode in (NetnsMode.SHARED, NetnsMode.UNKNOWN):  # unknown: nothing to hold against it
        assert shared.update(replace(hgx, netns_mode=mode))
        assert all(d.healthy for d in shared.devices)
        shared.update(exclusive_mode)


def test_preferred_set_uses_numa_and_roots(hgx: NodeTopology, dev: Path) -> None:
    m = manager({}, dev)
    m.update(hgx)
    numa1 = [device_id(h) for h in hgx.hcas if h.numa == 1]
    everything = [d.id for d in m.devices]
    chosen = m.preferred(everything, [numa1[0]], 3)
    assert set(chosen) <= set(numa1) and numa1[0] in chosen


def test_hca_without_a_verbs_node_is_unhealthy_with_the_reason(
    hgx: NodeTopology, dev: Path
) -> None:
    """A device the plugin could not hand out is never Healthy; Allocate refuses it with the
    same reason, and it turns Healthy when its node appears (`recheck`, every poll)."""
    mlx5_3 = hgx.hca("mlx5_3")
    assert mlx5_3 and mlx5_3.uverbs
    (dev / "infiniband" / mlx5_3.uverbs).unlink()
    m = manager({}, dev)
    m.update(hgx)
    bad = [d for d in m.devices if not d.healthy]
    assert [d.id for d in bad] == [device_id(mlx5_3)]
    assert bad[0].problem == Unusable(
        NO_VERBS_DEVICE,
        f"mlx5_3: no verbs device node /dev/infiniband/{mlx5_3.uverbs} (looked under {dev})",
    )
    with pytest.raises(AllocateError, match="is unhealthy: mlx5_3: no verbs device node"):
        m.allocate([bad[0].id])
    assert not m.recheck()  # nothing changed under /dev
    (dev / "infiniband" / mlx5_3.uverbs).touch()
    assert m.recheck() and all(d.healthy for d in m.devices)


def test_without_device_nodes_nothing_is_healthy(hgx: NodeTopology, tmp_path: Path) -> None:
    m = manager({}, tmp_path)  # e.g. --dev-root without /dev/infiniband mounted
    m.update(hgx)
    assert {(d.healthy, d.problem.reason if d.problem else None) for d in m.devices} == {
        (False, NO_VERBS_DEVICE)
    }
    shared = manager({"mode": "shared", "slots": 2}, tmp_path)
    shared.update(hgx)
    assert {(d.healthy, d.problem.reason if d.problem else None) for d in shared.devices} == {
        (False, NO_VERBS_DEVICE)
    }


def test_a_shared_slot_grants_only_the_hcas_it_can_hand_out(hgx: NodeTopology, dev: Path) -> None:
    mlx5_0 = hgx.hca("mlx5_0")
    assert mlx5_0 and mlx5_0.uverbs
    (dev / "infiniband" / mlx5_0.uverbs).unlink()
    m = manager(
        {"mode": "shared", "slots": 2, "selectors": {"hcaNames": ["mlx5_0", "mlx5_4"]}}, dev
    )
    m.update(hgx)
    assert all(d.healthy for d in m.devices)  # mlx5_4 is usable
    got = m.allocate([m.devices[0].id])
    assert got.envs["RDMAPLANE_HCAS"] == "mlx5_4"
    assert not any(mlx5_0.uverbs in n for n in got.device_nodes)


def link_local_only(topo: NodeTopology, name: str) -> NodeTopology:
    """`name`'s ports keep only their fe80:: GIDs, as a VF before its netdev gets an address."""

    def strip(h: Hca) -> Hca:
        ports = tuple(replace(p, gids=tuple(g for g in p.gids if g.is_link_local)) for p in h.ports)
        return replace(h, ports=ports) if h.name == name else h

    return replace(topo, hcas=tuple(strip(h) for h in topo.hcas))


def test_an_hca_nccl_could_not_use_is_unhealthy_not_refused_later(
    hgx: NodeTopology, dev: Path
) -> None:
    """Healthy means Allocate will succeed: the kubelet admits a pod on a Healthy device and
    rejects it (UnexpectedAdmissionError) when Allocate then fails."""
    m = manager({}, dev)
    m.update(link_local_only(hgx, "mlx5_3"))
    bad = [d for d in m.devices if not d.healthy]
    assert [d.hcas for d in bad] == [("mlx5_3",)]
    assert bad[0].problem and bad[0].problem.reason == NO_NCCL_PLAN
    assert "no usable GID" in bad[0].problem.message
    assert m.allocate([d.id for d in m.devices if d.healthy]).envs["NCCL_IB_GID_INDEX"] == "3"


def test_a_shared_slot_leaves_out_an_hca_nccl_could_not_use(hgx: NodeTopology, dev: Path) -> None:
    m = manager(
        {"mode": "shared", "slots": 2, "selectors": {"hcaNames": ["mlx5_0", "mlx5_4"]}}, dev
    )
    m.update(link_local_only(hgx, "mlx5_0"))
    assert all(d.healthy for d in m.devices)
    assert m.allocate([m.devices[0].id]).envs["RDMAPLANE_HCAS"] == "mlx5_4"
    m.update(link_local_only(link_local_only(hgx, "mlx5_0"), "mlx5_4"))
    assert not any(d.healthy for d in m.devices)


def test_device_nodes_are_the_nodes_real_paths(hgx: NodeTopology, tmp_path: Path) -> None:
    (tmp_path / "infiniband").mkdir()
    hca = hgx.hca("mlx5_1")
    assert hca and hca.uverbs and hca.ports[0].umad
    for name in (hca.uverbs, hca.ports[0].umad):
        (tmp_path / "infiniband" / name).touch()
    m = manager({}, tmp_path)
    m.update(hgx)
    got = m.allocate([device_id(hca)])
    assert got.device_nodes == (
        f"/dev/infiniband/{hca.uverbs}",
        f"/dev/infiniband/{hca.ports[0].umad}",
    )  # no rdma_cm under this dev root, so none is handed out
    assert got.envs["RDMAPLANE_HCAS"] == "mlx5_1"


def test_vanished_device_stays_listed_as_unhealthy(hgx: NodeTopology, dev: Path) -> None:
    m = manager({}, dev)
    m.update(hgx)
    gone = hgx.hca("mlx5_7")
    assert gone
    assert m.update(replace(hgx, hcas=tuple(h for h in hgx.hcas if h.name != "mlx5_7")))
    gone_dev = next(d for d in m.devices if d.id == device_id(gone))
    assert not gone_dev.healthy
    assert gone_dev.problem == Unusable(DEVICE_GONE, "mlx5_7: device is gone")
    assert m.update(hgx) and all(d.healthy for d in m.devices)


@pytest.mark.parametrize(
    ("sample", "gid", "expected"),
    [
        ("hgx-h100-roce", {}, (True, 3)),  # IPv4, RoCE v2: the usual index 3
        ("hgx-h100-roce", {"roceVersion": 1}, (True, 2)),  # its RoCE v1 twin
        ("degraded", {}, (True, None)),  # the storage bond's index differs: NCCL picks
        ("hgx-h100-roce", {"addrFamily": 6}, (True, None)),  # no IPv6 GID: nothing to give
    ],
)
def test_pool_gid_index_is_what_allocate_injects(
    sample_nodes: dict[str, NodeTopology],
    sample: str,
    gid: dict[str, int],
    expected: tuple,
    tmp_path: Path,
) -> None:
    m = manager({"nccl": {"gid": gid}}, device_nodes(sample_nodes[sample], tmp_path / "dev"))
    m.update(sample_nodes[sample])
    assert pool_gid_index(sample_nodes[sample], m.pool) == expected
    every = [d.id for d in m.devices if d.healthy]
    if gid.get("addrFamily") == 6:
        assert not every and {d.problem.reason for d in m.devices if d.problem} == {NO_NCCL_PLAN}
        return
    injected = m.allocate(every).envs.get("NCCL_IB_GID_INDEX")
    assert injected == (None if expected[1] is None else str(expected[1]))


def test_an_infiniband_pool_needs_no_gid_index(
    sample_nodes: dict[str, NodeTopology], tmp_path: Path
) -> None:
    m = manager({"selectors": {"linkTypes": ["infiniband"]}}, tmp_path)
    m.update(sample_nodes["hgx-h200-ib"])
    assert m.members and pool_gid_index(sample_nodes["hgx-h200-ib"], m.pool) == (False, None)


def test_allocate_tells_the_rails_of_the_hcas_it_grants_in_their_order(
    hgx: NodeTopology, dev: Path
) -> None:
    rails = {f"mlx5_{k}": 7 - k for k in range(8)}  # cabled in reverse: the order is the HCAs'
    m = manager({}, dev)
    m.update(hgx, {}, rails)
    ids = {d.hcas[0]: d.id for d in m.devices}
    got = m.allocate([ids["mlx5_5"], ids["mlx5_1"]])
    assert got.envs["RDMAPLANE_HCAS"] == "mlx5_1,mlx5_5"
    assert got.envs["RDMAPLANE_RAILS"] == "6,2"
    mlx5_1 = hgx.hca("mlx5_1")
    assert mlx5_1 and mlx5_1.uverbs
    (dev / "infiniband" / mlx5_1.uverbs).unlink()
    m.recheck()  # rails outlive a recheck
    (dev / "infiniband" / mlx5_1.uverbs).touch()
    m.recheck()
    assert m.allocate([ids["mlx5_5"]]).envs["RDMAPLANE_RAILS"] == "2"
    m.update(hgx, {}, {"mlx5_5": 2})  # one rail unknown: no partial list
    assert "RDMAPLANE_RAILS" not in m.allocate([ids["mlx5_5"], ids["mlx5_1"]]).envs
    m.update(hgx)  # the fabric unknown
    assert "RDMAPLANE_RAILS" not in m.allocate([ids["mlx5_5"]]).envs
