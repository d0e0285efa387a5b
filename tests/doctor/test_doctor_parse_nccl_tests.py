"""nccl-tests outputs of every column layout from 2.0 to 2.19."""

from __future__ import annotations

import pytest

from rdmaplane.services.doctor.policy.parse_nccl_tests import parse
from rdmaplane.services.doctor.policy.verdict import ParseError
from tests.doctor.corpus import FIXTURES, tool_output

# fixture → (collective, ranks, hosts, rows, old columns, peak busbw, footer average, checked)
CORPUS = {
    "v2.11.0_all_gather_unchecked": (None, 4, ("pcie-l40s",), 5, True, 19.65, 15.326, False),
    "v2.11.0_all_reduce_error_srun": (None, 8, ("dgx-a100-03",), 10, True, 230.38, 77.082, True),
    "v2.13.4_broadcast_2node_root": (
        None,
        8,
        ("gpu-c01", "gpu-c02"),
        6,
        False,
        43.94,
        32.6592,
        True,
    ),
    "v2.17.1_all_gather_wrong_oob": (
        "all_gather_perf",
        16,
        ("roce-node-01", "roce-node-02"),
        6,
        False,
        21.67,
        18.3308,
        True,
    ),
    "v2.17.1_all_reduce_2node_mpirun": (
        "all_reduce_perf",
        16,
        ("gpu-node-a07", "gpu-node-a12"),
        11,
        False,
        467.48,
        160.284,
        True,
    ),
    "v2.18.5_reduce_scatter_cputime_timestamps": (
        "reduce_scatter_perf",
        16,
        ("roce-node-01", "roce-node-02"),
        5,
        False,
        187.65,
        170.078,
        True,
    ),
    "v2.19.6_all_reduce_network_failure": (
        "all_reduce_perf",
        16,
        ("gpu-a07", "gpu-a12"),
        3,
        False,
        282.62,
        None,
        True,
    ),
    "v2.19.6_all_reduce_per_iteration_one_node": (
        "all_reduce_perf",
        8,
        ("hgx-h1",),
        5,
        False,
        370.62,
        236.14,
        True,
    ),
}


def output(name: str) -> str:
    return tool_output(FIXTURES / "nccl_tests" / f"{name}.txt")


def test_the_corpus_covers_every_fixture():
    assert {p.stem for p in (FIXTURES / "nccl_tests").glob("*.txt")} == set(CORPUS)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_layout(name):
    collective, ranks, hosts, rows, old, peak, avg, checked = CORPUS[name]
    r = parse(output(name))
    assert (r.collective, len(r.ranks), r.hosts, len(r.rows)) == (collective, ranks, hosts, rows)
    assert r.old_columns is old and r.checked is checked
    assert r.peak_busbw == pytest.approx(peak)
    assert r.avg_busbw_reported == (pytest.approx(avg) if avg is not None else None)
    # the footer is the mean of every busbw figure, which our own mean agrees with
    values = [m.busbw_gbs for row in r.rows for m in (row.out_of_place, row.in_place) if m]
    assert r.avg_busbw == pytest.approx(
        avg if avg is not None else sum(values) / len(values), abs=1e-3
    )
    assert sum(values) / len(values) == pytest.approx(r.avg_busbw, abs=1e-3)


def test_two_nodes_mpirun_prefix_and_interleaved_info():
    r = parse(output("v2.17.1_all_reduce_2node_mpirun"))
    assert (r.threads, r.gpus_per_thread) == (1, 1)
    assert r.ranks[9].device == 1 and r.ranks[9].gpu == "NVIDIA H100 80GB HBM3"
    assert r.ranks[9].bus_id == "0000:2a:00"
    assert r.rows[0].size == 8 and r.rows[0].redop == "sum" and r.rows[0].root == -1
    assert r.peak_row.size == 8589934592
    assert r.rows[-1].in_place is not None and r.rows[-1].in_place.busbw_gbs == 465.62
    assert r.oob_values == 0 and r.oob_ok and r.wrong_total == 0


def test_old_error_column_counts_rounding_as_right():
    r = parse(output("v2.11.0_all_reduce_error_srun"))
    assert r.rows[0].root is None and r.ranks[0].bus_id == "0x07"
    assert r.rows[-1].out_of_place.wrong == pytest.approx(2e-7)
    assert r.wrong_total == 0  # errors of 2e-07 are rounding, not wrong results


def test_old_all_gather_has_no_redop_and_unchecked_errors():
    r = parse(output("v2.11.0_all_gather_unchecked"))
    assert r.rows[0].redop is None and r.rows[0].dtype == "float"
    assert all(m.wrong is None for row in r.rows for m in (row.out_of_place, row.in_place) if m)


def test_wrong_values_and_failed_oob():
    r = parse(output("v2.17.1_all_gather_wrong_oob"))
    assert r.rows[0].redop == "none"
    assert r.wrong_total == 8192
    assert r.oob_values == 1 and r.oob_ok is False


def test_cputime_and_timestamp_columns():
    r = parse(output("v2.18.5_reduce_scatter_cputime_timestamps"))
    assert r.rows[-1].size == 4294967296 and r.rows[-1].in_place is not None
    assert r.rows[-1].out_of_place.time_us is not None


def test_per_iteration_columns_are_skipped_not_misread():
    r = parse(output("v2.19.6_all_reduce_per_iteration_one_node"))
    last = r.rows[-1]
    assert last.in_place is not None
    assert last.in_place.busbw_gbs == pytest.approx(369.14, abs=0.01)
    assert last.in_place.wrong == 0


def test_a_failed_run_keeps_its_rows_and_says_why():
    r = parse(output("v2.19.6_all_reduce_network_failure"))
    assert [f.name for f in r.failures] == ["run-failed", "completion-error-12"]
    assert "remote process exited" in r.failures[0].detail


def test_a_run_that_failed_before_any_row():
    text = "gpu-1: Test CUDA failure common.cu:892 'out of memory'\n"
    r = parse(text)
    assert r.rows == () and r.failures[0].name == "run-failed"


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
    with pytest.raises(ParseError, match="table header without rows"):
        parse("#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n")
