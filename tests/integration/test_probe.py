"""The cheap poll (`rdmaplane.adapters.discovery.probe`): its fingerprint changes exactly when a
full
rediscovery is worth it."""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from rdmaplane.adapters.discovery import read_node, samples
from rdmaplane.adapters.discovery.probe import Probe, settle
from rdmaplane.adapters.discovery.samples import ip_gid
from rdmaplane.adapters.discovery.sysfs import NETNS_PARAMETER
from rdmaplane.core.model import NetnsMode, NodeTopology, PhysState, PortState

WATCHED = ("symbol_error", "link_downed", "port_rcv_errors", "local_ack_timeout_err")


DUAL_PORT = {
    "hostname": "dual",
    "numa": [{"id": 0, "cpus": "0-7", "distances": [10]}],
    "roots": {"pci0000:00": 0},
    "netdevs": [
        {"name": "ens1f0np0", "pci": "00:01.0/01:00.0", "mac": "b8:3f:d2:00:00:01"},
        {"name": "ens1f1np1", "pci": "00:01.0/01:00.1", "mac": "b8:3f:d2:00:00:02"},
    ],
    "hcas": [
        {
            "name": "mlx5_0",
            "path": "00:01.0/01:00.0",
            "ports": [
                {"netdev": "ens1f0np0", "mac": "b8:3f:d2:00:00:01", "addresses": ["10.0.0.1"]},
                {"netdev": "ens1f1np1", "mac": "b8:3f:d2:00:00:02", "addresses": ["10.0.1.1"]},
            ],
        }
    ],
}


@pytest.fixture
def node(sample_trees: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the HGX sample tree, free to modify."""
    return Path(shutil.copytree(sample_trees["hgx-h100-roce"], tmp_path / "sys", symlinks=True))


def port_dir(root: Path, hca: str, port: int = 1) -> Path:
    return root / "class/infiniband" / hca / "ports" / str(port)


def probe(root: Path) -> Probe:
    return Probe(str(root), read_node(str(root)), WATCHED)


def test_fingerprint_is_stable_and_ignores_counters(node: Path):
    p = probe(node)
    first = p.read()
    (port_dir(node, "mlx5_0") / "counters/port_xmit_data").write_text("999999999999\n")
    (port_dir(node, "mlx5_0") / "counters/symbol_error").write_text("7\n")
    second = p.read()
    assert first.fingerprint == second.fingerprint
    by_hca = {o.hca: o for o in second.ports}
    assert by_hca["mlx5_0"].counters["symbol_error"] == 7


def test_port_state_change_changes_fingerprint_and_observation(node: Path):
    p = probe(node)
    before = p.read()
    (port_dir(node, "mlx5_3") / "state").write_text("1: DOWN\n")
    (port_dir(node, "mlx5_3") / "phys_state").write_text("3: Disabled\n")
    after = p.read()
    assert after.fingerprint != before.fingerprint
    mlx5_3 = next(o for o in after.ports if o.hca == "mlx5_3")
    assert (mlx5_3.state, mlx5_3.phys_state) == (PortState.DOWN, PhysState.DISABLED)
    assert not mlx5_3.is_up


def test_rate_change_changes_fingerprint(node: Path):
    p = probe(node)
    before = p.read()
    (port_dir(node, "mlx5_1") / "rate").write_text("200 Gb/sec (4X HDR)\n")
    assert p.read().fingerprint != before.fingerprint


def test_added_address_lands_in_the_lowest_free_gid_slot(node: Path):
    """The kernel fills the lowest free GID slots; the probe reads the two lowest free ones."""
    topo = read_node(str(node))
    port = topo.hca("mlx5_2").port(1)
    used = {g.index for g in port.gids}
    free = min(i for i in range(port.gid_table_len) if i not in used)
    p = Probe(str(node), topo, WATCHED)
    before = p.read()
    (port_dir(node, "mlx5_2") / f"gids/{free}").write_text(ip_gid("10.77.0.1") + "\n")
    after = p.read()
    assert after.fingerprint != before.fingerprint
    # and a full read indeed sees a new GID there
    assert free in {g.index for g in read_node(str(node)).hca("mlx5_2").port(1).gids}


def test_removed_address_changes_fingerprint(node: Path):
    topo = read_node(str(node))
    last = max(g.index for g in topo.hca("mlx5_4").port(1).gids)
    p = Probe(str(node), topo, WATCHED)
    before = p.read()
    (port_dir(node, "mlx5_4") / f"gids/{last}").write_text(":".join(["0000"] * 8) + "\n")
    assert p.read().fingerprint != before.fingerprint


def test_vanished_hca_changes_fingerprint_without_crashing(node: Path):
    p = probe(node)
    before = p.read()
    link = node / "class/infiniband/mlx5_7"
    shutil.rmtree(link.resolve())  # hot-unplug: the device and its class link go
    link.unlink()
    after = p.read()
    assert after.fingerprint != before.fingerprint
    gone = next(o for o in after.ports if o.hca == "mlx5_7")
    assert gone.state == PortState.NOP and gone.counters == {}


def test_netns_mode_switch_changes_fingerprint(node: Path):
    """`rdma system set netns exclusive` flips ib_core's parameter: worth a full read."""
    p = probe(node)
    before = p.read()
    (node / NETNS_PARAMETER).write_text("N\n")
    after = p.read()
    assert after.fingerprint != before.fingerprint
    assert read_node(str(node)).netns_mode is NetnsMode.EXCLUSIVE


def test_hw_counters_read_where_they_are(node: Path, tmp_path: Path):
    """Per-port `hw_counters` (real mlx5) win; the sample keeps them device-wide."""
    hca_dir = (node / "class/infiniband/mlx5_0").resolve()
    (hca_dir / "hw_counters/local_ack_timeout_err").write_text("11\n")
    first = {o.hca: o for o in probe(node).read().ports}["mlx5_0"]
    assert first.counters["local_ack_timeout_err"] == 11
    per_port = hca_dir / "ports/1/hw_counters"
    per_port.mkdir()
    (per_port / "local_ack_timeout_err").write_text("22\n")
    second = {o.hca: o for o in probe(node).read().ports}["mlx5_0"]
    assert second.counters["local_ack_timeout_err"] == 22


def test_dual_port_card_ignores_device_wide_hw_counters(tmp_path: Path):
    """Device-wide counters of a dual-port card belong to neither port."""
    root = tmp_path / "sys"
    samples.build(DUAL_PORT, root)
    topo = read_node(str(root))
    assert [len(h.ports) for h in topo.hcas] == [2]
    hw = (root / "class/infiniband/mlx5_0").resolve() / "hw_counters"
    (hw / "local_ack_timeout_err").write_text("5\n")
    readings = Probe(str(root), topo, WATCHED).read().ports
    assert [o.port for o in readings] == [1, 2]
    assert all("local_ack_timeout_err" not in o.counters for o in readings)
    assert all(o.counters["symbol_error"] == 0 for o in readings)


def test_probe_survives_a_wiped_tree(node: Path):
    p = probe(node)
    shutil.rmtree(node)
    reading = p.read()
    assert reading.fingerprint[:3] == (None, None, None)  # the listings failed
    assert all(o.state == PortState.NOP for o in reading.ports)


Reader = Callable[[], Awaitable[NodeTopology]]


def flipping_reader(node: Path, flips: int) -> tuple[Reader, list[int]]:
    """A full read after which mlx5_0's port flips, `flips` times: the race a probe's baseline
    must not swallow (the full read saw the port one way, the baseline the other)."""
    state, calls = port_dir(node, "mlx5_0") / "state", [0]

    async def read() -> NodeTopology:
        calls[0] += 1
        topo = read_node(str(node))
        if calls[0] <= flips:
            up = topo.hca("mlx5_0").port(1).is_up  # type: ignore[union-attr]
            state.write_text("1: DOWN\n" if up else "4: ACTIVE\n")
        return topo

    return read, calls


async def test_settle_reads_again_when_the_node_changed_under_the_baseline(node: Path):
    read, calls = flipping_reader(node, flips=1)
    settled = await settle(read, lambda topo: Probe(str(node), topo, WATCHED))
    assert calls[0] == 3  # read, baseline, read (differs), baseline, read (agrees)
    assert settled.topo.hca("mlx5_0").port(1).is_up is False  # type: ignore[union-attr]
    assert settled.fingerprint == settled.probe.read().fingerprint


async def test_settle_gives_no_fingerprint_when_the_node_never_holds_still(node: Path):
    read, calls = flipping_reader(node, flips=10)
    settled = await settle(read, lambda topo: Probe(str(node), topo, WATCHED), tries=3)
    assert calls[0] == 4 and settled.fingerprint is None  # the next poll reads again
