"""Read nccl-tests output (`all_reduce_perf` and the other collectives), releases 2.0 to 2.19.

The table header names its columns: key columns (`size count type [redop] [root]`) then one
group per variant, out-of-place first, in-place second. Each group is `time algbw busbw error`
(2.0–2.11: the largest error, `%5.0le`, or `N/A` with `-c 0`) or `time algbw busbw #wrong`
(2.13+: a count or `N/A`); `time` reads `cputime` with `-C 1`, 2.19 adds `i_min i_max i_p99
i_cv%` per group with `-I 1`, and 2.18+ may end the row with a `timestamp` (`-S 1`, a date and a
time). Rank lines read `#   Rank  0 Pid … on host device  0 [0x18] NAME` (≤ 2.13), with
`Group  0` (2.14+), the bus id as `[0000:18:00]` (2.16+). The footer's `# Avg bus bandwidth`
(`# Avg bus bandwidth    : N`, padded `%-20s` in 2.18+) is nccl-tests' mean over all rows,
not the peak. A run that failed prints `host: Test NCCL failure file:line 'error / last
error'` instead of (part of) the table. Lines may carry launcher prefixes, and NCCL INFO lines
may sit between rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rdmaplane.services.doctor.policy import failures
from rdmaplane.services.doctor.policy.verdict import (
    Finding,
    ParseError,
    Status,
    strip_launcher_prefix,
)

_TIME = ("time", "cputime")
_WRONG = ("#wrong", "error")
_PER_ITERATION = ("i_min", "i_max", "i_p99", "i_cv%")
_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
    r"\s+\[([^\]]*)\]\s*(.*)$"
)
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(\w+)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\d{1,20}(?:\.\d{1,20})?(?:e[-+]?\d{1,3})?)\b")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_NGPUS = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
_NUMBER = re.compile(r"^-?\d{1,30}(?:\.\d{1,30})?(?:e[-+]?\d{1,3})?$", re.I)
_FAILURE = re.compile(
    r"^(?P<host>\S+): Test (?P<kind>NCCL|CUDA) failure (?P<where>\S+) '(?P<error>.*)'"
)


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
    old_columns: bool  # `error` instead of `#wrong`
    oob_values: int | None
    oob_ok: bool | None
    avg_busbw_reported: float | None
    failures: tuple[Finding, ...] = ()  # `Test NCCL failure` lines, each with its known cause

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
    def checked(self) -> bool:
        """False when every `#wrong` was N/A (`-c 0`): correctness was not checked."""
        return any(m.wrong is not None for m in _measures(self.rows))

    @property
    def wrong_total(self) -> float:
        """Sum of `#wrong` counts; old builds' `error` columns count as wrong only above 1e-3."""
        total = 0.0
        for m in _measures(self.rows):
            if m.wrong is not None:
                total += (1.0 if m.wrong > 1e-3 else 0.0) if self.old_columns else m.wrong
        return total


def _measures(rows: tuple[Row, ...]) -> list[Measure]:
    return [m for r in rows for m in (r.out_of_place, r.in_place) if m is not None]


def _busbws(rows: tuple[Row, ...]) -> list[float]:
    return [m.busbw_gbs for m in _measures(rows) if m.busbw_gbs is not None]


@dataclass(frozen=True, slots=True)
class _Header:
    keys: list[str]  # size count type [redop] [root]
    groups: list[list[str]]  # per variant: time algbw busbw #wrong [i_min i_max i_p99 i_cv%]
    timestamp: bool

    @property
    def width(self) -> int:
        return len(self.keys) + sum(len(g) for g in self.groups)

    @property
    def row_lengths(self) -> tuple[int, ...]:
        """A timestamp adds a date and a time after the in-place group."""
        return (self.width, self.width + 2) if self.timestamp else (self.width,)

    @property
    def old(self) -> bool:
        return self.groups[0][3] == "error"


def parse(text: str) -> NcclTestsResult:
    collective: str | None = None
    threads = gpus = None
    ranks: list[RankInfo] = []
    rows: list[Row] = []
    header: _Header | None = None
    header_at: tuple[int, str] | None = None
    oob_values: int | None = None
    oob_ok: bool | None = None
    avg: float | None = None
    failed: dict[str, Finding] = {}
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
                ranks.append(_rank(m))
            elif m := _OOB.match(line):
                oob_values, oob_ok = int(m.group(1)), m.group(2).upper() == "OK"
            elif m := _AVG.match(line):
                avg = float(m.group(1))
            elif (found := _table_header(line)) is not None:
                header, header_at = found, (no, raw)
            continue
        if m := _FAILURE.match(line):
            for f in _failure_findings(m):
                failed.setdefault(f.name, f)
            continue
        if header is None:
            continue
        tokens = line.split()
        if not tokens[0].isdigit() or len(tokens) not in header.row_lengths:
            continue  # NCCL INFO lines, warnings, trace-replay rows without out-of-place
        row = _row(tokens, header)
        if row is None:
            raise ParseError("nccl-tests output", "row does not match the table header", no, raw)
        rows.append(row)
    if header is None and not failed:
        lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
        if not lines:
            raise ParseError("nccl-tests output", "empty input")
        raise ParseError(
            "nccl-tests output", "no result table ('# size count type …' header)", *lines[-1]
        )
    if not rows and not failed:
        assert header_at is not None
        raise ParseError("nccl-tests output", "table header without rows", *header_at)
    return NcclTestsResult(
        collective=collective,
        threads=threads,
        gpus_per_thread=gpus,
        ranks=tuple(ranks),
        rows=tuple(rows),
        old_columns=header.old if header else False,
        oob_values=oob_values,
        oob_ok=oob_ok,
        avg_busbw_reported=avg,
        failures=tuple(failed.values()),
    )


def _rank(m: re.Match[str]) -> RankInfo:
    return RankInfo(
        rank=int(m.group(1)),
        pid=int(m.group(2)),
        host=m.group(3),
        device=int(m.group(4)),
        bus_id=m.group(5),
        gpu=m.group(6).strip(),
    )


def _failure_findings(m: re.Match[str]) -> list[Finding]:
    """The failure itself, then whatever its quoted NCCL error says (`error / last error`)."""
    error = m["error"]
    run = Finding(
        "run-failed",
        Status.FAIL,
        f"{m['host']}: Test {m['kind']} failure at {m['where']}: {error}",
        "rerun with NCCL_DEBUG=INFO and feed the output to `rdmaplane doctor nccl-log`",
    )
    return [run, *failures.classify(error)]


def _table_header(line: str) -> _Header | None:
    """The column layout of a header line, or None when the line is not one."""
    tokens = line.lstrip("#").split()
    starts = [i for i, t in enumerate(tokens) if t in _TIME]
    if not starts or "size" not in tokens[: starts[0]] or tokens[0] != "size":
        return None
    timestamp = tokens[-1] == "timestamp"
    body = tokens[: len(tokens) - timestamp]
    groups = [body[a:b] for a, b in zip(starts, [*starts[1:], len(body)], strict=True)]
    for group in groups:
        if group[1:3] != ["algbw", "busbw"] or len(group) < 4 or group[3] not in _WRONG:
            return None
        if group[4:] and tuple(group[4:]) != _PER_ITERATION:
            return None
    return _Header(tokens[: starts[0]], groups, timestamp)


def _row(tokens: list[str], header: _Header) -> Row | None:
    head = dict(zip(header.keys, tokens, strict=False))
    try:
        size, count = int(head["size"]), int(head.get("count", "0"))
        root = int(head["root"]) if "root" in head else None
    except ValueError:
        return None
    measures: list[Measure] = []
    at = len(header.keys)
    for group in header.groups:
        values = [_value(t) for t in tokens[at : at + 4]]
        at += len(group)
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
