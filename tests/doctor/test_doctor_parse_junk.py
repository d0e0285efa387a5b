"""Every doctor parser, fed junk: never a crash, only a "could not parse" naming the line."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.services.doctor.policy import parse_nccl_log, parse_nccl_tests, parse_perftest
from rdmaplane.services.doctor.policy.verdict import ParseError

# Lines that look almost right to each parser: they reach deeper than random text does.
PERFTEST = [
    "#bytes BW average[Gb/sec] #iterations",
    " 1 2 3 4 5",
    "x : y",
    " GID: 1:2:3",
    " local address:",
    "BW peak[MB/sec]",
    "1e999",
    " #bytes t_avg[usec]",
    "-",
    "999:" * 16,
]
NEAR_MISSES: dict[str, tuple[Callable[[str], object], list[str]]] = {
    "nccl_log": (
        parse_nccl_log.parse,
        [
            "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
            "h:1:2 [1] NCCL INFO Channel 00/0 : 5[0] -> 1[0] [receive] via NET/Socket/0",
            "h:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1 - Init COMPLETE",
            "h:2:2 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 3 busId 1 - Init COMPLETE",
            "h:1:2 [0] NCCL INFO NET/IB : Using [0]x:1/IB ; OOB",
            "h:1:2 [0] NCCL INFO Using network",
            "h:1:2 [0] NCCL INFO NET/IB: NCCL Dev 0 IbDev 0 Port 1 qpn 1 mtu 3 GID -1 (0/0)",
            "h:1:2 [0] NCCL WARN status=12",
            "g:9:9 [3] NCCL INFO NET/IB : No device found.",
        ],
    ),
    "nccl_tests": (
        parse_nccl_tests.parse,
        [
            "# size count type redop root time algbw busbw #wrong time algbw busbw #wrong",
            "# size time algbw busbw error",
            "1 2 3 4 5 6 7 8 9 10 11 12 13",
            "8 2 float sum -1 1e999 1 1 0",
            "# Avg bus bandwidth : 1.2.3",
            "# Out of bounds values : 9 OK",
            "#  Rank x",
            "0: 1 2",
            "",
        ],
    ),
    "perftest_bw": (parse_perftest.parse_bw, PERFTEST),
    "perftest_lat": (parse_perftest.parse_lat, PERFTEST),
}
PARSERS = {name: parse for name, (parse, _) in NEAR_MISSES.items()}


def _never_crashes(parse: Callable[[str], object], text: str) -> None:
    try:
        parse(text)
    except ParseError as e:
        assert str(e).startswith("could not parse")


@pytest.mark.parametrize("name", sorted(PARSERS))
@given(text=st.text())
def test_junk_never_crashes(name: str, text: str) -> None:
    _never_crashes(PARSERS[name], text)


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
@given(data=st.data())
def test_near_miss_junk_never_crashes(name: str, data: st.DataObject) -> None:
    parse, lines = NEAR_MISSES[name]
    text = "\n".join(data.draw(st.lists(st.sampled_from(lines))))
    _never_crashes(parse, text)
