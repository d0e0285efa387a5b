"""Read `NCCL_DEBUG=INFO` output: which transport each rank really used, and why it failed.

NCCL prefixes its lines with `host:pid:tid [cudaDev] NCCL INFO|WARN`. Process-level facts
(`NET/IB : Using [0]mlx5_0:1/RoCE …`, `Using network IB|Socket`, `NET/IB : No device found.`,
the GID index in `NET/IB: NCCL Dev 0 IbDev 0 Port 1 qpn … GID 3 (…)`) belong to the process;
channel lines (`0[0] -> 8[0] [send] via NET/IB/0/GDRDMA`) name the rank directly; `Init COMPLETE`
lines map a process and CUDA device to its rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rdmaplane.doctor.verdict import Finding, ParseError, Status, strip_launcher_prefix

_PREFIX = re.compile(
    r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>\d+)\]\s+(?:\S+:\d+\s+)?NCCL\s+(?P<level>INFO|WARN)\s"
    r"(?P<msg>.*)$"
)
_IB_USING = re.compile(r"NET/IB\s*:\s*Using\s+(.*?)(?:;\s*OOB\s+(\S+))?\s*$")
_IB_DEV = re.compile(r"\[\d+\]([\w.-]+):(\d+)/(IB|RoCE)")
_NETWORK = re.compile(r"\bUsing network (\w+)")
_CHANNEL = re.compile(
    r"Channel\s+\d+/\d+\s*:\s*(\d+)\[[0-9a-fx]+\]\s*->\s*(\d+)\[[0-9a-fx]+\]\s*\[(send|receive)\]"
    r"\s+via\s+(\S+)"
)
_GID = re.compile(
    r"NET/IB:\s*NCCL (?:Merged)?Dev \d+ IbDev (\d+) Port (\d+) qpn \d+ mtu \d+ GID (-?\d+)"
)
_INIT = re.compile(r"\brank (\d+) nranks (\d+) cudaDev (\d+)")
_VERSION = re.compile(r"NCCL version (\S+)")


@dataclass(frozen=True, slots=True)
class Rule:
    """A known failure: how to recognise it, what it means, the one-line fix."""

    code: str
    pattern: re.Pattern[str]
    status: Status
    meaning: str
    fix: str


RULES: tuple[Rule, ...] = (
    Rule(
        "no-rdma-device",
        re.compile(r"NET/IB\s*:\s*No device found"),
        Status.FAIL,
        "NCCL found no usable RDMA device in this container",
        "request rdmaplane.io/hca for the pod (mounts /dev/infiniband) and make NCCL_IB_HCA "
        "name devices that exist (`ls /sys/class/infiniband`)",
    ),
    Rule(
        "ib-disabled",
        re.compile(r"NCCL_IB_DISABLE set by environment to 1"),
        Status.FAIL,
        "NCCL_IB_DISABLE=1 forces TCP sockets",
        "unset NCCL_IB_DISABLE",
    ),
    Rule(
        "socket-fallback",
        re.compile(r"Using network Socket|via NET/Socket"),
        Status.FAIL,
        "NCCL fell back to TCP sockets between nodes",
        "give the pod an RDMA device (rdmaplane.io/hca) and run `rdmaplane doctor` in it; "
        "NCCL falls back when it finds no ACTIVE HCA",
    ),
    Rule(
        "modify-qp-timeout",
        re.compile(r"ibv_modify_qp failed.*(?:Connection timed out|\b110\b)", re.I),
        Status.FAIL,
        "queue pairs could not connect: the GID index is link-local, RoCE v1, or not the "
        "same valid entry on both nodes",
        "set NCCL_IB_GID_INDEX to the RoCE v2 IPv4 index `rdmaplane doctor` reports on every "
        "node (or -1 with NCCL >= 2.21)",
    ),
    Rule(
        "gid-einval",
        re.compile(
            r"ncclIbRoceGetVersionNum.*Invalid argument|read failed in ncclIbRoceGetVersionNum"
        ),
        Status.FAIL,
        "NCCL < 2.26 read an empty GID table entry (EINVAL) while choosing a GID",
        "set NCCL_IB_GID_INDEX explicitly to a valid RoCE v2 index, or upgrade NCCL to >= 2.26",
    ),
    Rule(
        "completion-error-12",
        re.compile(r"status=12\b|completion with error 12\b|Got completion .*error 12\b", re.I),
        Status.FAIL,
        "work completion status 12 (transport retry counter exceeded): the peer never "
        "answered on this path",
        "use the same valid RoCE v2 NCCL_IB_GID_INDEX on all nodes and check the fabric "
        "between them (routes, PFC/ECN, MTU)",
    ),
)


@dataclass(slots=True)
class Process:
    """What one NCCL process said about itself."""

    host: str
    pid: int
    network: str | None = None  # "IB" or "Socket" (`Using network …`)
    hcas: list[str] = field(default_factory=list)  # `mlx5_0:1/RoCE`
    oob: str | None = None
    gid_indices: set[int] = field(default_factory=set)
    no_device: bool = False


@dataclass(frozen=True, slots=True)
class RankTransport:
    rank: int
    host: str | None
    cuda_dev: int | None
    network: str | None  # IB, Socket, or None when the log does not say
    hcas: tuple[str, ...]
    net_channels: int  # channels that cross nodes through NET
    gdr_channels: int  # of those, with GPUDirect RDMA
    socket_channels: int
    gid_indices: tuple[int, ...]

    @property
    def gdr(self) -> str:
        if self.socket_channels == self.net_channels:
            return "-"  # no RDMA channel, so no GPUDirect RDMA to speak of
        if self.gdr_channels == self.net_channels:
            return "on"
        return "off" if not self.gdr_channels else "partial"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    finding: Finding
    line_no: int
    line: str


@dataclass(frozen=True, slots=True)
class NcclLog:
    version: str | None
    ranks: tuple[RankTransport, ...]
    diagnoses: tuple[Diagnosis, ...]
    nccl_lines: int

    @property
    def rdma_used(self) -> bool:
        return any(r.network == "IB" for r in self.ranks) and not any(
            r.network == "Socket" or r.socket_channels for r in self.ranks
        )


def parse(text: str) -> NcclLog:
    processes: dict[tuple[str, int], Process] = {}
    rank_of: dict[tuple[str, int, int], int] = {}
    rank_home: dict[int, tuple[str, int, int]] = {}
    channels: dict[int, list[str]] = {}
    diagnoses: dict[str, Diagnosis] = {}
    version: str | None = None
    nccl_lines = 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = strip_launcher_prefix(raw).rstrip()
        m = _PREFIX.match(line.strip())
        if not m:
            continue
        nccl_lines += 1
        key = (m["host"], int(m["pid"]))
        proc = processes.setdefault(key, Process(*key))
        msg = m["msg"]
        for rule in RULES:
            if rule.code not in diagnoses and rule.pattern.search(msg):
                finding = Finding(rule.code, rule.status, rule.meaning, rule.fix)
                diagnoses[rule.code] = Diagnosis(finding, no, raw.strip())
        if v := _VERSION.search(msg):
            version = version or v.group(1)
        elif u := _IB_USING.search(msg):
            proc.hcas = [f"{d}:{p}/{ll}" for d, p, ll in _IB_DEV.findall(u.group(1))]
            proc.oob = u.group(2)
        elif n := _NETWORK.search(msg):
            proc.network = n.group(1)
        elif "No device found" in msg and "NET/IB" in msg:
            proc.no_device = True
        elif c := _CHANNEL.search(msg):
            src, dst, direction, via = int(c[1]), int(c[2]), c[3], c[4]
            local = src if direction == "send" else dst
            channels.setdefault(local, []).append(via)
            rank_home.setdefault(local, (*key, int(m["dev"])))
        elif g := _GID.search(msg):
            proc.gid_indices.add(int(g[3]))
        elif i := _INIT.search(msg):
            rank_of[(*key, int(i[3]))] = int(i[1])
            rank_home.setdefault(int(i[1]), (*key, int(i[3])))
    if not nccl_lines:
        lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
        if not lines:
            raise ParseError("NCCL log", "empty input")
        raise ParseError("NCCL log", "no 'host:pid:tid [dev] NCCL INFO' lines", *lines[0])
    ranks = _ranks(processes, rank_of, rank_home, channels)
    found = list(diagnoses.values())
    found += _gdr_and_gid(ranks)
    return NcclLog(version, ranks, tuple(found), nccl_lines)


def _ranks(
    processes: dict[tuple[str, int], Process],
    rank_of: dict[tuple[str, int, int], int],
    rank_home: dict[int, tuple[str, int, int]],
    channels: dict[int, list[str]],
) -> tuple[RankTransport, ...]:
    """One row per rank; processes with no known rank get a row of their own (rank -1…)."""
    rows: list[RankTransport] = []
    seen: set[tuple[str, int]] = set()
    for rank in sorted(set(rank_home) | set(rank_of.values())):
        host, pid, dev = rank_home[rank]
        proc = processes.get((host, pid))
        seen.add((host, pid))
        rows.append(_row(rank, host, dev, proc, channels.get(rank, [])))
    for n, (key, proc) in enumerate(sorted(processes.items())):
        if key not in seen:
            rows.append(_row(-1 - n, proc.host, None, proc, []))
    return tuple(rows)


def _row(
    rank: int, host: str, dev: int | None, proc: Process | None, vias: list[str]
) -> RankTransport:
    net = [v for v in vias if v.startswith("NET/")]
    network = proc.network if proc else None
    if network is None and net:
        network = "Socket" if all(v.startswith("NET/Socket") for v in net) else "IB"
    if network is None and proc and proc.no_device:
        network = "Socket"
    return RankTransport(
        rank=rank,
        host=host,
        cuda_dev=dev,
        network=network,
        hcas=tuple(proc.hcas) if proc else (),
        net_channels=len(net),
        gdr_channels=sum(1 for v in net if v.endswith("/GDRDMA")),
        socket_channels=sum(1 for v in net if v.startswith("NET/Socket")),
        gid_indices=tuple(sorted(proc.gid_indices)) if proc else (),
    )


def _gdr_and_gid(ranks: tuple[RankTransport, ...]) -> list[Diagnosis]:
    out: list[Diagnosis] = []
    no_gdr = [r.rank for r in ranks if r.net_channels and r.gdr != "on" and not r.socket_channels]
    if no_gdr:
        out.append(
            Diagnosis(
                Finding(
                    "gdr-off",
                    Status.WARN,
                    f"GPUDirect RDMA off on some channels of rank(s) {_short(no_gdr)}: data "
                    "is staged through host memory",
                    "load nvidia_peermem on the node, keep GPU and NIC under one PCIe switch "
                    "(rdmaplane pairs them), or raise NCCL_NET_GDR_LEVEL",
                ),
                0,
                "",
            )
        )
    indices = {i for r in ranks for i in r.gid_indices}
    if len(indices) > 1:
        out.append(
            Diagnosis(
                Finding(
                    "gid-index-differs",
                    Status.WARN,
                    f"ranks use different GID indices {sorted(indices)}",
                    "set one NCCL_IB_GID_INDEX valid on every node (rdmaplane publishes "
                    "rdmaplane.io/gid-index)",
                ),
                0,
                "",
            )
        )
    return out


def _short(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks[:8]) + ("…" if len(ranks) > 8 else "")
