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

from rdmaplane.services.doctor.policy import failures
from rdmaplane.services.doctor.policy.verdict import ParseError

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
_COLUMN_SPLIT = re.compile(r"\s{2,}|\t+|\s(?=#)")  # `#bytes #iterations` share one space
_UNIT = re.compile(r"\[([^\]]+)\]$")
_RULE = re.compile(r"^\s*-{20,}\s*$")

# Known failures perftest prints instead of a table, and what to do about each (a completion
# error's status number is looked up in `failures.WC_STATUSES`).
KNOWN_FAILURES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"Unable to find the Infiniband/RoCE device|No IB devices found|IB device \S+ not found"
        ),
        "no such RDMA device in this container: request rdmaplane.io/hca, check /dev/infiniband "
        "and `-d` (`rdmaplane doctor` lists the usable HCAs)",
    ),
    (
        re.compile(r"Couldn't allocate MR|ibv_reg_mr|Cannot allocate memory", re.I),
        "memory registration failed: add the IPC_LOCK capability (or memlock unlimited); with "
        "--use_cuda, load nvidia_peermem or use DMA-BUF",
    ),
    (
        re.compile(r"Failed to modify QP \S* ?to RTR|Unable to Connect the HCA's through the link"),
        "QP did not reach RTR: use the same valid RoCE v2 GID index (-x) on both sides",
    ),
    (
        re.compile(r"Couldn't connect to|Unable to open file descriptor for socket connection"),
        "the out-of-band TCP connection failed: start the server first and check the peer "
        "address and port (18515 by default)",
    ),
    (
        re.compile(r"Completion with error at (?:client|server)"),
        "work completion error: see the status on the next line",
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


@dataclass(frozen=True, slots=True)
class Failure:
    """What perftest printed instead of a result, with its meaning and fix."""

    line_no: int
    line: str
    fix: str
    status: int | None  # the work-completion status, when perftest printed one

    @property
    def reason(self) -> str:
        if self.status is None:
            return self.fix
        f = failures.completion_finding(self.status)
        return f"{f.detail}; fix: {f.fix}"


def diagnose_failure(text: str) -> Failure | None:
    """The first known failure in the output; a completion status anywhere refines it."""
    first: Failure | None = None
    status: int | None = None
    for no, line in enumerate(text.splitlines(), 1):
        if status is None and (code := failures.completion_status(line)) is not None:
            status = code
            if first is None:
                first = Failure(no, line.strip(), "", code)
        for pattern, fix in KNOWN_FAILURES:
            if first is None and pattern.search(line):
                first = Failure(no, line.strip(), fix, None)
    if first is None:
        return None
    return Failure(first.line_no, first.line, first.fix, status)


@dataclass(frozen=True, slots=True)
class _Table:
    columns: list[str]  # normalised names: bytes, iterations, peak, average, msgrate, …
    unit: str | None  # the bandwidth unit the header names
    line_no: int


def _header(line: str, wanted: set[str]) -> _Table | None:
    """Split a result header into its columns (by the spacing perftest prints them with)."""
    names = [c for c in _COLUMN_SPLIT.split(line.strip()) if c]
    if not names or names[0] != "#bytes":
        return None
    columns = [_column_key(n) for n in names]
    if not wanted <= set(columns):
        return None
    units = [m.group(1) for n in names if n.startswith("BW average") and (m := _UNIT.search(n))]
    return _Table(columns, units[0] if units else None, 0)


def _column_key(name: str) -> str:
    bare = _UNIT.sub("", name).strip().lstrip("#").strip()
    return {
        "BW peak": "peak",
        "BW average": "average",
        "MsgRate": "msgrate",
        "99% percentile": "p99",
        "99.9% percentile": "p999",
        "tps average": "tps",
    }.get(bare, bare.lower().replace(" ", "_"))


def _rows(text: str, wanted: set[str]) -> tuple[_Table | None, list[dict[str, float]]]:
    """The last table header in the text and every row that fits it."""
    table: _Table | None = None
    rows: list[dict[str, float]] = []
    for no, line in enumerate(text.splitlines(), 1):
        if (found := _header(line, wanted)) is not None:
            table = _Table(found.columns, found.unit, no)
            continue
        values = _numbers(line)
        if table is None or values is None or len(values) != len(table.columns):
            continue
        rows.append(dict(zip(table.columns, values, strict=True)))
    return table, rows


def parse_bw(text: str) -> BwResult:
    what = "perftest bandwidth output"
    banner, warnings = _banner(text)
    table, raw_rows = _rows(text, {"bytes", "iterations", "average"})
    if table is None or not raw_rows:
        raise _no_result(what, text, table)
    rows = []
    for row in raw_rows:
        try:
            avg = to_gbps(row["average"], table.unit or "")
            peak = to_gbps(row["peak"], table.unit or "") if row.get("peak") else None
        except ValueError as e:
            raise ParseError(what, str(e), table.line_no, "") from e
        rows.append(
            BwRow(
                size=int(row["bytes"]),
                iterations=int(row["iterations"]),
                peak_gbps=peak,
                average_gbps=avg,
                msg_rate_mpps=row.get("msgrate"),
            )
        )
    duration = all(r.peak_gbps is None for r in rows)
    return BwResult(banner, table.unit or "", tuple(rows), duration, warnings)


def parse_lat(text: str) -> LatResult:
    banner, warnings = _banner(text)
    table, raw_rows = _rows(text, {"bytes", "iterations", "t_avg"})
    if table is None or not raw_rows:
        raise _no_result("perftest latency output", text, table)
    rows = tuple(
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
        for row in raw_rows
    )
    return LatResult(banner, rows, "t_min" not in table.columns, warnings)


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


def _no_result(what: str, text: str, table: _Table | None) -> ParseError:
    """Why there is no result: a known failure perftest printed, else what is missing."""
    known = diagnose_failure(text)
    if known:
        return ParseError(
            what, f"no result; perftest failed ({known.reason})", known.line_no, known.line
        )
    if table is not None:
        return ParseError(what, "table header without rows", table.line_no, "")
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines:
        return ParseError(what, "empty input")
    no, last = lines[-1]
    return ParseError(what, "no result table (no '#bytes' header); last line", no, last)
