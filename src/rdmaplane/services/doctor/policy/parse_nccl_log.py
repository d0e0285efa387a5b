"""Read `NCCL_DEBUG=INFO` output: which transport each rank really used, and why it failed.

Every NCCL release from 2.4 to 2.28 prefixes its lines with `host:pid:tid [cudaDev] NCCL INFO`
(WARN adds `file:line`; since 2.26 WARN lines also start with a `[date time]` stamp) and prints
the bare `NCCL version 2.x.y+cudaA.B` line without one. The facts and the wordings that changed:

- channels: `Ring 00 : 0 -> 8 [send] via NET/IB/0/GDRDMA` (2.4), `Ring 00 : 0[1b000] -> …`
  (2.5–2.6, bus ids in hex), `Channel 00 : 0[1b000] -> …` (2.7–2.11), `Channel 00/0 : …` with the
  connection index (2.12+), `0[0]` device numbers instead of bus ids (2.18+), `NET/IB/0(8)/…`
  when PXN proxies through rank 8 (2.12+), `/GDRDMA(PCI)` and `/Shared` suffixes;
- the network: `NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:…` (`[RO]` before `;` since 2.12),
  `Using network IB|Socket|IBext_v8|AWS Libfabric` (2.6+), `NET/IB : No device found.`;
- the GID index: `NET/IB: Dev 0 Port 1 qpn 1234 mtu 5 GID 3 (…)` (≤ 2.19, `query_ece={…}` in
  2.19), `NET/IB: NCCL Dev 0 IbDev 0 Port 1 qpn … GID 3 (…)` (2.20+);
- GPUDirect RDMA summaries: `GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)`,
  `… Disabled for GPU 1b000 / HCA 0 (distance 5 > 3)`, `Connected all rings, use ring PXN 0 GDR 1`
  (2.24+); known failures are in `failures.NCCL_RULES`.

Facts are gathered into sets and counts keyed by process and rank, so the result does not depend
on the order of the lines: logs of many ranks arrive interleaved and out of order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from rdmaplane.core import names
from rdmaplane.services.doctor.policy import failures
from rdmaplane.services.doctor.policy.verdict import (
    Finding,
    ParseError,
    Status,
    strip_launcher_prefix,
)

# Whatever a launcher or a logger puts before NCCL's own prefix is skipped: torchrun's
# `[default0]:` / `[rank0]:`, srun --label's `0: `, mpirun --tag-output's `[1,0]<stdout>:`,
# `kubectl logs --prefix`'s `[pod/x/c] `, NCCL_DEBUG_TIMESTAMP_LEVELS' `[date time] ` (WARN since
# 2.26), or several of them: a line is keyed by what follows, NCCL's `host:pid:tid [dev] NCCL`.
_START = r"(?:^|(?<=[\s\]:>)]))"
_PREFIX = re.compile(
    rf"{_START}(?P<host>[^\s:\[\]<>]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>\d+)\]\s+"
    r"(?:\S+:\d+\s+)?NCCL\s+(?P<level>INFO|WARN)\s(?P<msg>.*)$"
)
_BARE_VERSION = re.compile(rf"{_START}NCCL version (\S+)\s*$")
_IB_USING = re.compile(r"NET/IB\s*:\s*Using\s+(.*?);\s*OOB\s+(\S+)")
_IB_DEV = re.compile(r"\[\d+\]([\w.+-]+):(\d+)/(IB|RoCE)")
_SOCKET_USING = re.compile(r"NET/Socket\s*:\s*Using\s+\[")
_NETWORK = re.compile(r"\bUsing network (.+?)\s*$")
_CHANNEL = re.compile(
    r"\b(?:Ring|Channel)\s+\d+(?:/\d+)?\s*:\s*(\d+)(?:\[[0-9a-fx]+\])?\s*->\s*(\d+)"
    r"(?:\[[0-9a-fx]+\])?\s*\[(send|receive)\]\s+via\s+(.+?)\s*$"
)
_NET_VIA = re.compile(r"^NET/(?P<net>.+?)/(?P<dev>\d+)(?:\((?P<proxy>\d+)\))?(?P<flags>(?:/\S*)?)$")
_GID = re.compile(
    r"NET/IB:\s*(?:NCCL (?:Merged)?Dev \d+ IbDev \d+|Dev \d+) Port \d+ qpn \d+ mtu \d+ "
    r"(?:query_ece=\{[^}]*\}\s*)?GID (-?\d+)"
)
_INIT = re.compile(r"\brank (\d+) nranks (\d+) cudaDev (\d+)")
_VERSION = re.compile(r"\bNCCL version (\S+)")
_GDR_SUMMARY = re.compile(r"Connected all rings, use ring PXN \d+ GDR (\d+)")
_GDR_NO_MODULE = re.compile(
    r"GPU Direct RDMA Disabled for (?:GPU \S+ / )?HCA \d+ '[^']*' \(no module"
)
_GDR_HCA_OFF = re.compile(r"NET/\S+ : GPU Direct RDMA Disabled for HCA \d+ '[^']*'\s*$")
_GDR_DISTANCE = re.compile(r"GPU Direct RDMA Disabled for GPU \S+ / HCA \S+ \(distance")
_RDMA_NETWORK = re.compile(r"^(?:IB\w*|(?:AWS )?Libfabric)$")


def network_kind(name: str) -> str:
    """`rdma` for IB-family and EFA plugins, `socket` for TCP sockets, `other` otherwise."""
    if name == "Socket":
        return "socket"
    return "rdma" if _RDMA_NETWORK.match(name) else "other"


@dataclass(slots=True)
class _Process:
    """What one NCCL process said about itself (sets: the order of its lines is unknown)."""

    networks: set[str] = field(default_factory=set)  # `Using network …`
    hcas: set[str] = field(default_factory=set)  # `mlx5_0:1/RoCE`
    socket_using: bool = False
    no_device: bool = False
    gid_indices: set[int] = field(default_factory=set)
    gdr_summary: set[int] = field(default_factory=set)  # `… use ring PXN 0 GDR 1`


@dataclass(slots=True)
class _Channels:
    net: int = 0
    gdr: int = 0
    socket: int = 0
    proxied: int = 0  # PXN: sent through another local rank's NIC
    networks: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class RankTransport:
    rank: int
    host: str | None
    cuda_dev: int | None
    network: str | None  # IB, Socket, a plugin's name, or None when the log does not say
    hcas: tuple[str, ...]
    net_channels: int  # channels that cross nodes through NET
    gdr_channels: int  # of those, with GPUDirect RDMA
    socket_channels: int
    gid_indices: tuple[int, ...]
    pxn_channels: int = 0

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
    line_no: int  # 0 when the finding comes from the whole log, not one line
    line: str


@dataclass(frozen=True, slots=True)
class NcclLog:
    versions: tuple[str, ...]
    ranks: tuple[RankTransport, ...]
    diagnoses: tuple[Diagnosis, ...]
    nccl_lines: int
    nranks: int = 0  # the communicator's size as NCCL says it (0: not said)

    @property
    def hosts(self) -> tuple[str, ...]:
        """The hosts of the ranks the log shows (processes that never said their rank left
        out)."""
        return tuple(
            sorted({r.host for r in self.ranks if r.rank >= 0 and r.host not in (None, "?")})
        )

    @property
    def one_node(self) -> bool:
        """Whether the run was on one node: its ranks on one host and no more ranks in the
        communicator than that host's (a 16-rank run whose log shows one host is not)."""
        if len(self.hosts) > 1:
            return False
        shown = sum(1 for r in self.ranks if r.rank >= 0)
        return not self.nranks or self.nranks <= shown

    @property
    def version(self) -> str | None:
        return self.versions[0] if self.versions else None

    @property
    def net_channels(self) -> int:
        return sum(r.net_channels for r in self.ranks)

    @property
    def rdma_used(self) -> bool:
        kinds = {network_kind(r.network) for r in self.ranks if r.network}
        return (
            "rdma" in kinds
            and "socket" not in kinds
            and not any(r.socket_channels for r in self.ranks)
        )


@dataclass(slots=True)
class _Log:
    """Everything gathered from the lines, before it is resolved into ranks and findings."""

    processes: dict[tuple[str, int], _Process] = field(default_factory=dict)
    homes: dict[int, set[tuple[str, int, int]]] = field(default_factory=dict)
    channels: dict[int, _Channels] = field(default_factory=dict)
    diagnoses: dict[str, Diagnosis] = field(default_factory=dict)
    versions: set[str] = field(default_factory=set)
    gdr_causes: set[str] = field(default_factory=set)
    nccl_lines: int = 0
    nranks: set[int] = field(default_factory=set)  # `rank R nranks N cudaDev D`

    def note(self, finding: Finding, no: int, line: str) -> None:
        """Keep the earliest line of each finding as its evidence."""
        known = self.diagnoses.get(finding.name)
        if known is None or no < known.line_no:
            self.diagnoses[finding.name] = Diagnosis(finding, no, line)


def parse(text: str) -> NcclLog:
    log = _Log()
    for no, raw in enumerate(text.splitlines(), 1):
        line = strip_launcher_prefix(raw).strip()
        if m := _PREFIX.search(line):
            log.nccl_lines += 1
            _read_message(log, m, no, raw.strip())
        elif v := _BARE_VERSION.search(line):
            log.versions.add(v.group(1))
            log.nccl_lines += 1
    if not log.nccl_lines:
        lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
        if not lines:
            raise ParseError("NCCL log", "empty input")
        raise ParseError("NCCL log", "no 'host:pid:tid [dev] NCCL INFO' lines", *lines[0])
    ranks = _ranks(log)
    found = sorted(log.diagnoses.values(), key=lambda d: (d.line_no, d.finding.name))
    found += _whole_log_findings(log, ranks)
    return NcclLog(
        tuple(sorted(log.versions)), ranks, tuple(found), log.nccl_lines, max(log.nranks, default=0)
    )


def _read_message(log: _Log, m: re.Match[str], no: int, raw: str) -> None:
    key = (m["host"], int(m["pid"]))
    proc = log.processes.setdefault(key, _Process())
    msg = m["msg"].rstrip()
    for finding in failures.classify(msg):
        log.note(finding, no, raw)
    if v := _VERSION.search(msg):
        log.versions.add(v.group(1))
    elif u := _IB_USING.search(msg):
        proc.hcas.update(f"{d}:{p}/{ll}" for d, p, ll in _IB_DEV.findall(u.group(1)))
    elif _SOCKET_USING.search(msg):
        proc.socket_using = True
    elif n := _NETWORK.search(msg):
        proc.networks.add(n.group(1))
    elif "No device found" in msg and "NET/IB" in msg:
        proc.no_device = True
    elif c := _CHANNEL.search(msg):
        _read_channel(log, c, (*key, int(m["dev"])))
    elif g := _GID.search(msg):
        proc.gid_indices.add(int(g[1]))
    elif i := _INIT.search(msg):
        log.homes.setdefault(int(i[1]), set()).add((*key, int(i[3])))
        log.nranks.add(int(i[2]))
    elif s := _GDR_SUMMARY.search(msg):
        proc.gdr_summary.add(int(s[1]))
    elif _GDR_NO_MODULE.search(msg) or _GDR_HCA_OFF.search(msg):
        log.gdr_causes.add("module")
    elif _GDR_DISTANCE.search(msg):
        log.gdr_causes.add("distance")


def _read_channel(log: _Log, c: re.Match[str], home: tuple[str, int, int]) -> None:
    src, dst, direction, via = int(c[1]), int(c[2]), c[3], c[4]
    local = src if direction == "send" else dst
    log.homes.setdefault(local, set()).add(home)
    net = _NET_VIA.match(via)
    if net is None:
        return  # P2P, SHM, NVLS, CollNet: inside the node
    counts = log.channels.setdefault(local, _Channels())
    counts.net += 1
    counts.networks.add(net["net"])
    flags = net["flags"]
    counts.gdr += "/GDRDMA" in flags
    counts.socket += net["net"] == "Socket"
    counts.proxied += net["proxy"] is not None


def _ranks(log: _Log) -> tuple[RankTransport, ...]:
    """One row per rank; processes with no known rank get a row of their own (rank -1…)."""
    rows: list[RankTransport] = []
    seen: set[tuple[str, int]] = set()
    for rank in sorted(set(log.homes) | set(log.channels)):
        host, pid, dev = min(log.homes.get(rank) or {("?", -1, -1)})
        seen.add((host, pid))
        rows.append(_row(rank, host, dev, log.processes.get((host, pid)), log.channels.get(rank)))
    unranked = sorted(k for k in log.processes if k not in seen)
    for n, key in enumerate(unranked):
        rows.append(_row(-1 - n, key[0], None, log.processes[key], None))
    return tuple(rows)


def _row(
    rank: int, host: str, dev: int | None, proc: _Process | None, channels: _Channels | None
) -> RankTransport:
    counts = channels or _Channels()
    return RankTransport(
        rank=rank,
        host=host,
        cuda_dev=dev if dev is None or dev >= 0 else None,
        network=_network(proc, counts),
        hcas=tuple(sorted(proc.hcas)) if proc else (),
        net_channels=counts.net,
        gdr_channels=counts.gdr,
        socket_channels=counts.socket,
        gid_indices=tuple(sorted(proc.gid_indices)) if proc else (),
        pxn_channels=counts.proxied,
    )


def _network(proc: _Process | None, counts: _Channels) -> str | None:
    """The network a process chose: its own words first, then what its channels and device
    lines imply (NCCL 2.4–2.5 print no `Using network` line)."""
    named = (proc.networks if proc else set()) | counts.networks
    if named:
        # Socket wins a tie: a process that names both fell back on some connection.
        return "Socket" if "Socket" in named else min(named)
    if proc is None:
        return None
    if proc.socket_using or proc.no_device:
        return "Socket"
    return "IB" if proc.hcas else None


def _whole_log_findings(log: _Log, ranks: tuple[RankTransport, ...]) -> list[Diagnosis]:
    found = [_gdr_off(log, ranks), _gid_index_differs(ranks), _roce_gid_zero(log)]
    if len(log.versions) > 1:
        found.append(
            Finding(
                "version-skew",
                Status.WARN,
                f"ranks run different NCCL versions: {', '.join(sorted(log.versions))}",
                "run one NCCL version on every node (pin it in the image)",
            )
        )
    return [Diagnosis(f, 0, "") for f in found if f is not None]


def _gdr_off(log: _Log, ranks: tuple[RankTransport, ...]) -> Finding | None:
    no_gdr = [r.rank for r in ranks if r.net_channels and r.gdr != "on" and not r.socket_channels]
    summary_off = any(0 in p.gdr_summary for p in log.processes.values())
    if not no_gdr and not summary_off:
        return None
    why = []
    if "module" in log.gdr_causes:
        why.append("NCCL found no peer-memory module (nvidia_peermem) on the node")
    if "distance" in log.gdr_causes:
        why.append("GPU and NIC sit further apart than NCCL_NET_GDR_LEVEL allows")
    who = f"rank(s) {_short(no_gdr)}" if no_gdr else "this communicator (GDR 0)"
    return Finding(
        "gdr-off",
        Status.WARN,
        f"GPUDirect RDMA off on some channels of {who}: data is staged through host memory"
        + (f" ({'; '.join(why)})" if why else ""),
        "load nvidia_peermem on the node, keep GPU and NIC under one PCIe switch "
        "(rdmaplane pairs them), or raise NCCL_NET_GDR_LEVEL",
    )


def _gid_index_differs(ranks: tuple[RankTransport, ...]) -> Finding | None:
    indices = {i for r in ranks for i in r.gid_indices}
    if len(indices) <= 1:
        return None
    return Finding(
        "gid-index-differs",
        Status.WARN,
        f"ranks use different GID indices {sorted(indices)}",
        "set one NCCL_IB_GID_INDEX valid on every node (rdmaplane publishes "
        f"{names.GID_INDEX_LABEL})",
    )


def _roce_gid_zero(log: _Log) -> Finding | None:
    zero = sorted(
        f"{host}:{pid}"
        for (host, pid), p in log.processes.items()
        if p.gid_indices == {0} and any(h.endswith("/RoCE") for h in p.hcas)
    )
    if not zero:
        return None
    return Finding(
        "roce-gid-0",
        Status.WARN,
        f"RoCE queue pairs use GID index 0, the link-local entry on ConnectX ({_short(zero)}); "
        "NCCL <= 2.20 uses 0 unless told otherwise",
        "set NCCL_IB_GID_INDEX to the RoCE v2 IPv4 index `rdmaplane doctor` reports",
    )


def _short(items: Iterable[object]) -> str:
    shown = [str(i) for i in items]
    return ",".join(shown[:8]) + ("…" if len(shown) > 8 else "")
