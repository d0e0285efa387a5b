"""What a kubelet and containerd could change on the host, read before and after the node ran.

Left to their defaults they would set six kernel tunables (the kubelet's `setupKernelTunables`),
create firewall chains, mount under /run, /var/lib and /var/log, leave cgroups, network links and
state folders behind. The node runs in its own mount namespace with those paths private, and
stops by PID; this snapshot is how a test proves that nothing of it reached the host.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The kubelet's kernel tunables (pkg/kubelet/cm/container_manager_linux.go) and the value it
# wants, plus the forwarding switches a CNI bridge with a gateway or masquerading turns on.
KUBELET_TUNABLES = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
WATCHED_SYSCTLS = (
    *KUBELET_TUNABLES,
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/forwarding",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv6/conf/all/forwarding",
    "net/bridge/bridge-nf-call-iptables",
)
# Where a node left to its defaults writes on the host.
STATE_PATHS = (
    "/run/containerd", "/run/netns", "/run/nri", "/var/lib/kubelet", "/var/lib/containerd",
    "/var/lib/cni", "/var/log/pods", "/var/log/containers", "/etc/cni", "/opt/cni",
    "/dev/infiniband",
)  # fmt: skip
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SYS = Path("/proc/sys")


@dataclass(frozen=True)
class HostState:
    sysctls: dict[str, str]
    mounts: frozenset[tuple[str, str, str]]  # (mount point, type, source) in our namespace
    firewall: tuple[str, ...]  # table names, and iptables-save/ip6tables-save when installed
    links: frozenset[str]
    cgroups: frozenset[str]  # every hierarchy's top-level cgroups
    state_paths: frozenset[str]  # which of STATE_PATHS exist

    def changes(self, later: HostState) -> list[str]:
        """What differs in `later`, one line each (empty: nothing changed)."""
        lines = []
        for key in sorted(set(self.sysctls) | set(later.sysctls)):
            if self.sysctls.get(key) != later.sysctls.get(key):
                lines.append(f"sysctl {key}: {self.sysctls.get(key)} -> {later.sysctls.get(key)}")
        for name, before, after in (
            ("mount", self.mounts, later.mounts),
            ("link", self.links, later.links),
            ("cgroup", self.cgroups, later.cgroups),
            ("path", self.state_paths, later.state_paths),
        ):
            lines += [f"{name} appeared: {x}" for x in sorted(map(str, after - before))]
            lines += [f"{name} gone: {x}" for x in sorted(map(str, before - after))]
        if self.firewall != later.firewall:
            lines.append(f"firewall: {self.firewall} -> {later.firewall}")
        return lines


def read_sysctl(name: str) -> str | None:
    try:
        return (PROC_SYS / name).read_text().strip()
    except OSError:
        return None


def _mounts() -> frozenset[tuple[str, str, str]]:
    found = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        found.add((fields[4], fields[dash + 1], fields[dash + 2]))
    return frozenset(found)


def _firewall() -> tuple[str, ...]:
    found = []
    for table in ("/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"):
        path = Path(table)
        found.append(path.read_text() if path.exists() else f"{table}: none")
    for tool in ("iptables-save", "ip6tables-save"):
        if shutil.which(tool):
            out = subprocess.run([tool], capture_output=True, text=True).stdout
            found.append("\n".join(x for x in out.splitlines() if not x.startswith("#")))
    return tuple(found)


def _links() -> frozenset[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return frozenset(line.split(":")[1].strip().split("@")[0] for line in out.splitlines())


def _cgroups() -> frozenset[str]:
    return frozenset(
        f"{hierarchy.name}/{group.name}"
        for hierarchy in CGROUP_ROOT.iterdir()
        if hierarchy.is_dir()
        for group in hierarchy.iterdir()
        if group.is_dir()
    )


def snapshot() -> HostState:
    return HostState(
        sysctls={k: v for k in WATCHED_SYSCTLS if (v := read_sysctl(k)) is not None},
        mounts=_mounts(),
        firewall=_firewall(),
        links=_links(),
        cgroups=_cgroups(),
        state_paths=frozenset(p for p in STATE_PATHS if Path(p).exists()),
    )
