"""Throughput of the doctor's parsers on large inputs (a 1024-rank NCCL log, a long sweep).

Usage: python bench/doctor_parsers.py [--ranks N] [--runs N]

Builds an NCCL_DEBUG=INFO log of N ranks on N/8 hosts (init, NET/IB, channel and GID lines per
rank, as NCCL 2.21 prints them), the same lines shuffled (the reader gathers facts order-free, so
an interleaved log costs the same), and an all_reduce_perf output with 4096 rows, then prints the
median parse time and lines per second of each.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from rdmaplane.services.doctor.policy import parse_nccl_log, parse_nccl_tests


def nccl_log(ranks: int) -> str:
    lines = []
    for r in range(ranks):
        host, dev, pid = f"node-{r // 8:04d}", r % 8, 4000 + r // 8
        p = f"{host}:{pid}:{pid + 40 + dev} [{dev}] NCCL INFO"
        lines += [
            f"{p} NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; "
            f"OOB eth0:10.1.{r // 8}.2<0>",
            f"{p} Using network IB",
            f"{p} ncclCommInitRank comm 0x55d4c61a{r:04x} rank {r} nranks {ranks} cudaDev {dev} "
            f"nvmlDev {dev} busId 18000 commId 0x9e1f0c2a7d3b4e11 - Init COMPLETE",
        ]
        for c in range(16):
            peer = (r + 8) % ranks
            lines.append(
                f"{p} Channel {c:02d}/0 : {r}[{dev}] -> {peer}[{dev}] [send] "
                f"via NET/IB/{c % 2}/GDRDMA"
            )
        lines.append(
            f"{p} NET/IB: NCCL Dev 0 IbDev 0 Port 1 qpn {1000 + r} mtu 5 GID 3 (0/5B2A0A0AFFFF0000)"
        )
    return "\n".join(lines) + "\n"


def nccl_tests(rows: int) -> str:
    head = [
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 1024(bytes) warmup iters: 5",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
    ]
    body = [
        f"{8 * (i + 1):>12} {2 * (i + 1):>13}     float     sum      -1    38.00    0.00    0.00"
        "      0    38.15    0.00    0.00      0"
        for i in range(rows)
    ]
    return "\n".join(head + body + ["# Out of bounds values : 0 OK", "# Avg bus bandwidth : 0.0"])


def timed(parse: Callable[[str], object], text: str, runs: int) -> float:
    parse(text)
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        parse(text)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    log = nccl_log(args.ranks)
    shuffled = log.splitlines()
    random.Random(1).shuffle(shuffled)
    for name, parse, text in (
        (f"nccl-log, {args.ranks} ranks", parse_nccl_log.parse, log),
        (f"nccl-log, {args.ranks} ranks, shuffled", parse_nccl_log.parse, "\n".join(shuffled)),
        ("nccl-tests, 4096 rows", parse_nccl_tests.parse, nccl_tests(4096)),
    ):
        seconds = timed(parse, text, args.runs)
        lines = text.count("\n") + 1
        print(
            f"{name}: {lines} lines, median {seconds * 1000:.1f} ms, "
            f"{lines / seconds / 1000:.0f} k lines/s"
        )


if __name__ == "__main__":
    main()
