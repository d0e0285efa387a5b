"""The in-pod checks on materialised sample trees with /dev and /proc built beside them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rdmaplane.doctor import checks
from rdmaplane.doctor.verdict import Status
from rdmaplane.model import PhysState, PortState

CAP_FULL_POD = "00000000a80475fb"  # docker default set + IPC_LOCK (bit 14)
CAP_DEFAULT = "00000000a80425fb"  # docker default set, no IPC_LOCK


def make_pod(
    root: Path,
    uverbs: list[str],
    *,
    rdma_cm: bool = True,
    cap: str = CAP_FULL_POD,
    memlock: str = "unlimited",
    modules: str = "nvidia_peermem 16384 0 - Live 0x0000000000000000\n",
    gpus: tuple[int, ...] = (),
) -> None:
    ib = root / "dev/infiniband"
    ib.mkdir(parents=True)
    for u in uverbs:
        (ib / u).touch()
    if rdma_cm:
        (ib / "rdma_cm").touch()
    (root / "dev/shm").mkdir()
    for g in gpus:
        (root / f"dev/nvidia{g}").touch()
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/status").write_text(
        f"Name:\tpython3\nCapInh:\t0000000000000000\nCapPrm:\t{cap}\nCapEff:\t{cap}\n"
    )
    (root / "proc/self/limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        f"Max locked memory         {memlock}            {memlock}            bytes     \n"
    )
    (root / "proc/modules").write_text("mlx5_ib 479232 0 - Live 0x0000000000000000\n" + modules)


def host(root: Path, env: dict[str, str] | None = None, **kw) -> checks.Host:
    kw.setdefault("find_library", lambda name: f"lib{name}.so.1")
    kw.setdefault("shm_size", lambda path: 16 << 30)
    return checks.Host(root=root, env=env or {}, **kw)


def pod_root(tmp_path: Path, sys_root: Path) -> Path:
    """A pod's root: its own /dev and /proc, the node's (shared) sysfs."""
    (tmp_path / "sys").symlink_to(sys_root)
    return tmp_path


@pytest.fixture
def roce(tmp_path, sample_trees):
    return pod_root(tmp_path, sample_trees["hgx-h100-roce"])


@pytest.fixture
def h200(tmp_path, sample_trees):
    return pod_root(tmp_path, sample_trees["hgx-h200-ib"])


def by_name(findings):
    return {f.name: f for f in findings}


def test_healthy_roce_pod(roce):
    make_pod(roce, ["uverbs0", "uverbs1"], gpus=(0, 1))
    res = by_name(
        checks.run_all(host(roce, {"NCCL_IB_HCA": "=mlx5_0,mlx5_1", "NCCL_IB_GID_INDEX": "3"}))
    )
    assert {n: f.status for n, f in res.items()} == {n: Status.PASS for n in res}
    assert "mlx5_0(uverbs0), mlx5_1(uverbs1)" in res["rdma-devices"].detail
    assert "7 more in sysfs" in res["rdma-devices"].detail
    assert "GPU0→mlx5_0 PIX" in res["gpu-nic"].detail


def test_no_device_nodes(roce):
    make_pod(roce, [], rdma_cm=False)
    res = by_name(checks.run_all(host(roce)))
    assert res["rdma-devices"].status == Status.FAIL
    assert "rdmaplane.io/hca" in (res["rdma-devices"].fix or "")
    assert res["ports-active"].status == Status.FAIL


def test_rdma_cm_missing_warns(roce):
    make_pod(roce, ["uverbs0"], rdma_cm=False)
    f = checks.devices(host(roce), checks.load(host(roce)))
    assert f.status == Status.WARN and "rdma_cm" in f.detail


def port_down(node: checks.Node, hca: str) -> checks.Node:
    """The node as the reader models it after `mlx5_1/ports/1/state` turned `1: DOWN`."""

    def down(h):
        if h.name != hca:
            return h
        ports = tuple(
            replace(p, state=PortState.DOWN, phys_state=PhysState.DISABLED) for p in h.ports
        )
        return replace(h, ports=ports)

    return checks.Node(
        replace(node.topo, hcas=tuple(map(down, node.topo.hcas))), tuple(map(down, node.usable))
    )


def test_device_node_without_sysfs_counterpart(roce):
    make_pod(roce, ["uverbs0", "uverbs12"])
    f = checks.devices(host(roce), checks.load(host(roce)))
    assert f.status == Status.WARN
    assert "uverbs12 in /dev/infiniband match no HCA" in f.detail


def test_port_down(roce):
    make_pod(roce, ["uverbs0", "uverbs1"])
    h = host(roce, {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": "3"})
    res = by_name(checks.run_all(h, port_down(checks.load(h), "mlx5_1")))
    assert res["ports-active"].status == Status.WARN
    assert "mlx5_1:1" in res["ports-active"].detail
    assert res["nccl-env"].status == Status.FAIL
    assert "mlx5_1:1 is not ACTIVE" in res["nccl-env"].detail


def test_wrong_gid_index_link_local(roce):
    make_pod(roce, ["uverbs0", "uverbs1"])
    f = checks.nccl_env(host(roce, {"NCCL_IB_GID_INDEX": "1"}), checks.load(host(roce)))
    assert f.status == Status.FAIL
    assert "mlx5_0:1 is link-local" in f.detail
    assert f.fix == "export NCCL_IB_GID_INDEX=3"


def test_gid_index_roce_v1_and_empty(roce):
    make_pod(roce, ["uverbs0"])
    node = checks.load(host(roce))
    assert "is RoCE v1" in checks.nccl_env(host(roce, {"NCCL_IB_GID_INDEX": "2"}), node).detail
    assert "is empty" in checks.nccl_env(host(roce, {"NCCL_IB_GID_INDEX": "7"}), node).detail
    six = checks.nccl_env(
        host(roce, {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_ADDR_FAMILY": "AF_INET6"}), node
    )
    assert "is IPv4, not IPv6" in six.detail


def test_gid_index_unset_suggests_the_index(roce):
    make_pod(roce, ["uverbs0"])
    f = checks.nccl_env(host(roce), checks.load(host(roce)))
    assert f.status == Status.WARN and f.fix == "export NCCL_IB_GID_INDEX=3"
    auto = checks.nccl_env(host(roce, {"NCCL_IB_GID_INDEX": "-1"}), checks.load(host(roce)))
    assert auto.status == Status.PASS


def test_gid_index_differs_per_hca_on_degraded_node(tmp_path, sample_trees):
    root = pod_root(tmp_path, sample_trees["degraded"])
    make_pod(root, ["uverbs0", "uverbs2"])
    node = checks.load(host(root))
    f = checks.nccl_env(host(root, {"NCCL_IB_GID_INDEX": "3"}), node)
    assert f.status == Status.FAIL
    assert "mlx5_0:1 is IPv6, not IPv4" in f.detail
    assert "mlx5_4:1 is empty" in f.detail
    assert "NCCL_IB_GID_INDEX=-1" in (f.fix or "") and "mlx5_0:1→5" in (f.fix or "")
    unset = checks.nccl_env(host(root), node)
    assert unset.status == Status.WARN and "differs per HCA" in unset.detail


def test_prefix_ambiguous_nccl_ib_hca(h200):
    make_pod(h200, ["uverbs0", "uverbs5", "uverbs6", "uverbs7"])
    h = host(h200, {"NCCL_IB_HCA": "mlx5_0,mlx5_1,mlx5_9"})
    f = checks.nccl_env(h, checks.load(h))
    assert f.status == Status.FAIL
    assert "'mlx5_1' is a prefix: it also selects mlx5_10, mlx5_11" in f.detail
    assert "NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_9" in (f.fix or "")
    exact = host(h200, {"NCCL_IB_HCA": "=mlx5_0,mlx5_9,mlx5_10,mlx5_11"})
    assert checks.nccl_env(exact, checks.load(exact)).status == Status.PASS


def test_nccl_ib_hca_names_a_missing_or_unallocated_device(h200):
    make_pod(h200, ["uverbs0"])
    h = host(h200, {"NCCL_IB_HCA": "=mlx5_0,mlx5_99,mlx5_3"})
    f = checks.nccl_env(h, checks.load(h))
    assert "entry 'mlx5_99' matches no HCA" in f.detail
    assert "selects mlx5_3 but the pod has no device node" in f.detail
    bad = host(h200, {"NCCL_IB_HCA": "mlx5_0:one"})
    assert "is not a number" in checks.nccl_env(bad, checks.load(bad)).detail


def test_socket_ifname(roce):
    make_pod(roce, ["uverbs0"])
    node = checks.load(host(roce))
    ok = checks.nccl_env(host(roce, {"NCCL_SOCKET_IFNAME": "eno", "NCCL_IB_GID_INDEX": "3"}), node)
    assert ok.status == Status.PASS
    bad = checks.nccl_env(
        host(roce, {"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_IB_GID_INDEX": "3"}), node
    )
    assert bad.status == Status.FAIL and "matches no interface" in bad.detail


def test_cross_socket_pairs_flagged(tmp_path, sample_trees):
    root = pod_root(tmp_path, sample_trees["pcie-l40s-split"])
    make_pod(root, ["uverbs0", "uverbs1"], gpus=(0, 4))
    f = checks.gpu_nic(host(root), checks.load(host(root)))
    assert f.status == Status.WARN
    assert "GPU4 reach their nearest NIC only across sockets (SYS)" in f.detail
    assert "GPU0→mlx5_0 PHB" in f.detail
    assert "GPU1" not in f.detail  # not given to this pod


def test_memlock_and_ipc_lock(roce):
    make_pod(roce, ["uverbs0"], cap=CAP_DEFAULT, memlock="65536")
    res = by_name(checks.run_all(host(roce)))
    assert res["memlock"].status == Status.FAIL and "64.0 KiB" in res["memlock"].detail
    assert res["ipc-lock"].status == Status.FAIL
    assert "IPC_LOCK" in (res["ipc-lock"].fix or "")


def test_ipc_lock_missing_with_unlimited_memlock_only_warns(roce):
    make_pod(roce, ["uverbs0"], cap=CAP_DEFAULT)
    f = checks.ipc_lock(host(roce), checks.load(host(roce)))
    assert f.status == Status.WARN


def test_libraries_missing(roce):
    make_pod(roce, ["uverbs0"])
    f = checks.libraries(host(roce, find_library=lambda n: None), checks.load(host(roce)))
    assert f.status == Status.FAIL and "libibverbs and libmlx5" in f.detail


def test_libraries_missing_on_a_non_rdma_host_warns(tmp_path):
    (tmp_path / "sys").mkdir()
    h = host(tmp_path, find_library=lambda n: None)
    res = by_name(checks.run_all(h))
    assert res["libibverbs"].status == Status.WARN
    assert res["rdma-devices"].status == Status.FAIL
    assert res["memlock"].status == Status.WARN  # no proc/self/limits under this root


def test_peermem_module(roce, tmp_path_factory):
    make_pod(roce, ["uverbs0"], modules="")
    node = checks.load(host(roce))
    assert checks.gdr_module(host(roce), node).status == Status.WARN
    other = tmp_path_factory.mktemp("host")
    (other / "sys/module/nvidia_peermem").mkdir(parents=True)
    assert checks.gdr_module(host(other), node).status == Status.PASS


def test_small_dev_shm(roce):
    make_pod(roce, ["uverbs0"])
    f = checks.shm(host(roce, shm_size=lambda p: 64 << 20), checks.load(host(roce)))
    assert f.status == Status.FAIL and "64.0 MiB" in f.detail


def test_real_statvfs_of_the_tree(roce):
    make_pod(roce, ["uverbs0"])
    f = checks.shm(checks.Host(root=roce, env={}), checks.load(host(roce)))
    assert f.status in (Status.PASS, Status.FAIL) and "/dev/shm is" in f.detail
