from __future__ import annotations

import pytest

from rdmaplane.doctor.parse_nccl_tests import parse
from rdmaplane.doctor.verdict import ParseError


def test_two_nodes_mpirun_prefix_and_interleaved_info(fixture_text):
    r = parse(fixture_text("nccl/all_reduce_2node_mpirun.txt"))
    assert r.collective == "all_reduce_perf"
    assert (r.threads, r.gpus_per_thread) == (1, 1)
    assert len(r.ranks) == 16
    assert r.hosts == ("gpu-node-a07", "gpu-node-a12")
    assert r.ranks[9].device == 1 and r.ranks[9].gpu == "NVIDIA H100 80GB HBM3"
    assert len(r.rows) == 11
    assert r.rows[0].size == 8 and r.rows[0].redop == "sum" and r.rows[0].root == -1
    assert r.peak_busbw == pytest.approx(467.48)
    assert r.peak_row.size == 8589934592
    assert r.rows[-1].in_place is not None and r.rows[-1].in_place.busbw_gbs == 465.62
    assert r.oob_values == 0 and r.oob_ok
    assert r.wrong_total == 0
    assert not r.old_columns
    # the footer is the mean of every busbw figure, which our own mean agrees with
    values = [m.busbw_gbs for row in r.rows for m in (row.out_of_place, row.in_place)]
    assert r.avg_busbw == pytest.approx(sum(values) / len(values), abs=1e-3)


def test_old_columns_with_srun_label(fixture_text):
    r = parse(fixture_text("nccl/all_reduce_old_columns_srun.txt"))
    assert r.old_columns
    assert r.collective is None
    assert r.gpus_per_thread == 8
    assert r.hosts == ("dgx-a100-03",)
    assert [x.rank for x in r.ranks] == list(range(8))
    assert r.rows[0].root is None
    assert r.rows[-1].out_of_place.wrong == pytest.approx(2e-7)
    assert r.wrong_total == 0  # errors of 2e-07 are rounding, not wrong results
    assert r.avg_busbw == 98.4215
    assert r.peak_busbw == pytest.approx(230.38)


def test_wrong_values_and_failed_oob(fixture_text):
    r = parse(fixture_text("nccl/all_gather_wrong_socket.txt"))
    assert r.collective == "all_gather_perf"
    assert r.rows[0].redop == "none"
    assert r.wrong_total == 8192
    assert r.oob_values == 1 and r.oob_ok is False


def test_na_in_place_values():
    text = (
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong\n"
        "     1048576        262144     float    none      -1    88.10   11.90   11.16      0"
        "    87.55   11.98   11.23    N/A\n"
    )
    r = parse(text)
    assert r.rows[0].in_place is not None and r.rows[0].in_place.wrong is None
    assert r.avg_busbw == pytest.approx((11.16 + 11.23) / 2)


def test_row_that_breaks_the_header_names_the_line():
    text = (
        "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
        "   1024  256 float sum -1 12.0 0.08 0.15 0 12.1 0.08 0.15 zero\n"
    )
    with pytest.raises(ParseError) as e:
        parse(text)
    assert e.value.line_no == 2 and "zero" in str(e.value)


def test_no_table():
    with pytest.raises(ParseError, match="no result table") as e:
        parse("NCCL version 2.21.5+cuda12.4\nsegfault\n")
    assert e.value.line_no == 2
