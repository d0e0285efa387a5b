"""The in-pod checks: is RDMA usable here, and is NCCL configured to use it?

Everything read from the filesystem is read below one root (`/` live; a test tree otherwise):
sysfs at `ROOT/sys`, device nodes at `ROOT/dev`, `/proc` bits at `ROOT/proc`. The process
environment, library lookup, rlimits and statvfs come in through `Host`, so tests pass their own.
sysfs is not namespaced, so a pod sees every HCA of the node there; the device nodes in
`/dev/infiniband` are what the pod was actually given.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import resource
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rdmaplane.adapters.discovery import read_node
from rdmaplane.core.gid import GidPolicy, gid_problem, select_gid
from rdmaplane.core.model import Gpu, Hca, LinkLayer, NetnsMode, NodeTopology, Port
from rdmaplane.core.nccl import default_socket_ifname, link_layer_mix
from rdmaplane.core.netns import HOW_TO_SHARE
from rdmaplane.core.pcie import downtrained, gpu_downtrained
from rdmaplane.core.topology import Relation, pci_relation
from rdmaplane.services.doctor.policy import ncclenv
from rdmaplane.services.doctor.policy.verdict import Finding, Status

CAP_IPC_LOCK = 14
MEMLOCK_MIN = 1 << 30  # below this, registering NCCL's host buffers fails sooner or later
SHM_MIN = 1 << 30  # NCCL's shared-memory transport needs far more than Docker's 64 MiB
AF_FAMILY = {"AF_INET": 4, "AF_INET6": 6}


def _find_and_load(name: str) -> str | None:
    """The library's file name when it is found and loads; None otherwise."""
    found = ctypes.util.find_library(name)
    if found is None:
        return None
    try:
        ctypes.CDLL(found)
    except OSError:
        return None
    return found


def _live_memlock() -> int | None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def _statvfs_size(path: str) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


@dataclass
class Host:
    """The machine the checks run on; every field can be replaced by a test."""

    root: Path = Path("/")
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    find_library: Callable[[str], str | None] = _find_and_load
    memlock: Callable[[], int | None] | None = None  # None bytes = unlimited
    shm_size: Callable[[str], int] = _statvfs_size
    nvml_minors: Callable[[], dict[int, str]] = field(default=lambda: _nvml_minors())

    @property
    def live(self) -> bool:
        return self.root.resolve() == Path("/")

    def path(self, rel: str) -> Path:
        return self.root / rel


@dataclass(frozen=True, slots=True)
class CheckedNode:
    """What the checks share: the topology and which HCAs this pod can open."""

    topo: NodeTopology
    usable: tuple[Hca, ...]  # HCAs whose /dev/infiniband/uverbsN exists


def load(host: Host) -> CheckedNode:
    topo = read_node(str(host.path("sys")))
    usable = tuple(
        h for h in topo.hcas if h.uverbs and host.path(f"dev/infiniband/{h.uverbs}").exists()
    )
    return CheckedNode(topo, usable)


def run_all(host: Host, node: CheckedNode | None = None) -> list[Finding]:
    node = node or load(host)
    return [check(host, node) for check in CHECKS]


# --------------------------------------------------------------------------- the checks


def devices(host: Host, node: CheckedNode) -> Finding:
    name = "rdma-devices"
    unseen = _unseen_device_nodes(host, node)
    if hidden := [(u, ib) for u, ib in unseen if ib is not None]:
        return _netns_finding(node, hidden)
    if not node.topo.hcas:
        return Finding(
            name,
            Status.FAIL,
            f"no RDMA device in {host.path('sys/class/infiniband')}",
            "run on an RDMA node; check the mlx5_core/mlx5_ib drivers are loaded",
        )
    if not node.usable:
        return Finding(
            name,
            Status.FAIL,
            f"{len(node.topo.hcas)} HCA(s) in sysfs but no /dev/infiniband/uverbsN for any",
            "request rdmaplane.io/hca (or rdmaplane.io/hca-shared) in the pod's resources",
        )
    names = ", ".join(f"{h.name}({h.uverbs})" for h in node.usable)
    if unseen:
        return Finding(
            name,
            Status.WARN,
            f"usable: {names}; {', '.join(u for u, _ in unseen)} in /dev/infiniband match no "
            "HCA in /sys/class/infiniband_verbs",
            "the device nodes and sysfs disagree: mount the node's /sys, or restart the pod "
            "after HCAs were renamed or removed",
        )
    if not host.path("dev/infiniband/rdma_cm").exists():
        return Finding(
            name,
            Status.WARN,
            f"usable: {names}; /dev/infiniband/rdma_cm missing (rdma_cm QPs, UCX need it)",
            "add /dev/infiniband/rdma_cm to the pod (the rdmaplane device plugin mounts it)",
        )
    others = len(node.topo.hcas) - len(node.usable)
    note = f"; {others} more in sysfs not given to this pod" if others else ""
    return Finding(name, Status.PASS, f"usable: {names}, rdma_cm present{note}")


def device_nodes(host: Host) -> list[str]:
    """The `uverbsN` device nodes this pod was given, in natural order."""
    found = [p.name for p in host.path("dev/infiniband").glob("uverbs*") if p.name[6:].isdigit()]
    return sorted(found, key=lambda n: int(n[6:]))


def _unseen_device_nodes(host: Host, node: CheckedNode) -> list[tuple[str, str | None]]:
    """Device nodes whose HCA this pod's /sys/class/infiniband does not show: (uverbsN, the HCA
    `class/infiniband_verbs/uverbsN/ibdev` names — that class is not network-namespaced — or
    None when no HCA of that number exists at all)."""
    shown = {h.uverbs for h in node.topo.hcas}
    out = []
    for uverbs in device_nodes(host):
        if uverbs in shown:
            continue
        try:
            ibdev: str | None = host.path(f"sys/class/infiniband_verbs/{uverbs}/ibdev").read_text()
        except (OSError, UnicodeDecodeError):
            ibdev = None
        out.append((uverbs, ibdev.strip() if ibdev else None))
    return out


def _netns_finding(node: CheckedNode, hidden: list[tuple[str, str]]) -> Finding:
    """Device nodes without their HCA in sysfs: in exclusive RDMA netns mode a device is only
    visible in the network namespace it belongs to, so the pod has /dev nodes for HCAs it
    cannot see, and NCCL falls back to sockets. The mode is discovery's reading of the pod's
    /sys (ib_core's `netns_mode`; without the parameter, an older kernel: shared)."""
    mode = node.topo.netns_mode
    listed = ", ".join(f"/dev/infiniband/{u} ({ib})" for u, ib in hidden)
    where = (
        "/sys/class/infiniband is empty"
        if not node.topo.hcas
        else "/sys/class/infiniband lacks their HCAs"
    )
    said = {
        NetnsMode.EXCLUSIVE: "netns_mode is N: the RDMA subsystem is in exclusive "
        "network-namespace mode",
        NetnsMode.SHARED: "netns_mode reads Y (shared), so the likely cause is a /sys that is "
        "not the node's, or HCAs renamed or removed after the pod started",
        NetnsMode.UNKNOWN: "likely cause: the RDMA subsystem is in exclusive network-namespace "
        "mode (netns_mode unreadable here)",
    }[mode]
    fix = (
        f"on the node, {HOW_TO_SHARE}, so every namespace sees the HCAs — or, if exclusive mode "
        "is intended (SR-IOV VFs), move the VF into the pod's namespace with an RDMA CNI"
    )
    if mode is NetnsMode.SHARED:
        fix = "mount the node's /sys in the pod, or restart the pod after HCAs were renamed"
    return Finding(
        "rdma-devices",
        Status.FAIL,
        f"the pod has {listed} but {where}; {said}; NCCL will fall back to TCP sockets",
        fix,
    )


def ports(host: Host, node: CheckedNode) -> Finding:
    name = "ports-active"
    if not node.usable:
        return Finding(name, Status.FAIL, "no usable HCA to check", "see rdma-devices")
    down = [f"{h.name}:{p.number}" for h in node.usable for p in h.ports if not p.is_up]
    up = [f"{h.name}:{p.number}" for h in node.usable for p in h.ports if p.is_up]
    if not up:
        return Finding(
            name,
            Status.FAIL,
            f"no ACTIVE port: {', '.join(down)} down",
            "check cables and switch ports (`ibstat`), and the subnet manager on IB fabrics",
        )
    if down:
        return Finding(
            name,
            Status.WARN,
            f"down: {', '.join(down)}; active: {', '.join(up)}",
            "exclude the down ports from NCCL_IB_HCA or repair their links",
        )
    return Finding(name, Status.PASS, f"all {len(up)} port(s) ACTIVE")


def memlock(host: Host, node: CheckedNode) -> Finding:
    """Locked memory for RDMA registration: the memlock limit and CAP_IPC_LOCK judged together,
    because the kernel skips the limit for a process holding IPC_LOCK (ib_umem_get)."""
    name = "memlock"
    limit = _memlock_limit(host)
    ipc = _ipc_lock(host)
    shown = "unlimited" if limit is None else limit if isinstance(limit, str) else _size(limit)
    if ipc is True:
        return Finding(
            name,
            Status.PASS,
            f"IPC_LOCK in the effective capabilities, so the memlock limit ({shown}) does not "
            "apply to memory registration",
        )
    caps = "IPC_LOCK not in the effective capabilities" if ipc is False else ipc
    fix = (
        "add securityContext.capabilities.add: [IPC_LOCK] to the container (or set memlock "
        "unlimited for the container runtime: LimitMEMLOCK=infinity in containerd's unit)"
    )
    if limit is None:
        return Finding(name, Status.PASS, f"max locked memory: unlimited; {caps}")
    if isinstance(limit, str):
        return Finding(name, Status.WARN, f"{limit}; {caps}", fix)
    status = Status.WARN if limit >= MEMLOCK_MIN else Status.FAIL
    return Finding(
        name,
        status,
        f"max locked memory {shown} and {caps}: registering NCCL's buffers "
        + ("may run out" if status == Status.WARN else "fails"),
        fix,
    )


def _memlock_limit(host: Host) -> int | str | None:
    """Bytes, None for unlimited, or a string saying why it could not be read."""
    if host.memlock is not None:
        return host.memlock()
    if host.live:
        return _live_memlock()
    path = host.path("proc/self/limits")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        return f"cannot read {path}: {getattr(e, 'strerror', None) or 'not text'}"
    for line in lines:
        if line.startswith("Max locked memory"):
            soft = (line[len("Max locked memory") :].split() or [""])[0]
            if soft == "unlimited":
                return None
            if soft.isdigit():
                return int(soft)
            return f"cannot parse {line.strip()[:60]!r} in {path}"
    return f"no 'Max locked memory' line in {path}"


def _ipc_lock(host: Host) -> bool | str:
    """Whether CAP_IPC_LOCK is effective, or a string saying why it could not be read."""
    path = host.path("proc/self/status")
    try:
        status_text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        return f"cannot read {path}: {getattr(e, 'strerror', None) or 'not text'}"
    caps = next(
        (
            ln[len("CapEff:") :].strip()
            for ln in status_text.splitlines()
            if ln.startswith("CapEff:")
        ),
        None,
    )
    try:
        eff = int(caps or "", 16)
    except ValueError:
        return f"no readable CapEff line in {path}"
    return bool(eff >> CAP_IPC_LOCK & 1)


def libraries(host: Host, node: CheckedNode) -> Finding:
    name = "libibverbs"
    verbs = host.find_library("ibverbs")
    mlx5 = host.find_library("mlx5")
    status_if_missing = Status.FAIL if node.usable else Status.WARN
    missing = [lib for lib, found in (("libibverbs", verbs), ("libmlx5", mlx5)) if not found]
    if missing:
        return Finding(
            name,
            status_if_missing,
            f"cannot load {' and '.join(missing)}",
            "install rdma-core's libibverbs1 and ibverbs-providers in the image",
        )
    return Finding(name, Status.PASS, f"loaded {verbs} and {mlx5}")


def nccl_env(host: Host, node: CheckedNode) -> Finding:
    """NCCL_IB_HCA, NCCL_IB_GID_INDEX and NCCL_SOCKET_IFNAME against the hardware; every fix
    is a value that works in this pod (its own HCAs, an interface other than loopback)."""
    name = "nccl-env"
    problems: list[tuple[Status, str, str]] = []
    usable = {h.name: h for h in node.usable}
    listed = list(usable.values())
    if raw := host.env.get("NCCL_IB_HCA"):
        listed = _check_ib_hca(raw, [h.name for h in node.topo.hcas], usable, problems)
    _check_link_layers(listed, problems)
    _check_gid_index(host.env, listed, problems)
    if raw := host.env.get("NCCL_SOCKET_IFNAME"):
        _check_ifname(raw, node.topo, problems)
    if not problems:
        shown = [f"{k}={host.env[k]}" for k in _NCCL_VARS if k in host.env]
        return Finding(name, Status.PASS, ", ".join(shown) or "no NCCL variables set (defaults)")
    status = max(s for s, _, _ in problems)
    return Finding(
        name,
        status,
        "; ".join(d for _, d, _ in problems),
        "; ".join(dict.fromkeys(f for _, _, f in problems)),
    )


_NCCL_VARS = ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE")


def _check_ib_hca(
    raw: str, names: list[str], usable: dict[str, Hca], problems: list[tuple[Status, str, str]]
) -> list[Hca]:
    try:
        spec = ncclenv.parse_device_list(raw)
    except ValueError as e:
        problems.append((Status.FAIL, f"NCCL_IB_HCA: {e}", _hca_fix(None, names, usable)))
        return list(usable.values())
    if not spec.exclude:
        for entry, port in spec.entries:
            if not any(ncclenv.entry_matches(entry, n, spec.exact) for n in names):
                problems.append(
                    (
                        Status.FAIL,
                        f"NCCL_IB_HCA entry {entry!r} matches no HCA",
                        _hca_fix(spec, names, usable),
                    )
                )
            elif entry in usable and port is not None:
                p = usable[entry].port(port)
                if p is None or not p.is_up:
                    problems.append(
                        (
                            Status.FAIL,
                            f"NCCL_IB_HCA {entry}:{port} is not ACTIVE",
                            _hca_fix(spec, names, usable),
                        )
                    )
    for entry, extra in ncclenv.ambiguous_entries(spec, names).items():
        problems.append(
            (
                Status.WARN if spec.exclude else Status.FAIL,
                f"NCCL_IB_HCA entry {entry!r} is a prefix: it also selects {', '.join(extra)}",
                _hca_fix(spec, names, usable),
            )
        )
    chosen = ncclenv.selected(spec, names)
    not_given = [n for n in chosen if n not in usable]
    if not_given and not spec.exclude:
        problems.append(
            (
                Status.FAIL,
                f"NCCL_IB_HCA selects {', '.join(not_given)} but the pod has no device node for it",
                _hca_fix(spec, names, usable),
            )
        )
    down = [n for n in chosen if n in usable and not any(p.is_up for p in usable[n].ports)]
    if down:
        problems.append(
            (
                Status.FAIL,
                f"NCCL_IB_HCA selects {', '.join(down)} with no ACTIVE port",
                _hca_fix(spec, names, usable),
            )
        )
    return [usable[n] for n in chosen if n in usable]


def _hca_fix(spec: ncclenv.DeviceList | None, names: list[str], usable: dict[str, Hca]) -> str:
    """The NCCL_IB_HCA this pod should have: exact names (`=`) of its own HCAs with an ACTIVE
    port, those the value meant when it meant some of them, else all of them."""
    up = [n for n, h in usable.items() if any(p.is_up for p in h.ports)]
    if not up:
        return (
            "give the pod an HCA with an ACTIVE port (rdmaplane.io/hca) before setting NCCL_IB_HCA"
        )
    meant = [n for n in ncclenv.meant(spec, names) if n in up] if spec is not None else []
    return f"export NCCL_IB_HCA=={','.join(meant or up)}"


def _check_link_layers(hcas: list[Hca], problems: list[tuple[Status, str, str]]) -> None:
    ports = [(h, p) for h in hcas for p in h.ports if p.is_up]
    mix = link_layer_mix(ports)
    if mix is not None:
        problems.append((Status.FAIL, mix, f"export NCCL_IB_HCA=={','.join(_one_layer(ports))}"))


def _one_layer(ports: list[tuple[Hca, Port]]) -> list[str]:
    """The HCAs of the link layer most ports have (InfiniBand on a tie)."""
    layers = [p.link_layer for _, p in ports]
    keep = max(set(layers), key=lambda layer: (layers.count(layer), layer == LinkLayer.INFINIBAND))
    return list(dict.fromkeys(h.name for h, p in ports if p.link_layer == keep))


def _check_gid_index(
    env: Mapping[str, str], hcas: list[Hca], problems: list[tuple[Status, str, str]]
) -> None:
    roce = [(h, p) for h in hcas for p in h.ports if p.link_layer == LinkLayer.ETHERNET and p.is_up]
    if not roce:
        return  # InfiniBand ports use GID index 0 whatever the variable says
    family = AF_FAMILY.get(env.get("NCCL_IB_ADDR_FAMILY", "AF_INET"), 4)
    policy = GidPolicy(family=family)
    raw = env.get("NCCL_IB_GID_INDEX")
    if raw is None or raw.strip() == "-1":
        choices = {f"{h.name}:{p.number}": select_gid(h, p, policy).index for h, p in roce}
        bad = [k for k, v in choices.items() if v is None]
        if bad:
            problems.append(
                (
                    Status.FAIL,
                    f"no valid RoCE v2 IPv{family} GID on {', '.join(bad)}",
                    "give the RoCE netdev an IP address (GIDs follow addresses)",
                )
            )
        elif raw is None and len(set(choices.values())) > 1:
            problems.append(
                (
                    Status.WARN,
                    f"NCCL_IB_GID_INDEX unset and the RoCE v2 index differs per HCA "
                    f"({_choices(choices)}); NCCL < 2.21 uses index 0",
                    "set NCCL_IB_GID_INDEX=-1 (NCCL >= 2.21) or give every HCA the same layout",
                )
            )
        elif raw is None:
            index = next(iter(choices.values()))
            problems.append(
                (
                    Status.WARN,
                    f"NCCL_IB_GID_INDEX unset; NCCL < 2.21 uses 0, the RoCE v2 "
                    f"IPv{family} GID is at {index}",
                    f"export NCCL_IB_GID_INDEX={index}",
                )
            )
        return
    try:
        index = int(raw)
    except ValueError:
        problems.append(
            (
                Status.FAIL,
                f"NCCL_IB_GID_INDEX={raw!r} is not a number",
                "set it to the index `rdmaplane doctor` suggests",
            )
        )
        return
    wrong = {}
    for h, p in roce:
        gid = next((g for g in p.gids if g.index == index), None)
        why = gid_problem(gid, policy)
        if why:
            wrong[f"{h.name}:{p.number}"] = why
    if wrong:
        choices = {f"{h.name}:{p.number}": select_gid(h, p, policy).index for h, p in roce}
        good = set(choices.values())
        fix = (
            f"export NCCL_IB_GID_INDEX={good.pop()}"
            if len(good) == 1 and None not in good
            else "export NCCL_IB_GID_INDEX=-1 (NCCL >= 2.21): the valid index differs per HCA "
            f"({_choices(choices)})"
        )
        problems.append(
            (
                Status.FAIL,
                f"NCCL_IB_GID_INDEX={index}: " + ", ".join(f"{k} {v}" for k, v in wrong.items()),
                fix,
            )
        )


def _choices(choices: dict[str, int | None]) -> str:
    return ", ".join(f"{k}→{v}" for k, v in choices.items())


def _check_ifname(raw: str, topo: NodeTopology, problems: list[tuple[Status, str, str]]) -> None:
    try:
        spec = ncclenv.parse_device_list(raw)
    except ValueError as e:
        problems.append((Status.FAIL, f"NCCL_SOCKET_IFNAME: {e}", _ifname_fix(topo)))
        return
    if not ncclenv.selected(spec, [n.name for n in topo.netdevs if n.name != "lo"]):
        problems.append(
            (Status.FAIL, f"NCCL_SOCKET_IFNAME={raw} matches no interface", _ifname_fix(topo))
        )


def _ifname_fix(topo: NodeTopology) -> str:
    """An interface NCCL's bootstrap can use here, chosen as `rdmaplane env` chooses it (never
    loopback: NCCL skips it, and it cannot reach another pod)."""
    best = default_socket_ifname(topo, [])
    if best is not None:
        return f"export NCCL_SOCKET_IFNAME={best}"
    return (
        "set NCCL_SOCKET_IFNAME to the pod's interface that reaches the other pods (`ip -br addr`)"
    )


def gpu_nic(host: Host, node: CheckedNode) -> Finding:
    """Each visible GPU against its nearest usable HCA; SYS pairs cross the socket link."""
    name = "gpu-nic"
    gpus, minor_of, unmapped = _visible_gpus(host, node.topo)
    if not gpus or not node.usable:  # looked at, nothing to judge: SKIP (docs/doctor.md)
        missing = "GPU" if not gpus else "usable HCA"
        return Finding(name, Status.SKIP, f"no GPU/HCA pair to check: the pod sees no {missing}")
    rows, far = [], []
    for g in gpus:
        best = min(
            ((h, pci_relation(g.pci, h.dma_pci)) for h in node.usable if h.dma_pci),
            key=lambda x: x[1],
            default=None,
        )
        if best is None:
            continue
        minor = minor_of.get(g.pci.address)
        dev = f"(/dev/nvidia{minor})" if minor is not None and minor != g.index else ""
        rows.append(f"GPU{g.index}{dev}→{best[0].name} {best[1].name}")
        if best[1] > Relation.PXB:
            far.append((g.index, best[1]))
    if unmapped:
        rows.append(
            f"which GPUs {', '.join(unmapped)} are is unknown (no /proc/driver/nvidia/gpus/*/"
            "information, no NVML): judged every GPU"
        )
    if not far:
        return Finding(name, Status.PASS, "; ".join(rows))
    sys_pairs = [f"GPU{i}" for i, r in far if r == Relation.SYS]
    detail = "; ".join(rows)
    if sys_pairs:
        detail = (
            f"{', '.join(sys_pairs)} reach their nearest NIC only across sockets (SYS): {detail}"
        )
    return Finding(
        name,
        Status.WARN,
        detail,
        "schedule GPUs and NICs under one PCIe switch (rdmaplane.io/hca with the rdmaplane "
        "device plugin aligns them); NCCL disables GPUDirect RDMA beyond PXB by default",
    )


def pcie_links(host: Host, node: CheckedNode) -> Finding:
    """The PCIe links of the pod's HCAs and GPUs against what device and slot allow
    (`rdmaplane.core.pcie`): a NIC at x8 of x16 moves half the data it should."""
    name = "pcie-links"
    gpus, _, _ = _visible_gpus(host, node.topo)
    short = [
        f"{h.name} ({h.pci.address}): {why}"
        for h in node.usable
        if h.pci is not None and (why := downtrained(h.pci.link))
    ]
    short += [
        f"GPU{g.index} ({g.pci.address}): {why}"
        for g in gpus
        if (why := gpu_downtrained(g.pci.link))
    ]
    if not short:
        return Finding(name, Status.PASS, "every HCA and GPU link at its device's and slot's best")
    return Finding(
        name,
        Status.WARN,
        "downtrained: " + "; ".join(short),
        "a link short of its slot halves (or worse) what crosses it: reseat the card or its "
        "riser, check `lspci -vv -s <PCI address>` (LnkSta against LnkCap) and the BIOS slot "
        "settings; meanwhile run the job elsewhere",
    )


def _visible_gpus(host: Host, topo: NodeTopology) -> tuple[list[Gpu], dict[str, int], list[str]]:
    """GPUs whose /dev/nvidiaN the pod has (all of them when /dev shows none: a host run), the
    minor of each GPU by PCI address, and the device nodes no GPU could be found for.

    Minors do not follow PCI bus order, so they are mapped through the driver's own table."""
    dev = host.path("dev")
    present = sorted(int(p.name[6:]) for p in dev.glob("nvidia[0-9]*") if p.name[6:].isdigit())
    minors = gpu_minors(host)
    minor_of = {address: minor for minor, address in minors.items()}
    if not present:
        return list(topo.gpus), minor_of, []
    if not minors:
        return list(topo.gpus), minor_of, [f"/dev/nvidia{m}" for m in present]
    wanted = {minors[m] for m in present if m in minors}
    unmapped = [f"/dev/nvidia{m}" for m in present if m not in minors]
    if unmapped:
        return list(topo.gpus), minor_of, unmapped
    return [g for g in topo.gpus if g.pci.address in wanted], minor_of, []


def gpu_minors(host: Host) -> dict[int, str]:
    """Device minor → PCI address, from `/proc/driver/nvidia/gpus/<pci>/information`
    (`Device Minor:    0`, `Bus Location:    0000:17:00.0`); from NVML on a live host whose
    /proc lacks them. Empty when neither says."""
    found: dict[int, str] = {}
    for info in host.path("proc/driver/nvidia/gpus").glob("*/information"):
        try:
            fields = _key_values(info.read_text())
        except (OSError, UnicodeDecodeError):
            continue
        address = _pci_address(fields.get("Bus Location") or info.parent.name)
        minor = fields.get("Device Minor", "")
        if address and minor.isdigit():
            found[int(minor)] = address
    if not found and host.live:
        found = host.nvml_minors()
    return found


def _key_values(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _pci_address(text: str) -> str | None:
    """`0000:17:00.0` or NVML's `00000000:17:00.0` as sysfs names the function."""
    domain, sep, rest = text.strip().lower().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}" if sep and rest else None
    except ValueError:
        return None


def _nvml_minors() -> dict[int, str]:
    """Device minor → PCI address from NVML; empty without nvidia-ml-py or a driver."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return {}
    nvml: Any = pynvml
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, …
        return {}
    found: dict[int, str] = {}
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            bus = nvml.nvmlDeviceGetPciInfo(handle).busId
            address = _pci_address(bus.decode() if isinstance(bus, bytes) else str(bus))
            if address:
                found[int(nvml.nvmlDeviceGetMinorNumber(handle))] = address
    except Exception:  # a GPU that cannot be queried: say nothing rather than guess
        return {}
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return found


def gdr_module(host: Host, node: CheckedNode) -> Finding:
    name = "gpudirect-rdma"
    if not node.topo.gpus:
        return Finding(name, Status.PASS, "no GPU on this node")
    try:
        modules = host.path("proc/modules").read_text()
    except (OSError, UnicodeDecodeError):
        modules = ""
    loaded = [m for m in ("nvidia_peermem", "nv_peer_mem") if f"\n{m} " in f"\n{modules}"]
    if not loaded and host.path("sys/module/nvidia_peermem").is_dir():
        loaded = ["nvidia_peermem"]
    if loaded:
        return Finding(name, Status.PASS, f"{loaded[0]} loaded")
    return Finding(
        name,
        Status.WARN,
        "no peer-memory module (nvidia_peermem / nv_peer_mem): GPUDirect RDMA needs it or DMA-BUF",
        "modprobe nvidia_peermem on the node (GPU operator: driver.rdma.enabled=true), or use "
        "DMA-BUF (open kernel module, NCCL >= 2.19)",
    )


def shm(host: Host, node: CheckedNode) -> Finding:
    name = "dev-shm"
    path = str(host.path("dev/shm"))
    try:
        size = host.shm_size(path)
    except OSError as e:
        return Finding(
            name,
            Status.WARN,
            f"cannot statvfs {path}: {e.strerror}",
            "mount an emptyDir {medium: Memory} at /dev/shm",
        )
    if size < SHM_MIN:
        return Finding(
            name,
            Status.FAIL,
            f"/dev/shm is {_size(size)}; NCCL's shared-memory transport fails with 'Bus error'",
            "mount an emptyDir {medium: Memory, sizeLimit: 16Gi} at /dev/shm",
        )
    return Finding(name, Status.PASS, f"/dev/shm is {_size(size)}")


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


CHECKS: tuple[Callable[[Host, CheckedNode], Finding], ...] = (
    devices,
    ports,
    memlock,
    libraries,
    nccl_env,
    gpu_nic,
    pcie_links,
    gdr_module,
    shm,
)
