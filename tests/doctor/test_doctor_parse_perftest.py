"""perftest 4.x to 26.x outputs: units, sweeps, duration mode, banners and failures."""

from __future__ import annotations

import pytest

from rdmaplane.services.doctor.policy.parse_perftest import (
    diagnose_failure,
    parse_bw,
    parse_lat,
    to_gbps,
)
from rdmaplane.services.doctor.policy.verdict import ParseError
from tests.doctor.corpus import FIXTURES, tool_output

MIB = 1048576 * 8 / 1e9  # one MB/sec (perftest's 2^20 bytes) in Gb/s

# fixture → (unit, rows, best average Gb/s, device, link type, GID index, duration mode)
BANDWIDTH = {
    "v4.2_write_bw_mb_ib_sizes": ("MB/sec", 4, 23570.04 * MIB, "mlx5_3", "IB", None, False),
    "v4.4_write_bw_interleaved_loopback": ("Gb/sec", 2, 92.55, "mlx5_0", "Ethernet", 3, False),
    "v4.5_write_bw_sweep_a_roce_mb": ("MB/sec", 23, 11784.54 * MIB, "mlx5_0", "Ethernet", 3, False),
    "v23.10_write_bw_duration_4qps": ("Gb/sec", 1, 371.72, "mlx5_0", "Ethernet", 3, True),
    "v24.07_read_bw_sweep_gbits_ib": ("Gb/sec", 23, 390.53, "mlx5_3", "IB", None, False),
    "v25.04_write_bw_gbits_roce": ("Gb/sec", 1, 388.92, "mlx5_0", "Ethernet", 3, False),
    "v25.10_write_bw_mib_server_ib": ("MiB/sec", 1, 46198.33 * MIB, "mlx5_4", "IB", None, False),
}
# fixture → (rows, typical µs of the smallest message, GID index, duration mode)
LATENCY = {
    "v4.2_write_lat_duration_ib": (1, 0.94, None, True),
    "v24.01_write_lat_roce": (1, 1.76, 3, False),
    "v24.01_write_lat_sweep_a_roce": (23, 1.62, 3, False),
}
# fixture → (line number of the failure, words of the diagnosis, completion status)
FAILURES = {
    "v4.5_write_bw_connect_refused": (1, "start the server first", None),
    "v4.5_write_bw_no_device": (1, "no such RDMA device", None),
    "v23.10_write_bw_cqe12": (23, "IBV_WC_RETRY_EXC_ERR", 12),
    "v24.04_write_bw_mr_failed": (1, "IPC_LOCK", None),
    "v24.10_write_bw_rtr_failed": (22, "GID index (-x)", None),
    "v26.04_write_bw_cqe10_named": (24, "IBV_WC_REM_ACCESS_ERR", 10),
}


def output(name: str) -> str:
    return tool_output(FIXTURES / "perftest" / f"{name}.txt")


def test_the_corpus_covers_every_fixture():
    named = set(BANDWIDTH) | set(LATENCY) | set(FAILURES)
    assert {p.stem for p in (FIXTURES / "perftest").glob("*.txt")} == named


@pytest.mark.parametrize("name", sorted(BANDWIDTH))
def test_bandwidth_tables(name):
    unit, rows, best, device, link, gid, duration = BANDWIDTH[name]
    r = parse_bw(output(name))
    assert (r.unit, len(r.rows), r.duration_mode) == (unit, rows, duration)
    assert r.best_average_gbps == pytest.approx(best, rel=1e-4)
    assert (r.banner.device, r.banner.link_type, r.banner.gid_index) == (device, link, gid)
    assert r.banner.title in ("RDMA_Write BW Test", "RDMA_Read BW Test")


@pytest.mark.parametrize("name", sorted(LATENCY))
def test_latency_tables(name):
    rows, typical, gid, duration = LATENCY[name]
    r = parse_lat(output(name))
    assert (len(r.rows), r.typical_us, r.banner.gid_index, r.duration_mode) == (
        rows,
        typical,
        gid,
        duration,
    )


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_failures_name_the_line_the_cause_and_the_fix(name):
    line_no, words, status = FAILURES[name]
    with pytest.raises(ParseError) as e:
        parse_bw(output(name))
    assert e.value.line_no == line_no and words in str(e.value)
    known = diagnose_failure(output(name))
    assert known is not None and known.status == status


def test_roce_banner_and_decimal_gids():
    r = parse_bw(output("v25.04_write_bw_gbits_roce"))
    assert r.banner.qps == 1
    assert r.banner.local_gid == "0000:0000:0000:0000:0000:ffff:0a63:5b27"
    assert r.banner.remote_gid == "0000:0000:0000:0000:0000:ffff:0a63:5c11"
    (row,) = r.rows
    assert (row.size, row.iterations) == (65536, 5000)
    assert row.peak_gbps == pytest.approx(389.41)
    assert row.msg_rate_mpps == pytest.approx(0.741806)


def test_sweeps_keep_every_size():
    r = parse_bw(output("v4.5_write_bw_sweep_a_roce_mb"))
    assert [row.size for row in r.rows] == [2**i for i in range(1, 24)]
    lat = parse_lat(output("v24.01_write_lat_sweep_a_roce"))
    assert lat.rows[-1].size == 8388608 and lat.rows[-1].p999_us is not None


def test_duration_mode_has_no_peak():
    r = parse_bw(output("v23.10_write_bw_duration_4qps"))
    assert r.rows[0].peak_gbps is None and r.rows[0].iterations == 443127
    assert r.banner.qps == 4
    assert any("BW peak won't be measured" in w for w in r.warnings)


def test_interleaved_server_and_client():
    r = parse_bw(output("v4.4_write_bw_interleaved_loopback"))
    assert r.banner.mtu == "1024[B]"
    assert any("Requested mtu" in w for w in r.warnings)
    assert r.banner.local_gid == "0000:0000:0000:0000:0000:ffff:c0a8:280b"


def test_latency_columns():
    (row,) = parse_lat(output("v24.01_write_lat_roce")).rows
    assert row.size == 2 and row.iterations == 1000
    assert (row.min_us, row.max_us, row.typical_us) == (1.71, 5.83, 1.76)
    assert (row.avg_us, row.stdev_us, row.p99_us, row.p999_us) == (1.78, 0.06, 1.98, 5.83)


def test_bw_table_is_not_a_latency_table():
    with pytest.raises(ParseError, match="could not parse perftest latency output"):
        parse_lat(output("v25.04_write_bw_gbits_roce"))


def test_dual_port_columns_do_not_shift_the_figures():
    text = (
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]   "
        "BW Port1[Gb/sec]   MsgRate Port1[Mpps]   BW Port2[Gb/sec]   MsgRate Port2[Mpps]\n"
        " 65536      5000           190.10             189.70\t\t   0.361831        94.85"
        "            0.180915              94.85            0.180915\n"
    )
    (row,) = parse_bw(text).rows
    assert (row.average_gbps, row.msg_rate_mpps) == (189.70, 0.361831)


def test_header_without_rows_and_empty_input():
    text = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
    with pytest.raises(ParseError, match="without rows"):
        parse_bw(text)
    with pytest.raises(ParseError, match="empty input"):
        parse_bw("")


def test_units():
    assert to_gbps(100.0, "Gb/sec") == 100.0
    assert to_gbps(1000.0, "MB/sec") == to_gbps(1000.0, "MiB/sec") == pytest.approx(8.388608)
    with pytest.raises(ValueError, match="unknown bandwidth unit"):
        to_gbps(1.0, "furlongs")
