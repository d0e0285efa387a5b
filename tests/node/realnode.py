"""A real node: the kubelet v1.37.2 and containerd v2 (runc) on this machine, against the test
control plane (`tests/e2e/controlplane.py`), leaving the host as it was.

Both run in a mount namespace of their own, held by a small `sh` (`unshare -m --propagation
private`), in which:

- `/run`, `/var/lib` and `/var/log` are private tmpfs mounts: containerd's shim sockets
  (`/run/containerd/s`, fixed), network namespaces, the CNI cache, pod logs and the
  `/var/log/containers` links stay inside; `/var/lib/kubelet` is this node's own folder
  (`kubelet_dir`), so plugins outside the namespace reach the kubelet's sockets there (the
  device-plugin socket path `/var/lib/kubelet/device-plugins/` is fixed in the kubelet);
- every kernel tunable the kubelet wants and the host does not have is a file of ours
  bind-mounted over its `/proc/sys` entry (with `protectKernelDefaults` the kubelet only reads
  them);
- `/dev` is an overlay of the host's with `/dev/infiniband` bound to `dev_root/infiniband`:
  character devices made here with the numbers of the real ones, which runc puts into the
  containers the device plugin names them for;
- `/sys/devices/system/node` shows `numa_nodes` NUMA nodes (this machine's CPUs and memory
  split among them), the machine the Topology Manager and the sample trees assume.

The settings this machine needs (`../shared/field-notes.md`): `failCgroupV1: false` and the
cgroupfs driver on its cgroup-v1 hierarchies; `restrict_oom_score_adj` (root lacks
CAP_SYS_RESOURCE, runc cannot lower a container's OOM score); runc, not crun; a busybox `sleep`
as the pause image; a CNI bridge without gateway or masquerading (neither forwarding nor
firewall rules on the host); `makeIPTablesUtilChains: false` and an `iptables` on the kubelet's
PATH that only fails. The node IP is the host's own address. Everything started is stopped by
PID: the kubelet, containerd, every container (the processes in this node's cgroups) and shim
(the processes left in its namespace); then its cgroups, the CNI bridge and the namespace go.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from lightkube import ApiError
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from tests.e2e.controlplane import DIE_WITH_PARENT, KubeCluster, Process, free_port
from tests.node import hoststate

NODE_NAME = "rdmaplane-node"  # the tier's node; another one needs a name of its own
BUSYBOX = "rdmaplane.test/busybox:node"
PYTHON = "rdmaplane.test/python:node"
RUNC = "/usr/sbin/runc"
WORKDIR_PREFIX = "rpn-"  # short: a node's unix sockets live under its folder (107 bytes a path)
IN_USE = ".in-use"  # locked while the folder's node runs
UNLOCKED_GRACE_S = 600.0  # a folder without the lock file: being made, or an older run's
NODE_FREE_BYTES = 2 << 30  # two nodes' containerd roots (each ~0.6 GB: rdmaplane's image unpacked)
NODE_BINARIES = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "bridge", "host-local",
                 "loopback")  # fmt: skip
START_S = 120.0
# The device numbers of the RDMA character devices (drivers/infiniband: IB_UVERBS_BASE_MINOR,
# IB_UMAD_MINOR_BASE, IB_ISSM_MINOR_BASE on major 231; rdma_cm is a misc device).
IB_MAJOR = 231
_IB_MINOR_BASE = {"umad": 0, "issm": 64, "uverbs": 192}
RDMA_CM = (10, 58)
_IPTABLES = ("iptables", "ip6tables", "iptables-save", "ip6tables-save", "iptables-restore",
             "ip6tables-restore", "iptables-legacy", "iptables-nft", "nft")  # fmt: skip


class NodeError(RuntimeError):
    """The node did not come up, or did not go away cleanly; says what and where its logs are."""


@dataclass
class NodeSettings:
    """What a test may choose about the kubelet; a change takes a kubelet restart."""

    topology_policy: str = "best-effort"
    topology_scope: str = "container"


def host_address() -> str:
    """The host's first global IPv4 address: the kubelet's node IP may not be loopback."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "scope", "global"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for line in out.splitlines():
        return line.split()[3].split("/")[0]
    raise NodeError("this machine has no global IPv4 address for the kubelet's node IP")


def make_device_nodes(sysfs: Path, dev_root: Path) -> Path:
    """Character devices under `dev_root/infiniband` for every uverbs/umad/issm device of a
    sysfs tree, and `rdma_cm`, with the real device numbers (they open nothing on this
    machine; runc and the CRI only need them to be character devices)."""
    folder = dev_root / "infiniband"
    folder.mkdir(parents=True, exist_ok=True)
    for cls in ("infiniband_verbs", "infiniband_mad"):
        for entry in sorted((sysfs / "class" / cls).iterdir()):
            kind = entry.name.rstrip("0123456789")
            if entry.is_symlink() and kind in _IB_MINOR_BASE:
                minor = _IB_MINOR_BASE[kind] + int(entry.name[len(kind) :])
                _mknod(folder / entry.name, IB_MAJOR, minor)
    _mknod(folder / "rdma_cm", *RDMA_CM)
    return dev_root


def _mknod(path: Path, major: int, minor: int) -> None:
    if not path.exists():
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))  # S_IFCHR


def _numa_tree(root: Path, nodes: int) -> None:
    """/sys/devices/system/node as cadvisor reads it, the CPUs dealt out round-robin."""
    cpus = sorted(
        int(p.name[3:])
        for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*")
        if (p / "topology").is_dir()
    )
    total_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    for name in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        (root / name).write_text(f"0-{nodes - 1}\n" if nodes > 1 else "0\n")
    for n in range(nodes):
        node = root / f"node{n}"
        (node / "hugepages" / "hugepages-2048kB").mkdir(parents=True)
        for counter in ("nr_hugepages", "free_hugepages", "surplus_hugepages"):
            (node / "hugepages" / "hugepages-2048kB" / counter).write_text("0\n")
        mine = [c for i, c in enumerate(cpus) if i % nodes == n]
        for cpu in mine:
            (node / f"cpu{cpu}").symlink_to(f"/sys/devices/system/cpu/cpu{cpu}")
        (node / "cpulist").write_text(",".join(map(str, mine)) + "\n")
        kb = total_kb // nodes
        (node / "meminfo").write_text(
            f"Node {n} MemTotal:       {kb} kB\nNode {n} MemFree:        {kb // 2} kB\n"
            f"Node {n} MemUsed:        {kb - kb // 2} kB\n"
        )
        (node / "distance").write_text(" ".join("10" if m == n else "20" for m in range(nodes)))


def remove_stale_workdirs(parent: Path = Path("/tmp")) -> list[str]:
    """Remove the node folders of runs killed before their end (each ~0.6 GB of unpacked images,
    which a shared disk does not keep room for run after run): those whose lock nobody holds.
    Say what was removed, with its size."""
    removed = []
    for folder in sorted(parent.glob(WORKDIR_PREFIX + "*")):
        if not _stale(folder):
            continue
        size = sum(
            f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink()
        )
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(f"{folder} ({size / 1e6:.0f} MB)")
    return removed


def _stale(folder: Path) -> bool:
    try:
        fd = os.open(folder / IN_USE, os.O_RDONLY)
    except FileNotFoundError:
        with contextlib.suppress(FileNotFoundError):
            return time.time() - folder.stat().st_mtime > UNLOCKED_GRACE_S
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a live node's
    finally:
        os.close(fd)
    return True


@contextlib.contextmanager
def node_workdir(keep: bool = False) -> Iterator[Path]:
    """A fresh folder for one node, locked while in use, removed after unless `keep` (then the
    next run removes it). Before it is made, killed runs' folders go; a `NodeError` if the disk
    then lacks room for a node, rather than pods evicted or an image half unpacked later."""
    for gone in remove_stale_workdirs():
        warnings.warn(f"removed {gone}, left by an earlier run", stacklevel=3)
    free = shutil.disk_usage("/tmp").free
    if free < NODE_FREE_BYTES:
        raise NodeError(
            f"/tmp has {free / 1e9:.1f} GB free; the node tier needs "
            f"{NODE_FREE_BYTES / 1e9:.1f} GB (containerd unpacks the pods' images there)"
        )
    path = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX, dir="/tmp"))
    with (path / IN_USE).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            if not keep:
                shutil.rmtree(path, ignore_errors=True)


class RealNode:
    """One node's files, its namespace and processes. `start()` once, `stop()` once (also after
    a failed start); `restart_kubelet()` between them as often as a test likes. Two nodes on
    one host need their own `name` and `index` (the pods' bridge `rdpn<index>` on the host, no
    address, no gateway; their addresses in 10.222.<index>.0/24)."""

    def __init__(
        self,
        bin_dir: Path,
        cluster: KubeCluster,
        workdir: Path,
        images: Sequence[Path],
        *,
        client_ca: Path,
        name: str = NODE_NAME,
        index: int = 0,
        numa_nodes: int = 2,
        settings: NodeSettings | None = None,
    ) -> None:
        self.bin_dir = bin_dir
        self.cluster = cluster
        self.workdir = workdir
        self.images = list(images)
        self.client_ca = client_ca  # whose client certificates the kubelet's server accepts
        self.name = name
        self.bridge = f"rdpn{index}"
        self.pod_subnet = f"10.222.{index}.0/24"
        self.numa_nodes = numa_nodes
        self.settings = settings or NodeSettings()
        self.node_ip = host_address()
        self.kubelet_dir = workdir / "kubelet"  # /var/lib/kubelet in the namespace
        self.dev_root = workdir / "dev"
        self.cdi_dir = workdir / "cdi"
        self.containerd_socket = workdir / "containerd" / "containerd.sock"
        self.cgroup_root = f"rdmaplane-node-{secrets.token_hex(3)}"
        self.kubelet_port = free_port()
        self.healthz_port = free_port()
        self.holder: subprocess.Popen[bytes] | None = None
        self.containerd: Process | None = None
        self.kubelet: Process | None = None
        self.started_at = 0.0  # when the running kubelet started (wall clock, whole second)

    # --- the namespace

    def _prepare(self) -> None:
        w = self.workdir
        for folder in ("kubelet", "cdi", "cni", "stub", "sysctl", "numa", "devupper", "devwork",
                       "hostdev", "containerd/root", "containerd/state", "s", "logs"):  # fmt: skip
            (w / folder).mkdir(parents=True, exist_ok=True)
        (self.dev_root / "infiniband").mkdir(parents=True, exist_ok=True)
        for name in _IPTABLES:  # the firewall the kubelet and CNI would touch: a failing stub
            stub = w / "stub" / name
            stub.write_text(f'#!/bin/sh\necho "$0 $*" >> {w / "logs" / "iptables-calls"}\nexit 1\n')
            stub.chmod(0o755)
        _numa_tree(w / "numa", self.numa_nodes)
        (w / "cni" / "10-rdmaplane.conflist").write_text(json.dumps(self._cni_config(), indent=1))
        (w / "containerd.toml").write_text(self._containerd_config())
        for cls in (c for c in Path("/sys/fs/cgroup").iterdir() if c.is_dir()):
            self._make_cgroup(cls / self.cgroup_root)

    def _make_cgroup(self, path: Path) -> None:
        path.mkdir(exist_ok=True)
        if path.parent.name == "cpuset":  # a cpuset cgroup takes tasks once it has cpus and mems
            for f in ("cpuset.cpus", "cpuset.mems"):
                (path / f).write_text((path.parent / f).read_text())

    def _namespace_script(self) -> str:
        w = self.workdir
        lines = ["set -eu"]
        for name, want in hoststate.KUBELET_TUNABLES.items():
            if hoststate.read_sysctl(name) != want:
                value = w / "sysctl" / name.replace("/", ".")
                value.write_text(want + "\n")
                lines.append(f"mount --bind {value} /proc/sys/{name}")
        lines += [
            f"mount --bind {w / 'numa'} /sys/devices/system/node",
            f"mount --rbind /dev {w / 'hostdev'}",
            f"mount -t overlay rdmaplane-node-dev -o lowerdir=/dev,upperdir={w / 'devupper'},"
            f"workdir={w / 'devwork'} /dev",
            f"mount --rbind {w / 'hostdev' / 'pts'} /dev/pts",
            f"mount --rbind {w / 'hostdev' / 'shm'} /dev/shm",
            "mkdir -p /dev/infiniband",
            f"mount --bind {self.dev_root / 'infiniband'} /dev/infiniband",
            f"umount -l {w / 'hostdev'}",
        ]
        for private in ("/run", "/var/lib", "/var/log"):
            lines.append(f"mount -t tmpfs -o mode=755 rdmaplane-node {private}")
        lines += [
            "mkdir -p /var/lib/kubelet",
            f"mount --bind {self.kubelet_dir} /var/lib/kubelet",
            "echo ready",
            "exec cat >/dev/null",  # until our end of its stdin closes
        ]
        return "\n".join(lines)

    def _start_namespace(self) -> None:
        self.holder = subprocess.Popen(
            [*DIE_WITH_PARENT, "unshare", "-m", "--propagation", "private", "sh", "-c",
             self._namespace_script()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=(self.workdir / "logs" / "namespace.log").open("wb"),
        )  # fmt: skip
        assert self.holder.stdout is not None
        if self.holder.stdout.readline().strip() != b"ready":
            self.holder.wait()
            raise NodeError(f"the node's namespace did not come up: {self._log('namespace')}")

    def _in_namespace(
        self, binary: Path, args: Sequence[str], log: str, env: Mapping[str, str] = {}
    ) -> Process:
        assert self.holder is not None
        path = ":".join([str(self.workdir / "stub"), str(self.bin_dir), os.environ["PATH"]])
        command = [
            *DIE_WITH_PARENT, "nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", "--",
            "env", f"PATH={path}", *(f"{k}={v}" for k, v in env.items()), str(binary), *args,
        ]  # fmt: skip
        log_path = self.workdir / "logs" / f"{log}.log"
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        return Process(binary, list(args), log_path, popen)

    def _log(self, name: str, lines: int = 30) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else "(no log)"
        return f"{path}:\n" + "\n".join(text.splitlines()[-lines:])

    # --- containerd

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "rdmaplane-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": False,  # with a gateway the plugin turns on ip_forward
                    "ipMasq": False,  # and masquerading adds firewall rules
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": self.pod_subnet}]]},
                }
            ],
        }

    def _containerd_config(self) -> str:
        w = self.workdir / "containerd"
        return f"""\
version = 4
root = "{w / "root"}"
state = "{w / "state"}"
imports = []
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs",
  "io.containerd.snapshotter.v1.blockfile", "io.containerd.nri.v1.nri"]
[plugins."io.containerd.server.v1.grpc"]
  address = "{self.containerd_socket}"
[plugins."io.containerd.server.v1.ttrpc"]
  address = "{w / "containerd.ttrpc.sock"}"
[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "{self.workdir / "s"}"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{BUSYBOX}"
[plugins."io.containerd.cri.v1.runtime"]
  cdi_spec_dirs = ["{self.cdi_dir}"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        Root = "{w / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{self.bin_dir}"]
    conf_dir = "{self.workdir / "cni"}"
"""

    def ctr(self, *args: str, timeout: float = 60) -> str:
        out = subprocess.run(
            [str(self.bin_dir / "ctr"), "--address", str(self.containerd_socket), "-n", "k8s.io",
             *args],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if out.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def _start_containerd(self) -> None:
        self.containerd = self._in_namespace(
            self.bin_dir / "containerd", ["--config", str(self.workdir / "containerd.toml")],
            "containerd",
        )  # fmt: skip

        def answers() -> bool:
            with contextlib.suppress(NodeError, subprocess.TimeoutExpired):
                self.ctr("version", timeout=5)
                return True
            return False

        assert self.containerd is not None
        self.containerd.wait_ready(answers, START_S)
        for image in self.images:
            self.ctr("images", "import", "--no-unpack=false", str(image), timeout=300)

    # --- the kubelet

    def kubelet_config(self) -> dict[str, Any]:
        s = self.settings
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_root}",
            "protectKernelDefaults": True,
            "makeIPTablesUtilChains": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": self.node_ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.client_ca)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "topologyManagerPolicy": s.topology_policy,
            "topologyManagerScope": s.topology_scope,
            # a shared disk's free space is not this test's business: "0%" turns a disk signal
            # off (the kubelet's eviction helpers ignore 0% and 100%); `node_workdir` checks room
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%",
                             "imagefs.available": "0%", "nodefs.inodesFree": "0%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "failSwapOn": False,
            "serializeImagePulls": False,
            "shutdownGracePeriod": "0s",
        }  # fmt: skip
        return config

    def _start_kubelet(self) -> None:
        config = self.kubelet_dir / "config.yaml"  # where a node agent looks for it
        config.write_text(yaml.safe_dump(self.kubelet_config()))
        kubeconfig = self.workdir / "kubelet.kubeconfig"
        if not kubeconfig.exists():
            made = self.cluster.kubeconfig_for(f"system:node:{self.name}", ["system:nodes"])
            shutil.copy(made, kubeconfig)
        self.kubelet = self._in_namespace(
            self.bin_dir / "kubelet",
            [f"--config={config}", f"--kubeconfig={kubeconfig}", f"--node-ip={self.node_ip}",
             f"--hostname-override={self.name}", "--v=2"],
            "kubelet",
        )  # fmt: skip

    def wait_ready(self, since: float | None = None, timeout: float = START_S) -> float:
        """Until the Node is Ready (with a heartbeat at or after `since`, wall-clock seconds):
        the seconds it took."""
        start = time.monotonic()
        assert self.kubelet is not None
        kubelet = self.kubelet

        def ready() -> bool:
            with self.cluster.client() as client:
                try:
                    node = client.get(Node, self.name)
                except ApiError:  # not registered yet
                    return False
            for c in (node.status.conditions if node.status else None) or []:
                if c.type == "Ready" and c.status == "True":
                    beat = c.lastHeartbeatTime.timestamp() if c.lastHeartbeatTime else 0
                    return since is None or beat >= since
            return False

        kubelet.wait_ready(ready, timeout)
        return time.monotonic() - start

    def _schedulable(self) -> None:
        """Lift the taints node admission puts on a new Node (no node lifecycle controller
        runs here to do it)."""
        with self.cluster.client() as client:
            client.patch(Node, self.name, {"spec": {"taints": None}}, patch_type=PatchType.MERGE)

    # --- lifecycle

    def start(self) -> None:
        self._prepare()
        self._start_namespace()
        self._start_containerd()
        self._start_kubelet()
        self.wait_ready()
        self._schedulable()

    def restart_kubelet(self, settings: NodeSettings | None = None) -> float:
        """Stop the kubelet (its pods keep running) and start it again, with `settings` when
        given; returns when the Node is Ready in a status of the new kubelet: the seconds
        since it started (`started_at`, a whole second of wall-clock time)."""
        if settings is not None:
            self.settings = settings
        assert self.kubelet is not None
        self.kubelet.stop()
        # Node heartbeats have whole seconds: one at or after the next second is the new one's
        self.started_at = math.floor(time.time()) + 1.0
        time.sleep(max(0.0, self.started_at - time.time()))
        self._start_kubelet()
        return self.wait_ready(since=self.started_at)

    def remove_stale_bridge(self) -> bool:
        """Remove a bridge of this node's name that a run killed before its `stop()` left on the
        host (the name is ours, the host keeps it across runs); say whether there was one. Call
        it before reading the host's state, so that state is the host without any node of ours."""
        if not (Path("/sys/class/net") / self.bridge).exists():
            return False
        subprocess.run(["ip", "link", "del", self.bridge], check=True)
        return True

    def stop(self) -> None:
        """Stop everything by PID, remove its cgroups, the CNI bridge and the namespace; a
        `NodeError` names what could not be removed."""
        problems: list[str] = []
        if self.kubelet is not None:
            self.kubelet.stop()
        self._kill(self._cgroup_pids())  # every container of every pod
        if self.containerd is not None:
            self.containerd.stop()
        self._kill(self._namespace_pids())  # the shims, and anything else left in it
        if self.holder is not None:
            if self.holder.stdin is not None:
                self.holder.stdin.close()
            try:
                self.holder.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.holder.kill()
                self.holder.wait()
        problems += self._remove_cgroups()
        if (Path("/sys/class/net") / self.bridge).exists():
            subprocess.run(["ip", "link", "del", self.bridge], check=False)
        if problems:
            raise NodeError("the node left things behind:\n" + "\n".join(problems))

    def _cgroup_pids(self) -> set[int]:
        pids: set[int] = set()
        for procs in Path("/sys/fs/cgroup").glob(f"*/{self.cgroup_root}/**/cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
        return pids

    def _namespace_pids(self) -> set[int]:
        if self.holder is None:
            return set()
        try:
            ours = os.readlink(f"/proc/{self.holder.pid}/ns/mnt")
        except OSError:
            return set()
        pids = set()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and int(proc.name) != self.holder.pid:
                with contextlib.suppress(OSError):
                    if os.readlink(proc / "ns" / "mnt") == ours:
                        pids.add(int(proc.name))
        return pids

    @staticmethod
    def _kill(pids: set[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pids and time.monotonic() < deadline:
            pids = {p for p in pids if Path(f"/proc/{p}").exists()}
            time.sleep(0.05)

    def _remove_cgroups(self) -> list[str]:
        left = []
        for hierarchy in (c for c in Path("/sys/fs/cgroup").iterdir() if c.is_dir()):
            root = hierarchy / self.cgroup_root
            if not root.exists():
                continue
            groups = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for group in [*groups, root]:
                for _ in range(50):  # a cgroup is busy a moment after its last process died
                    try:
                        group.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)
                else:
                    left.append(f"cgroup {group}")
        return left

    def kubelet_log(self) -> str:
        return (self.workdir / "logs" / "kubelet.log").read_text(errors="replace")


@contextlib.contextmanager
def running_node(node: RealNode) -> Iterator[RealNode]:
    try:
        node.start()
    except BaseException:
        with contextlib.suppress(NodeError):
            node.stop()
        raise
    try:
        yield node
    finally:
        node.stop()
