"""Read nccl-tests output (`all_reduce_perf` and the other collectives).

The table header names its columns: key columns (`size count type [redop] [root]`) then one group
of `time algbw busbw #wrong` (older builds: `error`) per variant, out-of-place first, in-place
second. Lines may carry launcher prefixes and NCCL INFO lines may sit between rows. The footer's
`# Avg bus bandwidth` is nccl-tests' mean over all rows, not the peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rdmaplane.doctor.verdict import ParseError, strip_launcher_prefix

_GROUP = ("time", "algbw", "busbw")
_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
    r"\s+\[([^\]]*)\]\s*(.*)$"
)
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(\w+)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\d{1,20}(?:\.\d{1,20})?)\s*$")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_NGPUS = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
_NUMBER = re.compile(r"^-?\d{1,30}(?:\.\d{1,30})?(?:e[-+]?\d{1,3})?$", re.I)


@dataclass(frozen=True, slots=True)
class Measure:
    """One variant (out-of-place or in-place) of one row; None where nccl-tests printed N/A."""

    time_us: float | None
    algbw_gbs: float | None
    busbw_gbs: float | None
    wrong: float | None  # `#wrong` count, or the max `error` of old builds


@dataclass(frozen=True, slots=True)
class Row:
    size: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    out_of_place: Measure
    in_place: Measure | None


@dataclass(frozen=True, slots=True)
class RankInfo:
    rank: int
    pid: int
    host: str
    device: int
    bus_id: str
    gpu: str


@dataclass(frozen=True, slots=True)
class NcclTestsResult:
    collective: str | None
    threads: int | None
    gpus_per_thread: int | None
    ranks: tuple[RankInfo, ...]
    rows: tuple[Row, ...]
    old_columns: bool  # `error` instead of `#wrong`, no `root`
    oob_values: int | None
    oob_ok: bool | None
    avg_busbw_reported: float | None

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.host for r in self.ranks))

    @property
    def peak_busbw(self) -> float:
        return max(_busbws(self.rows), default=0.0)

    @property
    def avg_busbw(self) -> float:
        """The footer's figure when printed, else the same mean computed over the rows."""
        if self.avg_busbw_reported is not None:
            return self.avg_busbw_reported
        values = list(_busbws(self.rows))
        return sum(values) / len(values) if values else 0.0

    @property
    def peak_row(self) -> Row:
        return max(self.rows, key=lambda r: max(_busbws((r,)), default=0.0))

    @property
    def wrong_total(self) -> float:
        """Sum of `#wrong` counts; old builds' `error` columns count as wrong only above 1e-3."""
        total = 0.0
        for row in self.rows:
            for m in (row.out_of_place, row.in_place):
                if m is not None and m.wrong is not None:
                    total += (1.0 if m.wrong > 1e-3 else 0.0) if self.old_columns else m.wrong
        return total


def _busbws(rows: tuple[Row, ...]) -> list[float]:
    return [
        m.busbw_gbs
        for r in rows
        for m in (r.out_of_place, r.in_place)
        if m is not None and m.busbw_gbs is not None
    ]


def parse(text: str) -> NcclTestsResult:
    collective: str | None = None
    threads = gpus = None
    ranks: list[RankInfo] = []
    rows: list[Row] = []
    keys: list[str] = []
    groups = 0
    old = False
    oob_values: int | None = None
    oob_ok: bool | None = None
    avg: float | None = None
    header_at: tuple[int, str] | None = None
    for no, raw in enumerate(text.splitlines(), 1):
        line = strip_launcher_prefix(raw).strip()
        if not line:
            continue
        if line.startswith("#"):
            if m := _STARTING.match(line):
                collective = m.group(1)
            elif m := _NGPUS.match(line):
                threads, gpus = int(m.group(1)), int(m.group(2))
            elif m := _RANK.match(line):
                ranks.append(
                    RankInfo(
                        rank=int(m.group(1)),
                        pid=int(m.group(2)),
                        host=m.group(3),
                        device=int(m.group(4)),
                        bus_id=m.group(5),
                        gpu=m.group(6).strip(),
                    )
                )
            elif m := _OOB.match(line):
                oob_values, oob_ok = int(m.group(1)), m.group(2).upper() == "OK"
            elif m := _AVG.match(line):
                avg = float(m.group(1))
            elif (header := _table_header(line)) is not None:
                keys, groups, old = header
                header_at = (no, raw)
            continue
        if not keys:
            continue
        tokens = line.split()
        if len(tokens) != len(keys) + 4 * groups or not tokens[0].isdigit():
            continue  # NCCL INFO lines, warnings and the like between rows
        row = _row(tokens, keys, groups)
        if row is None:
            raise ParseError("nccl-tests output", "row does not match the table header", no, raw)
        rows.append(row)
    if not keys:
        lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
        if not lines:
            raise ParseError("nccl-tests output", "empty input")
        raise ParseError(
            "nccl-tests output", "no result table ('# size count type …' header)", *lines[-1]
        )
    if not rows:
        assert header_at is not None
        raise ParseError("nccl-tests output", "table header without rows", *header_at)
    return NcclTestsResult(
        collective=collective,
        threads=threads,
        gpus_per_thread=gpus,
        ranks=tuple(ranks),
        rows=tuple(rows),
        old_columns=old,
        oob_values=oob_values,
        oob_ok=oob_ok,
        avg_busbw_reported=avg,
    )


def _table_header(line: str) -> tuple[list[str], int, bool] | None:
    """(key columns, number of variant groups, old column set) for a column header line."""
    tokens = line.lstrip("#").split()
    if "size" not in tokens or "busbw" not in tokens or "time" not in tokens:
        return None
    first = tokens.index("time")
    keys, rest = tokens[:first], tokens[first:]
    if len(rest) % 4 or not keys or keys[0] != "size":
        return None
    groups = len(rest) // 4
    for g in range(groups):
        group = rest[4 * g : 4 * g + 4]
        if tuple(group[:3]) != _GROUP or group[3] not in ("#wrong", "error"):
            return None
    return keys, groups, rest[3] == "error"


def _row(tokens: list[str], keys: list[str], groups: int) -> Row | None:
    head = dict(zip(keys, tokens, strict=False))
    try:
        size, count = int(head["size"]), int(head.get("count", "0"))
        root = int(head["root"]) if "root" in head else None
    except ValueError:
        return None
    measures: list[Measure] = []
    for g in range(groups):
        values = [_value(t) for t in tokens[len(keys) + 4 * g : len(keys) + 4 * g + 4]]
        if any(v is False for v in values):
            return None
        t, alg, bus, wrong = (v if isinstance(v, float) else None for v in values)
        measures.append(Measure(t, alg, bus, wrong))
    return Row(
        size=size,
        count=count,
        dtype=head.get("type", "?"),
        redop=head.get("redop"),
        root=root,
        out_of_place=measures[0],
        in_place=measures[1] if len(measures) > 1 else None,
    )


def _value(token: str) -> float | bool | None:
    """A float, None for N/A, False for anything else."""
    if token.upper() == "N/A":
        return None
    if _NUMBER.match(token):
        value = float(token)
        return value if value == value and abs(value) != float("inf") else False
    return False
