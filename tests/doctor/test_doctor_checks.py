"""The in-pod checks on materialised sample trees with /dev and /proc built beside them."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from rdmaplane.adapters.discovery.sysfs import read_node
from rdmaplane.core.model import PhysState, PortState
from rdmaplane.services.doctor import checks
from rdmaplane.services.doctor.policy.verdict import Status

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
    minors: dict[int, int] | None = None,
) -> None:
    """A pod's /dev and /proc. `gpus`: the /dev/nvidiaN minors it has; `minors`: minor → the
    GPU (PCI order index) the driver gave it, written as the driver's /proc information files
    (identity when not given)."""
    ib = root / "dev/infiniband"
    ib.mkdir(parents=True)
    for u in uverbs:
        (ib / u).touch()
    if rdma_cm:
        (ib / "rdma_cm").touch()
    (root / "dev/shm").mkdir()
    for g in gpus:
        (root / f"dev/nvidia{g}").touch()
    if gpus:
        write_gpu_information(root, minors or {g: g for g in gpus})
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/status").write_text(
        f"Name:\tpython3\nCapInh:\t0000000000000000\nCapPrm:\t{cap}\nCapEff:\t{cap}\n"
    )
    (root / "proc/self/limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        f"Max locked memory         {memlock}            {memlock}            bytes     \n"
    )
    (root / "proc/modules").write_text("mlx5_ib 479232 0 - Live 0x0000000000000000\n" + modules)


def write_gpu_information(root: Path, minors: dict[int, int]) -> None:
    """`/proc/driver/nvidia/gpus/<pci>/information` as the driver prints it."""
    gpus = read_node(str(root / "sys")).gpus
    for minor, index in minors.items():
        address = gpus[index].pci.address
        folder = root / "proc/driver/nvidia/gpus" / address
        folder.mkdir(parents=True)
        (folder / "information").write_text(
            "Model:           NVIDIA H100 80GB HBM3\n"
            "IRQ:             345\n"
            f"GPU UUID:        GPU-{index:08x}-5c1d-4a7e-9b2f-0c3d4e5f6a7b\n"
            "Video BIOS:      96.00.74.00.01\n"
            "Bus Type:        PCIe\n"
            "DMA Size:        52 bits\n"
            "DMA Mask:        0xfffffffffffff\n"
            f"Bus Location:    {address}\n"
            f"Device Minor:    {minor}\n"
            "GPU Excluded:    No\n"
        )


def host(root: Path, env: dict[str, str] | None = None, **kw) -> checks.Host:
    kw.setdefault("find_library", lambda name: f"lib{name}.so.1")
    kw.setdefault("shm_size", lambda path: 16 << 30)
    kw.setdefault("nvml_minors", dict)
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


def port_down(node: checks.CheckedNode, hca: str) -> checks.CheckedNode:
    """The node as the reader models it after `mlx5_1/ports/1/state` turned `1: DOWN`."""

    def down(h):
        if h.name != hca:
            return h
        ports = tuple(
            replace(p, state=PortState.DOWN, phys_state=PhysState.DISABLED) for p in h.ports
        )
        return replace(h, ports=ports)

    return checks.CheckedNode(
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
    # the fix names the pod's own HCAs the value meant (it holds no mlx5_1)
    assert f.fix == "export NCCL_IB_HCA==mlx5_0,mlx5_9"
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


@pytest.mark.parametrize(
    ("value", "uverbs", "fix"),
    [
        # the pod holds mlx5_0 and mlx5_3 (hgx-h200-ib: uverbs0 and uverbs1)
        # a prefix naming no device selects every mlx5 HCA, most not the pod's
        ("mlx5", ["uverbs0", "uverbs1"], "export NCCL_IB_HCA==mlx5_0,mlx5_3"),
        ("=mlx5_0,mlx5_1", ["uverbs0", "uverbs1"], "export NCCL_IB_HCA==mlx5_0"),
        ("mlx5_0,mlx5_1", ["uverbs0", "uverbs1"], "export NCCL_IB_HCA==mlx5_0"),
        ("mlx5_7", ["uverbs0", "uverbs1"], "export NCCL_IB_HCA==mlx5_0,mlx5_3"),
        ("mlx5_0:2", ["uverbs0"], "export NCCL_IB_HCA==mlx5_0"),
    ],
)
def test_every_nccl_ib_hca_fix_works_in_the_pod(h200, value, uverbs, fix):
    """The fix's value, set in the same pod, passes the same check: it names the pod's own
    HCAs, exactly."""
    make_pod(h200, uverbs)
    node = checks.load(host(h200))
    f = checks.nccl_env(host(h200, {"NCCL_IB_HCA": value}), node)
    assert f.status == Status.FAIL and f.fix == fix, f
    fixed = fix.removeprefix("export NCCL_IB_HCA=")
    assert checks.nccl_env(host(h200, {"NCCL_IB_HCA": fixed}), node).status == Status.PASS


def test_infiniband_and_roce_together_fail_with_a_fix_of_one_link_layer(h200):
    """hgx-h200-ib: mlx5_0 is InfiniBand, mlx5_1 RoCE (storage). The same verdict as
    `rdmaplane env` (exit 1) and the NCCL log rule `mixed-link-layers` (FAIL)."""
    make_pod(h200, ["uverbs0", "uverbs8", "uverbs1"])  # mlx5_0, mlx5_1, mlx5_3
    node = checks.load(host(h200))
    for env, fix in (
        ({}, "export NCCL_IB_HCA==mlx5_0,mlx5_3"),  # NCCL takes every device it can open
        ({"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}, "export NCCL_IB_HCA==mlx5_0"),
    ):
        f = checks.nccl_env(host(h200, env), node)
        assert f.status == Status.FAIL and "InfiniBand and RoCE ports together" in f.detail
        assert fix in (f.fix or "").split("; ")
    one = host(h200, {"NCCL_IB_HCA": "=mlx5_0,mlx5_3"})
    assert checks.nccl_env(one, node).status == Status.PASS


def test_the_socket_interface_fix_is_never_loopback(roce):
    make_pod(roce, ["uverbs0"])
    node = checks.load(host(roce))
    f = checks.nccl_env(host(roce, {"NCCL_SOCKET_IFNAME": "=eth9", "NCCL_IB_GID_INDEX": "3"}), node)
    assert f.status == Status.FAIL and f.fix is not None and "lo" not in f.fix.split("=")
    fixed = f.fix.removeprefix("export NCCL_SOCKET_IFNAME=")
    ok = host(roce, {"NCCL_SOCKET_IFNAME": fixed, "NCCL_IB_GID_INDEX": "3"})
    assert checks.nccl_env(ok, node).status == Status.PASS


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


def test_low_memlock_without_ipc_lock_fails_once(roce):
    make_pod(roce, ["uverbs0"], cap=CAP_DEFAULT, memlock="65536")
    res = by_name(checks.run_all(host(roce)))
    assert "ipc-lock" not in res  # judged together with memlock: one problem, one row
    f = res["memlock"]
    assert f.status == Status.FAIL and "64.0 KiB" in f.detail and "IPC_LOCK not" in f.detail
    assert "IPC_LOCK" in (f.fix or "")


def test_ipc_lock_lifts_the_memlock_limit(roce):
    """The issue's case: memlock FAIL 8 MiB beside ipc-lock PASS. With CAP_IPC_LOCK the kernel
    does not apply RLIMIT_MEMLOCK to RDMA memory registration."""
    make_pod(roce, ["uverbs0"], cap=CAP_FULL_POD, memlock=str(8 << 20))
    f = checks.memlock(host(roce), checks.load(host(roce)))
    assert f.status == Status.PASS
    assert "IPC_LOCK" in f.detail and "8.0 MiB" in f.detail and "does not apply" in f.detail


def test_unlimited_memlock_without_ipc_lock_passes(roce):
    make_pod(roce, ["uverbs0"], cap=CAP_DEFAULT)
    f = checks.memlock(host(roce), checks.load(host(roce)))
    assert f.status == Status.PASS and "unlimited" in f.detail


def test_large_finite_memlock_without_ipc_lock_warns(roce):
    make_pod(roce, ["uverbs0"], cap=CAP_DEFAULT, memlock=str(4 << 30))
    f = checks.memlock(host(roce), checks.load(host(roce)))
    assert f.status == Status.WARN and "4.0 GiB" in f.detail


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


def test_gpu_minors_follow_the_drivers_table_not_pci_order(roce):
    """/dev/nvidia0 and /dev/nvidia1 here are the 7th and 8th GPUs in bus order (minors are the
    driver's, read from /proc/driver/nvidia/gpus/<pci>/information)."""
    make_pod(roce, ["uverbs6", "uverbs7"], gpus=(0, 1), minors={0: 6, 1: 7})
    f = checks.gpu_nic(host(roce), checks.load(host(roce)))
    assert f.status == Status.PASS
    assert "GPU6(/dev/nvidia0)→mlx5_6 PIX" in f.detail
    assert "GPU7(/dev/nvidia1)→mlx5_7 PIX" in f.detail
    assert "GPU0" not in f.detail


@dataclass
class LiveHost(checks.Host):
    """A test tree treated as this machine, so NVML would be asked (the stand-in answers)."""

    live: bool = True


def test_gpu_minors_from_nvml_when_proc_has_none(roce):
    make_pod(roce, ["uverbs2"])
    (roce / "dev/nvidia0").touch()
    topo = checks.load(host(roce)).topo
    nvml = {0: topo.gpus[2].pci.address}
    assert checks.gpu_minors(host(roce, nvml_minors=lambda: nvml)) == {}  # a tree: NVML unasked
    live = LiveHost(root=roce, env={}, find_library=lambda n: "x", nvml_minors=lambda: nvml)
    assert checks.gpu_minors(live) == nvml
    f = checks.gpu_nic(live, checks.load(live))
    assert f.detail == "GPU2(/dev/nvidia0)→mlx5_2 PIX"


def test_gpus_the_driver_does_not_list_are_said_unknown(roce):
    make_pod(roce, ["uverbs0", "uverbs1"])
    (roce / "dev/nvidia0").touch()
    f = checks.gpu_nic(host(roce), checks.load(host(roce)))
    assert "which GPUs /dev/nvidia0 are is unknown" in f.detail
    assert "judged every GPU" in f.detail


def netns_pod(tmp_path: Path, sample: Path, *, hide: list[str] | None, mode: str | None) -> Path:
    """A pod whose sysfs shows the node as a pod in its own network namespace would: in
    exclusive mode `class/infiniband` lacks the HCAs outside the pod's namespace (`hide`;
    None = all), `class/infiniband_verbs` (not namespaced) still lists them. `mode` is what
    ib_core's netns_mode parameter reads (None: a kernel without the parameter)."""
    sys_root = tmp_path / "sys"
    sys_root.mkdir(parents=True)
    for top in sample.iterdir():  # share the sample tree; only class/infiniband is the pod's
        if top.name not in ("class", "module"):
            (sys_root / top.name).symlink_to(top)
    for cls in (sample / "class").iterdir():
        if cls.name != "infiniband":
            (sys_root / "class" / cls.name).parent.mkdir(exist_ok=True)
            (sys_root / "class" / cls.name).symlink_to(cls)
    infiniband = sys_root / "class/infiniband"
    infiniband.mkdir()
    for entry in (sample / "class/infiniband").iterdir():
        if hide is not None and entry.name not in hide:
            (infiniband / entry.name).symlink_to(os.readlink(entry))
    params = sys_root / "module/ib_core/parameters"
    params.mkdir(parents=True)
    if mode is not None:
        (params / "netns_mode").write_text(f"{mode}\n")
    return tmp_path


def test_exclusive_netns_mode_hides_every_hca(tmp_path, sample_trees):
    root = netns_pod(tmp_path, sample_trees["pcie-l40s-split"], hide=None, mode="N")
    make_pod(root, ["uverbs0", "uverbs1"])
    f = checks.devices(host(root), checks.load(host(root)))
    assert f.status == Status.FAIL
    assert "/dev/infiniband/uverbs0 (mlx5_0), /dev/infiniband/uverbs1 (mlx5_1)" in f.detail
    assert "/sys/class/infiniband is empty" in f.detail
    assert "exclusive network-namespace mode" in f.detail and "TCP sockets" in f.detail
    assert "rdma system set netns shared" in (f.fix or "") and "RDMA CNI" in (f.fix or "")


def test_exclusive_netns_mode_hides_the_allocated_hca(tmp_path, sample_trees):
    """An RDMA CNI moved one VF into the pod; a device plugin also gave it mlx5_1, which stays
    in the host namespace: sysfs misses exactly the allocated HCA."""
    root = netns_pod(tmp_path, sample_trees["pcie-l40s-split"], hide=["mlx5_1"], mode="N")
    make_pod(root, ["uverbs0", "uverbs1"])
    f = checks.devices(host(root), checks.load(host(root)))
    assert f.status == Status.FAIL
    assert "uverbs1 (mlx5_1)" in f.detail and "uverbs0" not in f.detail
    assert "lacks their HCAs" in f.detail


def test_shared_mode_blames_the_sysfs_not_the_netns(tmp_path, sample_trees):
    root = netns_pod(tmp_path, sample_trees["pcie-l40s-split"], hide=None, mode="Y")
    make_pod(root, ["uverbs0"])
    f = checks.devices(host(root), checks.load(host(root)))
    assert f.status == Status.FAIL and "reads Y (shared)" in f.detail
    assert "mount the node's /sys" in (f.fix or "")


def test_a_kernel_without_the_parameter_is_shared(tmp_path, sample_trees):
    root = netns_pod(tmp_path, sample_trees["pcie-l40s-split"], hide=None, mode=None)
    make_pod(root, ["uverbs0"])
    assert checks.load(host(root)).topo.netns_mode == "shared"


def test_unreadable_mode_still_names_exclusive_mode_as_likely(tmp_path, sample_trees):
    root = netns_pod(tmp_path, sample_trees["pcie-l40s-split"], hide=None, mode="junk\x00")
    make_pod(root, ["uverbs0"])
    assert checks.load(host(root)).topo.netns_mode == "unknown"
    f = checks.devices(host(root), checks.load(host(root)))
    assert f.status == Status.FAIL and "likely cause" in f.detail


def test_both_modes_with_every_hca_visible_pass(tmp_path, sample_trees):
    for mode in ("Y", "N"):
        root = netns_pod(tmp_path / mode, sample_trees["pcie-l40s-split"], hide=[], mode=mode)
        make_pod(root, ["uverbs0"])
        assert checks.devices(host(root), checks.load(host(root))).status == Status.PASS


def test_hostile_proc_and_sys_files_are_findings_not_crashes(roce):
    """Binary junk, truncated lines and directories where /proc and /sys have files."""
    make_pod(roce, ["uverbs0"], gpus=(0,))
    (roce / "proc/self/limits").write_bytes(b"Max locked memory\n\xff\xfe\x00")
    (roce / "proc/self/status").write_text("CapEff:\n")
    (roce / "proc/modules").unlink()
    (roce / "proc/modules").mkdir()
    info = next((roce / "proc/driver/nvidia/gpus").glob("*/information"))
    info.write_bytes(b"\xff" * 64)
    findings = by_name(checks.run_all(host(roce)))
    assert findings["memlock"].status == Status.WARN
    assert "not text" in findings["memlock"].detail and "CapEff" in findings["memlock"].detail
    assert findings["gpudirect-rdma"].status == Status.WARN
    assert "which GPUs /dev/nvidia0 are is unknown" in findings["gpu-nic"].detail
    (roce / "proc/self/limits").write_text("Max locked memory\n")
    assert "cannot parse" in checks.memlock(host(roce), checks.load(host(roce))).detail
