"""Read perftest (`ib_write_bw`, `ib_write_lat`, …) output by its headers, never by line number.

perftest prints a banner of `Key : value` pairs (two per line in places, the set depends on the
version), the local and remote address lines (GIDs in decimal bytes), then a result table whose
header names the columns and their unit. Builds before 2024 say `MB/sec`, later `MiB/sec`; both
are 2^20 bytes per second (perftest divides by 0x100000). `--report_gbits` gives decimal Gb/sec.
Warnings may sit anywhere, server and client output may interleave, and `-D` (duration mode)
reports no peak (0.00) and a total iteration count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rdmaplane.doctor.verdict import ParseError

_BANNER_KEYS = {
    "device": "device",
    "link type": "link_type",
    "gid index": "gid_index",
    "transport type": "transport",
    "connection type": "connection",
    "number of qps": "qps",
    "mtu": "mtu",
}
_BANNER_PAIR = re.compile(r"([A-Za-z][A-Za-z .*-]*?)\s*:\s*(\S+)")
_TITLE = re.compile(r"^\s*((?:RDMA_\w+|Send|Atomic\w*)\s+(?:BW|Lat)\w*\s+Test)\s*$", re.I)
_GID_LINE = re.compile(r"^\s*GID:\s*((?:\d{1,3}:){15}\d{1,3})\s*$")
_ADDRESS = re.compile(r"^\s*(local|remote) address:", re.I)
_NUMBER = re.compile(r"^-?\d{1,30}(?:\.\d{1,30})?$")
_BW_COLUMN = re.compile(r"(#bytes|#iterations|BW peak\[([^\]]+)\]|BW average\[([^\]]+)\]|MsgRate)")
_LAT_COLUMN = re.compile(
    r"(#bytes|#iterations|t_min|t_max|t_typical|t_avg|t_stdev|99\.9% percentile|99% percentile"
    r"|tps average)"
)
_RULE = re.compile(r"^\s*-{20,}\s*$")

# Known failures perftest prints instead of a table, and what to do about each.
KNOWN_FAILURES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"Unable to find the Infiniband/RoCE device|No IB devices found", re.I),
        "no RDMA device in this container: request rdmaplane.io/hca and check /dev/infiniband",
    ),
    (
        re.compile(r"Couldn't allocate MR|Cannot allocate memory|ibv_reg_mr", re.I),
        "memory registration failed: raise the memlock limit (ulimit -l unlimited) and add "
        "the IPC_LOCK capability",
    ),
    (
        re.compile(
            r"Failed to modify QP \S* to RTR|Unable to Connect the HCA's through the link", re.I
        ),
        "QP did not reach RTR: use the same valid RoCE v2 GID index (-x) on both sides",
    ),
    (
        re.compile(
            r"Couldn't connect to|Unable to open file descriptor for socket connection", re.I
        ),
        "the out-of-band TCP connection failed: start the server first and check the peer "
        "address and port (18515 by default)",
    ),
    (
        re.compile(r"Completion with error at (?:client|server)", re.I),
        "work completion error (often status 12, retry exceeded): GID index or fabric "
        "(PFC/MTU) mismatch between the pair",
    ),
)


@dataclass(frozen=True, slots=True)
class BwRow:
    size: int
    iterations: int
    peak_gbps: float | None  # None in duration mode (perftest prints 0.00)
    average_gbps: float
    msg_rate_mpps: float | None


@dataclass(frozen=True, slots=True)
class LatRow:
    size: int
    iterations: int
    min_us: float | None
    max_us: float | None
    typical_us: float | None
    avg_us: float | None
    stdev_us: float | None
    p99_us: float | None
    p999_us: float | None


@dataclass(frozen=True, slots=True)
class Banner:
    """What the banner and address lines said (any of it may be missing)."""

    title: str | None = None
    device: str | None = None
    link_type: str | None = None
    gid_index: int | None = None
    transport: str | None = None
    connection: str | None = None
    qps: int | None = None
    mtu: str | None = None
    local_gid: str | None = None
    remote_gid: str | None = None


@dataclass(frozen=True, slots=True)
class BwResult:
    banner: Banner
    unit: str  # as printed: Gb/sec, MB/sec or MiB/sec
    rows: tuple[BwRow, ...]
    duration_mode: bool
    warnings: tuple[str, ...]

    @property
    def best_average_gbps(self) -> float:
        return max(r.average_gbps for r in self.rows)


@dataclass(frozen=True, slots=True)
class LatResult:
    banner: Banner
    rows: tuple[LatRow, ...]
    duration_mode: bool
    warnings: tuple[str, ...]

    @property
    def typical_us(self) -> float | None:
        """The smallest message's typical (else average) latency: what people quote."""
        first = min(self.rows, key=lambda r: r.size)
        return first.typical_us if first.typical_us is not None else first.avg_us


def to_gbps(value: float, unit: str) -> float:
    """Convert a perftest figure to decimal Gb/s; raises ValueError on an unknown unit."""
    u = unit.strip()
    if u.lower() == "gb/sec":
        return value
    if u in ("MB/sec", "MiB/sec"):
        return value * 1048576 * 8 / 1e9
    raise ValueError(f"unknown bandwidth unit {unit!r}")


def diagnose_failure(text: str) -> tuple[int, str, str] | None:
    """The first known failure message in the output: line number, line, fix."""
    for no, line in enumerate(text.splitlines(), 1):
        for pattern, fix in KNOWN_FAILURES:
            if pattern.search(line):
                return no, line.strip(), fix
    return None


def parse_bw(text: str) -> BwResult:
    banner, warnings = _banner(text)
    unit: str | None = None
    columns: list[str] = []
    rows: list[BwRow] = []
    header_line = 0
    for no, line in enumerate(text.splitlines(), 1):
        cols = _BW_COLUMN.findall(line)
        keys = [_bw_key(c[0]) for c in cols]
        if {"bytes", "iterations", "average"} <= set(keys):
            columns = keys
            unit = next(c[2] for c in cols if c[0].startswith("BW average"))
            header_line = no
            continue
        values = _numbers(line)
        if not columns or values is None or len(values) < len(columns):
            continue
        row = dict(zip(columns, values, strict=False))
        try:
            avg = to_gbps(row["average"], unit or "")
            peak = to_gbps(row["peak"], unit or "") if row.get("peak") else None
        except ValueError as e:
            raise ParseError("perftest bandwidth output", str(e), header_line, "") from e
        rows.append(
            BwRow(
                size=int(row["bytes"]),
                iterations=int(row["iterations"]),
                peak_gbps=peak,
                average_gbps=avg,
                msg_rate_mpps=row.get("msgrate"),
            )
        )
    if unit is None:
        raise _no_table("perftest bandwidth output", text)
    if not rows:
        raise ParseError("perftest bandwidth output", "table header without rows", header_line, "")
    duration = all(r.peak_gbps is None for r in rows)
    return BwResult(banner, unit, tuple(rows), duration, warnings)


def parse_lat(text: str) -> LatResult:
    banner, warnings = _banner(text)
    columns: list[str] = []
    rows: list[LatRow] = []
    header_line = 0
    for no, line in enumerate(text.splitlines(), 1):
        keys = [_lat_key(c) for c in _LAT_COLUMN.findall(line)]
        if {"bytes", "iterations"} <= set(keys) and {"t_avg", "t_typical"} & set(keys):
            columns = keys
            header_line = no
            continue
        values = _numbers(line)
        if not columns or values is None or len(values) < len(columns):
            continue
        row = dict(zip(columns, values, strict=False))
        rows.append(
            LatRow(
                size=int(row["bytes"]),
                iterations=int(row["iterations"]),
                min_us=row.get("t_min"),
                max_us=row.get("t_max"),
                typical_us=row.get("t_typical"),
                avg_us=row.get("t_avg"),
                stdev_us=row.get("t_stdev"),
                p99_us=row.get("p99"),
                p999_us=row.get("p999"),
            )
        )
    if not columns:
        raise _no_table("perftest latency output", text)
    if not rows:
        raise ParseError("perftest latency output", "table header without rows", header_line, "")
    duration = "t_min" not in columns
    return LatResult(banner, tuple(rows), duration, warnings)


def _bw_key(column: str) -> str:
    if column.startswith("BW peak"):
        return "peak"
    if column.startswith("BW average"):
        return "average"
    return column.lstrip("#").lower()


def _lat_key(column: str) -> str:
    return {"#bytes": "bytes", "#iterations": "iterations", "99% percentile": "p99"}.get(
        column, "p999" if column.startswith("99.9") else column.replace(" ", "_")
    )


def _numbers(line: str) -> list[float] | None:
    """A table row is nothing but numbers; anything else (warnings, banners) is not one."""
    tokens = line.split()
    if not tokens or not all(_NUMBER.match(t) for t in tokens):
        return None
    return [float(t) for t in tokens]


def _banner(text: str) -> tuple[Banner, tuple[str, ...]]:
    found: dict[str, str] = {}
    gids: dict[str, str | None] = {}
    warnings: list[str] = []
    side: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if m := _TITLE.match(line):
            found.setdefault("title", m.group(1))
        elif m := _ADDRESS.match(line):
            side = m.group(1).lower()
        elif (m := _GID_LINE.match(line)) and side:
            gids.setdefault(side, _gid_from_decimal(m.group(1)))
        elif stripped.lower().startswith(("warning", "ethernet_read_keys", "requested mtu")):
            warnings.append(stripped)
        elif ":" in stripped and not _RULE.match(line):
            for key, value in _BANNER_PAIR.findall(line):
                name = _BANNER_KEYS.get(key.strip().lower())
                if name:
                    found.setdefault(name, value)
    return (
        Banner(
            title=found.get("title"),
            device=found.get("device"),
            link_type=found.get("link_type"),
            gid_index=_int_or_none(found.get("gid_index")),
            transport=found.get("transport"),
            connection=found.get("connection"),
            qps=_int_or_none(found.get("qps")),
            mtu=found.get("mtu"),
            local_gid=gids.get("local"),
            remote_gid=gids.get("remote"),
        ),
        tuple(warnings),
    )


def _gid_from_decimal(text: str) -> str | None:
    """`00:…:255:255:10:99:91:39` (decimal bytes) → the full-form hex GID sysfs prints."""
    parts = [int(p) for p in text.split(":")]
    if any(p > 255 for p in parts):
        return None
    h = bytes(parts).hex()
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _no_table(what: str, text: str) -> ParseError:
    known = diagnose_failure(text)
    if known:
        no, line, fix = known
        return ParseError(what, f"no result table; perftest failed ({fix})", no, line)
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines:
        return ParseError(what, "empty input")
    no, last = lines[-1]
    return ParseError(what, "no result table (no '#bytes' header); last line", no, last)
