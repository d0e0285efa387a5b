from __future__ import annotations

import pytest

from rdmaplane.doctor.parse_perftest import diagnose_failure, parse_bw, parse_lat, to_gbps
from rdmaplane.doctor.verdict import ParseError


def test_gbits_roce_client(fixture_text):
    r = parse_bw(fixture_text("perftest/write_bw_gbits_roce.txt"))
    assert r.unit == "Gb/sec"
    assert r.banner.device == "mlx5_0"
    assert r.banner.link_type == "Ethernet"
    assert r.banner.gid_index == 3
    assert r.banner.qps == 1
    assert r.banner.title == "RDMA_Write BW Test"
    assert r.banner.local_gid == "0000:0000:0000:0000:0000:ffff:0a63:5b27"
    assert r.banner.remote_gid == "0000:0000:0000:0000:0000:ffff:0a63:5c11"
    (row,) = r.rows
    assert (row.size, row.iterations) == (65536, 5000)
    assert row.peak_gbps == pytest.approx(389.41)
    assert row.average_gbps == pytest.approx(388.92)
    assert row.msg_rate_mpps == pytest.approx(0.741806)
    assert not r.duration_mode


def test_mb_per_sec_is_mebibytes(fixture_text):
    r = parse_bw(fixture_text("perftest/write_bw_mb_ib_2021.txt"))
    assert r.unit == "MB/sec"
    assert r.banner.link_type == "IB"
    assert r.banner.gid_index is None
    assert [row.size for row in r.rows] == [2, 4, 65536, 8388608]
    # 23570.04 MiB/s = 23570.04 * 2^20 * 8 bits
    assert r.best_average_gbps == pytest.approx(23570.04 * 1048576 * 8 / 1e9)
    assert 197 < r.best_average_gbps < 198


def test_mib_per_sec_after_2024_with_new_banner_lines(fixture_text):
    r = parse_bw(fixture_text("perftest/write_bw_mib_server_2024.txt"))
    assert r.unit == "MiB/sec"
    assert r.banner.device == "mlx5_4"
    assert r.best_average_gbps == pytest.approx(46198.33 * 1048576 * 8 / 1e9)


def test_duration_mode_has_no_peak(fixture_text):
    r = parse_bw(fixture_text("perftest/write_bw_duration_gbits.txt"))
    assert r.duration_mode
    assert r.rows[0].peak_gbps is None
    assert r.rows[0].iterations == 443127
    assert r.best_average_gbps == pytest.approx(371.72)
    assert r.banner.qps == 4
    assert any("BW peak won't be measured" in w for w in r.warnings)


def test_interleaved_server_and_client(fixture_text):
    r = parse_bw(fixture_text("perftest/write_bw_interleaved_loopback.txt"))
    assert len(r.rows) == 2
    assert r.best_average_gbps == pytest.approx(92.55)
    assert r.banner.mtu == "1024[B]"
    assert any("Requested mtu" in w for w in r.warnings)
    assert r.banner.local_gid == "0000:0000:0000:0000:0000:ffff:c0a8:280b"


def test_latency(fixture_text):
    r = parse_lat(fixture_text("perftest/write_lat_roce.txt"))
    (row,) = r.rows
    assert row.size == 2 and row.iterations == 1000
    assert (row.min_us, row.max_us, row.typical_us) == (1.71, 5.83, 1.76)
    assert (row.avg_us, row.stdev_us, row.p99_us, row.p999_us) == (1.78, 0.06, 1.98, 5.83)
    assert r.typical_us == 1.76
    assert r.banner.title == "RDMA_Write Latency Test"
    assert not r.duration_mode


def test_latency_duration_mode(fixture_text):
    r = parse_lat(fixture_text("perftest/write_lat_duration_ib.txt"))
    assert r.duration_mode
    (row,) = r.rows
    assert row.avg_us == 0.94 and row.min_us is None
    assert r.typical_us == 0.94


def test_failure_names_the_line_and_fix(fixture_text):
    text = fixture_text("perftest/write_bw_connect_failed.txt")
    with pytest.raises(ParseError) as e:
        parse_bw(text)
    assert e.value.line_no == 10
    assert "Couldn't connect to 10.99.92.17:18515" in str(e.value)
    assert "start the server first" in str(e.value)
    assert diagnose_failure(text) is not None


def test_bw_table_is_not_a_latency_table(fixture_text):
    with pytest.raises(ParseError, match="could not parse perftest latency output"):
        parse_lat(fixture_text("perftest/write_bw_gbits_roce.txt"))


def test_header_without_rows():
    text = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
    with pytest.raises(ParseError, match="without rows"):
        parse_bw(text)


def test_empty_input():
    with pytest.raises(ParseError, match="empty input"):
        parse_bw("")


def test_units():
    assert to_gbps(100.0, "Gb/sec") == 100.0
    assert to_gbps(1000.0, "MB/sec") == to_gbps(1000.0, "MiB/sec") == pytest.approx(8.388608)
    with pytest.raises(ValueError, match="unknown bandwidth unit"):
        to_gbps(1.0, "furlongs")
