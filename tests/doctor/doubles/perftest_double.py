#!/usr/bin/env python3
"""TEST DOUBLE of perftest's ib_write_bw / ib_write_lat — NOT perftest, measures nothing.

Used only by rdmaplane's tests, put on PATH as `ib_write_bw` and `ib_write_lat`. Like the real
tools, the server (no peer argument) listens on the TCP port given by -p (default 18515) and the
client connects to it for the out-of-band exchange; a refused connection prints perftest's error
and exits 1. Both sides then print output in perftest's format with figures taken from the
environment: DOUBLE_BW_GBPS (default 392.4) or DOUBLE_BW_GBPS_<hca>, DOUBLE_LAT_US (1.76).
DOUBLE_FAIL=<hca> makes that HCA's run fail like a QP that never reaches RTR.
"""

from __future__ import annotations

import os
import socket
import sys

RULE = "-" * 87


def options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    rest: list[str] = []
    flags = {"-F", "--report_gbits"}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in flags:
            opts[a] = "1"
        elif a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            opts[k] = v
        elif a.startswith("-"):
            opts[a] = argv[i + 1]
            i += 1
        else:
            rest.append(a)
        i += 1
    return opts, rest


def oob_exchange(port: int, peer: str | None) -> bool:
    if peer is None:
        srv = socket.create_server(("", port), reuse_port=False)
        srv.settimeout(60)
        conn, _ = srv.accept()
        conn.sendall(b"server-ready\n")
        conn.recv(64)
        conn.close()
        srv.close()
        return True
    try:
        conn = socket.create_connection((peer, port), timeout=5)
    except OSError:
        print(f"Couldn't connect to {peer}:{port}")
        print(
            "Unable to open file descriptor for socket connection "
            "Unable to init the socket connection"
        )
        return False
    conn.recv(64)
    conn.sendall(b"client-done\n")
    conn.close()
    return True


def banner(title: str, dev: str, gid: str | None, qps: str) -> list[str]:
    lines = [
        RULE,
        f"                    {title}",
        f" Dual-port       : OFF\t\tDevice         : {dev}",
        f" Number of qps   : {qps}\t\tTransport type : IB",
        " Connection type : RC\t\tUsing SRQ      : OFF",
        " PCIe relax order: ON\t\tLock-free      : OFF",
        " ibv_wr* API     : ON\t\tUsing DDP      : OFF",
        " TX depth        : 128",
        " CQ Moderation   : 1",
        " Mtu             : 4096[B]",
        f" Link type       : {'Ethernet' if gid is not None else 'IB'}",
    ]
    if gid is not None:
        lines.append(f" GID index       : {gid}")
    lines += [
        " Max inline data : 0[B]",
        " rdma_cm QPs\t : OFF",
        " Data ex. method : Ethernet",
        RULE,
    ]
    addr = " GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:99:91:39"
    lines += [
        " local address: LID 0000 QPN 0x0127 PSN 0x5c1e0a RKey 0x203e00 VAddr 0x007f3a8c5a1000"
    ]
    lines += [addr] if gid is not None else []
    lines += [
        " remote address: LID 0000 QPN 0x0128 PSN 0x2b7f91 RKey 0x203f00 VAddr 0x007fb1d43f2000"
    ]
    lines += [addr.replace("91:39", "92:17")] if gid is not None else []
    return [*lines, RULE]


def main() -> int:
    tool = os.path.basename(sys.argv[0])
    opts, rest = options(sys.argv[1:])
    dev = opts.get("-d", "mlx5_0")
    peer = rest[0] if rest else None
    if not oob_exchange(int(opts.get("-p", "18515")), peer):
        return 1
    if os.environ.get("DOUBLE_FAIL") == dev:
        print(" Failed to modify QP 0x0127 to RTR")
        print(" Unable to Connect the HCA's through the link")
        return 1
    gid = opts.get("-x")
    if tool.endswith("_bw"):
        bw = float(
            os.environ.get(f"DOUBLE_BW_GBPS_{dev}", os.environ.get("DOUBLE_BW_GBPS", "392.4"))
        )
        size = int(opts.get("-s", "65536"))
        lines = banner("RDMA_Write BW Test", dev, gid, opts.get("-q", "1"))
        duration = "-D" in opts
        if duration:
            lines.insert(0, "WARNING: BW peak won't be measured in this run.")
        unit = "Gb/sec" if "--report_gbits" in opts else "MiB/sec"
        value = bw if unit == "Gb/sec" else bw * 1e9 / 8 / 1048576
        iters = int(bw * 1e9 / 8 / size * float(opts.get("-D", "1"))) if duration else 5000
        peak = 0.0 if duration else value * 1.002
        lines += [
            f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]",
            f" {size:<7}    {iters:<10}       {peak:<7.2f}            {value:<7.2f}\t\t   "
            f"{bw * 1e9 / 8 / size / 1e6:<7.6f}",
            RULE,
        ]
    else:
        lat = float(os.environ.get("DOUBLE_LAT_US", "1.76"))
        lines = banner("RDMA_Write Latency Test", dev, gid, "1")
        lines += [
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    "
            "t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ",
            f" 2       {opts.get('-n', '1000'):<7}       {lat - 0.05:<7.2f}        "
            f"{lat * 3:<7.2f}      {lat:<7.2f}  \t       {lat + 0.02:<7.2f}     \t0.06   "
            f"\t\t{lat + 0.2:<7.2f} \t\t{lat * 3:<7.2f}",
            RULE,
        ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
