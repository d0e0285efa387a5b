"""The sysfs reader on sample trees, hand-broken trees and random junk."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmaplane.adapters.discovery import samples
from rdmaplane.adapters.discovery.sysfs import NETNS_PARAMETER, hcas_in_other_namespaces, read_node
from rdmaplane.core.model import GidType, LinkLayer, NetdevKind, NetnsMode, NodeTopology, PortState
from rdmaplane.core.selectors import natural_key
from rdmaplane.core.topology import relations


def test_gpus_are_nvidia_3d_or_vga_functions_in_bus_order(
    sample_nodes: dict[str, NodeTopology],
) -> None:
    topo = sample_nodes["hgx-h100-roce"]
    # four NVSwitches (NVIDIA, bridge class) and the ASPEED BMC VGA are not GPUs
    assert [g.pci.address for g in topo.gpus] == sorted(g.pci.address for g in topo.gpus)
    assert len(topo.gpus) == 8
    assert all(g.uuid and g.uuid.startswith("GPU-") for g in topo.gpus)
    assert topo.hostname == "hgx-h100-017"


def test_hca_facts(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["hgx-h100-roce"]
    h = topo.hca("mlx5_0")
    assert h is not None and h.pci is not None
    assert (h.numa, h.pcie_root, h.hca_type, h.uverbs) == (0, "pci0000:15", "MT4129", "uverbs0")
    assert h.pci.driver == "mlx5_core"
    p = h.ports[0]
    assert (p.state, p.link_layer, p.rate_gbps, p.netdev) == (
        PortState.ACTIVE,
        LinkLayer.ETHERNET,
        400.0,
        "ens108np0",
    )
    assert p.gid_table_len == 255 and [g.index for g in p.gids] == [0, 1, 2, 3]
    assert p.gids[3].type is GidType.ROCE_V2 and p.gids[3].ip == "10.99.91.39"
    assert p.gids[0].is_link_local and not p.gids[0].is_ipv4_mapped
    assert p.umad == "umad0" and p.issm is None  # Ethernet cards have no issm


def test_bond_port_maps_to_the_bond_netdev(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["hgx-h100-roce"]
    bond = topo.hca("mlx5_bond_0")
    assert bond is not None and bond.ports[0].netdev == "bond0"
    nd = topo.netdev("bond0")
    assert nd is not None and nd.kind is NetdevKind.BOND
    assert nd.lower == ("ens3f0np0", "ens3f1np1")
    slave = topo.netdev("ens3f0np0")
    assert slave is not None and slave.master == "bond0" and slave.kind is NetdevKind.PHYSICAL


def test_infiniband_ports(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["hgx-h200-ib"]
    h = topo.hca("mlx5_10")
    assert h is not None
    p = h.ports[0]
    assert p.link_layer is LinkLayer.INFINIBAND and p.rate_gbps == 400.0
    assert p.lid is not None and p.sm_lid == 1 and p.issm is not None
    assert p.netdev is not None and topo.netdev(p.netdev).kind is NetdevKind.IPOIB  # type: ignore[union-attr]
    gid = p.gids[0]
    # IB GIDs have no netdev: ndevs answers EINVAL, which is not an error for IB
    assert gid.index == 0 and gid.netdev is None and gid.attrs_error is None
    assert not topo.warnings


def test_degraded_node(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["degraded"]
    assert [h.name for h in topo.hcas] == ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_bond_0"]
    assert all(h.numa is None for h in topo.hcas) and all(g.pci.numa is None for g in topo.gpus)
    down = topo.hca("mlx5_3").ports[0]  # type: ignore[union-attr]
    assert down.state is PortState.DOWN and not down.is_up
    sparse = topo.hca("mlx5_4").ports[0]  # type: ignore[union-attr]
    assert [g.index for g in sparse.gids] == [4, 5, 6, 7, 8]
    torn = sparse.gids[-1]
    assert torn.type is None and torn.attrs_error and "Invalid argument" in torn.attrs_error
    assert any("gid_attrs" in w.path and "Invalid argument" in w.message for w in topo.warnings)
    vlan = topo.netdev("ens1f0np0.100")
    assert vlan is not None and vlan.kind is NetdevKind.VLAN and vlan.lower == ("ens1f0np0",)
    ipv6_first = topo.hca("mlx5_0").ports[0].gids  # type: ignore[union-attr]
    assert [(g.index, g.family) for g in ipv6_first[2:6]] == [(2, 6), (3, 6), (4, 4), (5, 4)]


def test_software_rdma_device_without_pci(sample_nodes: dict[str, NodeTopology]) -> None:
    rxe = sample_nodes["workstation"].hca("rxe0")
    assert rxe is not None and rxe.pci is None and rxe.numa is None
    assert rxe.parent_netdev == "eno1" and rxe.ports[0].netdev == "eno1"
    # as rdma_rxe shows it: ib_core's fw_ver, empty; none of mlx5's hca_type or board_id
    assert (rxe.fw_ver, rxe.hca_type, rxe.board_id) == ("", None, None)


@pytest.mark.parametrize("name", samples.names())
def test_a_sample_reads_the_same_in_memory_and_on_disk(
    name: str, sample_trees: dict[str, Path], sample_nodes: dict[str, NodeTopology]
) -> None:
    from dataclasses import replace

    in_memory = read_node(samples.sample_tree(name))
    assert in_memory.source == f"sample:{name}"
    assert replace(in_memory, source=None) == replace(sample_nodes[name], source=None)


def test_missing_root_reads_as_an_empty_node(tmp_path: Path) -> None:
    topo = read_node(str(tmp_path))
    assert topo.hcas == () and topo.gpus == ()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    samples.build(samples.load("degraded").spec, root)
    return root


def _hca_dir(tree: Path, name: str) -> Path:
    return Path(os.path.realpath(tree / "class/infiniband" / name))


def test_garbage_and_missing_files_become_warnings_naming_the_file(tree: Path) -> None:
    port = _hca_dir(tree, "mlx5_0") / "ports/1"
    (port / "state").write_text("banana\n")
    (port / "rate").unlink()
    (port / "gids/3").write_text("not-a-gid\n")
    (Path(os.path.realpath(tree / "bus/pci/devices/0000:1a:00.0")) / "numa_node").write_text("-7")
    topo = read_node(str(tree))
    paths = {w.path for w in topo.warnings}
    assert "class/infiniband/mlx5_0/ports/1/state" in paths
    assert "class/infiniband/mlx5_0/ports/1/rate" in paths
    assert "class/infiniband/mlx5_0/ports/1/gids/3" in paths
    assert "bus/pci/devices/0000:1a:00.0/numa_node" in paths
    p = topo.hca("mlx5_0").ports[0]  # type: ignore[union-attr]
    assert p.state is PortState.NOP and p.rate_gbps is None and 3 not in [g.index for g in p.gids]
    assert len(topo.hcas) == 4  # everything else still read


def test_a_folder_link_in_class_infiniband_is_no_rdma_device(tree: Path) -> None:
    (tree / "class/infiniband/selfdir").symlink_to("../infiniband")
    topo = read_node(str(tree))
    assert "selfdir" not in [h.name for h in topo.hcas]
    assert any(
        w.path == "class/infiniband/selfdir" and "not an RDMA device" in w.message
        for w in topo.warnings
    )


def test_an_absurd_numa_node_is_a_warning_never_a_zone(tree: Path) -> None:
    topo = read_node(str(tree))
    hca = topo.hca("mlx5_0")
    assert hca is not None and hca.pci is not None
    numa_file = tree / "bus/pci/devices" / hca.pci.address / "numa_node"
    numa_file.write_text("99999999999999999999999999\n")
    (tree / "devices/system/node/node4096").mkdir(parents=True)
    again = read_node(str(tree))
    assert again.hca("mlx5_0").numa is None  # type: ignore[union-attr]
    assert 4096 not in [n.id for n in again.numa_nodes]
    messages = {w.path: w.message for w in again.warnings}
    assert "is no NUMA node" in messages[f"bus/pci/devices/{hca.pci.address}/numa_node"]
    assert "is no NUMA node" in messages["devices/system/node/node4096"]


def test_link_escaping_the_root_is_refused(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "class").write_text("0x030200\n")  # looks like a GPU, so the reader follows it
    (outside / "vendor").write_text("0x10de\n")
    link = tree / "bus/pci/devices/0000:1a:00.0"
    link.unlink()
    link.symlink_to(outside)
    topo = read_node(str(tree))
    assert any("outside the sysfs root" in w.message for w in topo.warnings)
    assert len(topo.gpus) == 3


# ---------------------------------------------------------------- untrusted content


SIDECARS = {
    "nvlinks as a string": ({"gpus": {"0000:1a:00.0": {"nvlinks": "NV12"}}}, "nvlinks"),
    "nvlink count as a string": (
        {"gpus": {"0000:1a:00.0": {"nvlinks": {"0000:2a:00.0": "12"}}}},
        "nvlinks",
    ),
    "gpus as a list": ({"gpus": ["x"]}, "gpus: expected an object, got a list"),
    "gpu facts as a string": ({"gpus": {"0000:1a:00.0": "x"}}, "gpus.0000:1a:00.0"),
    "uuid as a number": (
        {"gpus": {"0000:1a:00.0": {"uuid": 7}}},
        "uuid: expected a string, got a number",
    ),
    "hostname as a list": ({"hostname": []}, "hostname: expected a string, got a list"),
    "unreadable as a list": ({"unreadable": []}, "'unreadable' is not an object"),
    "deep nesting": ("[" * 5000 + "]" * 5000, "nested deeper than"),
    "binary junk": (b"\xff\xfe\x00", "not UTF-8"),
    "not JSON": ("{", "not valid YAML/JSON"),
}


@pytest.mark.parametrize("case", sorted(SIDECARS))
def test_a_broken_sidecar_is_a_warning_naming_the_key(tree: Path, case: str) -> None:
    content, message = SIDECARS[case]
    sidecar = tree / ".rdmaplane/node.json"
    if isinstance(content, bytes):
        sidecar.write_bytes(content)
    else:
        sidecar.write_text(content if isinstance(content, str) else json.dumps(content))
    topo = read_node(str(tree))
    found = [w for w in topo.warnings if w.path == ".rdmaplane/node.json"]
    assert any(message in w.message for w in found), found
    assert len(topo.hcas) == 4 and len(topo.gpus) == 4  # the tree itself is still read
    relations(topo)


def test_text_a_terminal_would_act_on_is_escaped(tree: Path) -> None:
    hca = _hca_dir(tree, "mlx5_0")
    (hca / "hca_type").write_text("MT4129\x1b]0;pwned\x07\n")
    sidecar = tree / ".rdmaplane/node.json"
    facts = json.loads(sidecar.read_text())
    facts["hostname"] = "evil\x1b[2J\r\u202e"
    sidecar.write_text(json.dumps(facts))
    topo = read_node(str(tree))
    assert topo.hostname == "evil\\x1b[2J\\r\\u202e"
    assert topo.hca("mlx5_0").hca_type == "MT4129\\x1b]0;pwned\\x07"  # type: ignore[union-attr]
    messages = {(w.path, w.message) for w in topo.warnings}
    assert ("class/infiniband/mlx5_0/hca_type", "control characters escaped") in messages


def test_a_device_named_with_control_characters_is_left_out(tree: Path) -> None:
    (tree / "class/infiniband/mlx5_0").rename(tree / "class/infiniband/mlx5_\x1b[31m0")
    topo = read_node(str(tree))
    assert [h.name for h in topo.hcas] == ["mlx5_3", "mlx5_4", "mlx5_bond_0"]
    assert any(w.path == "class/infiniband/mlx5_\\x1b[31m0" for w in topo.warnings)


def test_hcas_and_netdevs_come_in_natural_order(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["hgx-h200-ib"]
    names = [h.name for h in topo.hcas]
    assert names.index("mlx5_2") < names.index("mlx5_10")
    assert names == sorted(names, key=natural_key)
    netdevs = [n.name for n in topo.netdevs]
    assert netdevs == sorted(netdevs, key=natural_key)


# ---------------------------------------------------------------- fuzzing

JUNK = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=40).map(str.encode),
    st.sampled_from(
        [b"", b"-1", b"4: ACTIVE", b"0x", b"\xff\xfe", b"99999999999999999999", b"5-3"]
    ),
)


def _all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_junk_never_crashes_the_reader(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    base = tmp_path_factory.mktemp("fuzz")
    root = base / "sys"
    samples.build(samples.load(data.draw(st.sampled_from(["degraded", "workstation"]))).spec, root)
    files = _all_files(root)
    for _ in range(data.draw(st.integers(1, 25))):
        victim = data.draw(st.sampled_from(files))
        action = data.draw(st.sampled_from(["junk", "delete", "dir", "dangling"]))
        if not victim.exists() or victim.is_symlink() or victim.is_dir():
            continue
        if action == "junk":
            victim.write_bytes(data.draw(JUNK))
        elif action == "delete":
            victim.unlink()
        elif action == "dir":
            victim.unlink()
            victim.mkdir()
        else:
            victim.unlink()
            victim.symlink_to(base / "nowhere")
    topo = read_node(str(root))
    relations(topo)  # the derived view must hold up too
    shutil.rmtree(base)


node_specs = st.fixed_dictionaries(
    {
        "numa": st.just([{"id": 0, "cpus": "0-3", "distances": [10]}]),
        "roots": st.just({"pci0000:00": 0, "pci0000:80": -1}),
        "gpus": st.lists(
            st.tuples(
                st.sampled_from(["00", "80"]), st.integers(1, 3), st.integers(0x10, 0x7F)
            ).map(
                lambda t: {
                    "path": "/".join(
                        [f"{t[0]}:01.0"] + [f"{t[2] + i:02x}:00.0" for i in range(t[1])]
                    )
                }
            ),
            max_size=4,
            unique_by=lambda g: g["path"].rsplit("/", 1)[1],
        ).filter(lambda gpus: _one_place_per_bdf([g["path"] for g in gpus])),
    }
)


def _one_place_per_bdf(paths: list[str]) -> bool:
    """A real PCI address sits at one place in the tree, and a GPU is never also a bridge."""
    where: dict[str, str] = {}
    bridges = {part for p in paths for part in p.split("/")[1:-1]}
    for p in paths:
        parts = p.split("/")
        if parts[-1] in bridges:
            return False
        for i in range(1, len(parts)):
            if where.setdefault(parts[i], "/".join(parts[:i])) != "/".join(parts[:i]):
                return False
    return True


@settings(max_examples=30, deadline=None)
@given(spec=node_specs)
def test_random_trees_read_back_consistently(
    spec: dict, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("rand") / "sys"
    samples.build(spec, root)
    topo = read_node(str(root))
    endpoints = {g["path"].rsplit("/", 1)[1] for g in spec["gpus"]}
    assert {g.pci.address for g in topo.gpus} == {f"0000:{e}" for e in endpoints}
    rel = relations(topo)
    assert all(rel[a][a] == "X" for a in rel)


# ---------------------------------------------------------------- the RDMA netns mode


def test_netns_mode_of_the_samples(sample_nodes: dict[str, NodeTopology]) -> None:
    assert sample_nodes["hgx-h100-roce"].netns_mode is NetnsMode.SHARED
    assert sample_nodes["sriov-exclusive"].netns_mode is NetnsMode.EXCLUSIVE


def _ib_core(tmp_path: Path, mode: str) -> Path:
    """A small tree with ib_core as a kernel leaves it in `mode` (`none`: no parameter)."""
    root = tmp_path / "sys"
    samples.build({**samples.load("workstation").spec, "netns_mode": mode}, root)
    return root


@pytest.mark.parametrize(
    ("mode", "written", "expected"),
    [
        ("shared", None, NetnsMode.SHARED),
        ("exclusive", None, NetnsMode.EXCLUSIVE),
        ("none", None, NetnsMode.SHARED),  # an older kernel: no exclusive mode
        ("shared", "0\n", NetnsMode.EXCLUSIVE),  # as `modprobe ib_core netns_mode=0` spells it
        ("shared", "1", NetnsMode.SHARED),
    ],
)
def test_netns_mode_from_the_ib_core_parameter(
    tmp_path: Path, mode: str, written: str | None, expected: NetnsMode
) -> None:
    root = _ib_core(tmp_path, mode)
    if written is not None:
        (root / NETNS_PARAMETER).write_text(written)
    asked: list[str] = []
    topo = read_node(str(root), netlink=lambda: asked.append("netlink") or NetnsMode.EXCLUSIVE)
    assert topo.netns_mode is (expected if mode != "none" else NetnsMode.EXCLUSIVE)
    assert asked == ([] if mode != "none" else ["netlink"])  # asked only where the file is silent
    assert read_node(str(root)).netns_mode is expected
    assert not [w for w in topo.warnings if "netns" in w.path]


@pytest.mark.parametrize("junk", ["maybe\n", "\xff\xfe", "Y\nN\n", ""])
def test_junk_in_the_parameter_is_a_warning_and_the_mode_unknown(tmp_path: Path, junk: str) -> None:
    root = _ib_core(tmp_path, "shared")
    (root / NETNS_PARAMETER).write_bytes(junk.encode("latin-1"))
    topo = read_node(str(root))
    assert topo.netns_mode is NetnsMode.UNKNOWN
    assert {w.path for w in topo.warnings} == {NETNS_PARAMETER}
    assert len(topo.hcas) == 2  # the rest of the node is read as ever
    # a live node's RDMA netlink still tells
    assert read_node(str(root), netlink=lambda: NetnsMode.SHARED).netns_mode is NetnsMode.SHARED


def test_an_unreadable_parameter_is_a_warning_naming_it(tmp_path: Path) -> None:
    root = _ib_core(tmp_path, "shared")
    (root / NETNS_PARAMETER).unlink()
    (root / NETNS_PARAMETER).mkdir()  # read() fails (EISDIR), as an EACCES would
    topo = read_node(str(root), netlink=lambda: None)
    assert topo.netns_mode is NetnsMode.UNKNOWN
    assert [(w.path, w.message) for w in topo.warnings] == [(NETNS_PARAMETER, "Is a directory")]


def test_a_sample_with_no_such_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(samples.SampleError, match="netns_mode 'sometimes'"):
        samples.build({"netns_mode": "sometimes"}, tmp_path / "sys")


def test_without_ib_core_the_mode_is_unknown(sample_trees: dict[str, Path], tmp_path: Path) -> None:
    root = Path(shutil.copytree(sample_trees["workstation"], tmp_path / "sys", symlinks=True))
    shutil.rmtree(root / "module")
    assert read_node(str(root)).netns_mode is NetnsMode.UNKNOWN
    assert read_node(str(root), netlink=lambda: NetnsMode.SHARED).netns_mode is NetnsMode.SHARED


def test_hcas_moved_into_pods_are_named_by_their_verbs_devices(
    sample_trees: dict[str, Path], sample_nodes: dict[str, NodeTopology]
) -> None:
    root = str(sample_trees["sriov-exclusive"])
    assert hcas_in_other_namespaces(root) == ["mlx5_2", "mlx5_6"]
    topo = sample_nodes["sriov-exclusive"]
    assert [h.name for h in topo.hcas] == [f"mlx5_{i}" for i in (0, 1, 3, 4, 5, 7, 8, 9)]
    assert topo.hca("mlx5_3").uverbs == "uverbs3"  # type: ignore[union-attr]
    assert hcas_in_other_namespaces(str(sample_trees["hgx-h100-roce"])) == []


@pytest.fixture
def gb300(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    samples.build(samples.load("gb300-cx8").spec, root)
    return root


def test_a_connectx8_is_tied_to_its_data_direct_function_by_the_vuid_in_their_vpd(
    gb300: Path,
) -> None:
    topo = read_node(str(gb300))
    for k in range(4):
        hca = topo.hca(f"mlx5_{k}")
        assert hca is not None and hca.pci is not None and hca.data_direct is not None
        dd = hca.data_direct
        assert (dd.vendor, dd.device, dd.driver) == ("0x15b3", "0x2100", "mlx5_ib")
        assert hca.pcie_root == dd.root != hca.pci.root  # pairs by the DMA function's root
        assert hca.pcie_root == topo.gpus[k].pci.root
    bf3 = topo.hca("mlx5_4")
    assert bf3 is not None and bf3.data_direct is None and bf3.pcie_root == "pci0006:00"
    assert topo.warnings == ()


def test_a_data_direct_function_whose_vpd_cannot_be_read_pairs_nothing_and_says_so(
    gb300: Path,
) -> None:
    dd = Path(os.path.realpath(gb300 / "bus/pci/devices/0008:04:00.0"))
    (dd / "vpd").unlink()  # as for an agent that is not root: the file is root's alone
    topo = read_node(str(gb300))
    hca = topo.hca("mlx5_0")
    assert hca is not None and hca.pci is not None
    assert hca.data_direct is None and hca.pcie_root == hca.pci.root
    assert [w.path for w in topo.warnings] == ["bus/pci/devices/0008:04:00.0/vpd"]
    other = topo.hca("mlx5_1")
    assert other is not None and other.data_direct is not None  # the others are still tied
