from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.services.doctor.policy import judge, ncclenv
from rdmaplane.services.doctor.policy.parse_nccl_tests import parse
from rdmaplane.services.doctor.policy.parse_perftest import parse_bw
from rdmaplane.services.doctor.policy.verdict import Status


def test_device_list_syntax():
    spec = ncclenv.parse_device_list("^=mlx5_1:1,mlx5_2")
    assert spec.exclude and spec.exact
    assert spec.entries == (("mlx5_1", 1), ("mlx5_2", None))
    names = ["mlx5_0", "mlx5_1", "mlx5_10", "mlx5_2"]
    assert ncclenv.selected(spec, names) == ["mlx5_0", "mlx5_10"]
    prefix = ncclenv.parse_device_list("mlx5_1")
    assert ncclenv.selected(prefix, names) == ["mlx5_1", "mlx5_10"]
    assert ncclenv.ambiguous_entries(prefix, names) == {"mlx5_1": ["mlx5_10"]}
    assert ncclenv.ambiguous_entries(ncclenv.parse_device_list("=mlx5_1"), names) == {}
    with pytest.raises(ValueError, match="'mlx5_0:x'"):
        ncclenv.parse_device_list("mlx5_0:x")


@given(st.text(max_size=40))
def test_device_list_junk(text):
    try:
        spec = ncclenv.parse_device_list(text)
    except ValueError:
        return
    assert isinstance(ncclenv.selected(spec, ["mlx5_0", "eth0"]), list)


def names(choice: judge.HcaChoice) -> list[str]:
    return sorted(h.name for h in choice.hcas)


def test_compute_hcas(sample_nodes):
    h200 = sample_nodes["hgx-h200-ib"]
    paired = judge.compute_hcas(h200, {})
    assert names(paired) == sorted(
        ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
    )
    assert paired.basis == "the 8 HCA(s) at most PXB from a GPU" and paired.problem is None
    assert judge.aggregate_gbps(paired.hcas) == 3200.0
    chosen = judge.compute_hcas(h200, {"NCCL_IB_HCA": "=mlx5_1,mlx5_2"})
    assert names(chosen) == ["mlx5_1", "mlx5_2"] and chosen.basis == "NCCL_IB_HCA==mlx5_1,mlx5_2"
    assert judge.aggregate_gbps(chosen.hcas) == 400.0
    ws = sample_nodes["workstation"]  # GPUs and NIC across sockets: every up NIC counts,
    assert set(names(judge.compute_hcas(ws, {}))) == {"mlx5_0"}  # not the software rxe0
    named = judge.compute_hcas(ws, {"NCCL_IB_HCA": "=rxe0"})  # unless NCCL_IB_HCA names it
    assert names(named) == ["rxe0"] and named.problem is None


def test_an_unusable_nccl_ib_hca_is_said_not_silently_replaced(sample_nodes):
    h200 = sample_nodes["hgx-h200-ib"]
    bad = judge.compute_hcas(h200, {"NCCL_IB_HCA": "mlx5_0:one"})
    assert bad.problem and "malformed" in bad.problem and "NCCL would match no HCA" in bad.problem
    assert len(bad.hcas) == 8
    none = judge.compute_hcas(h200, {"NCCL_IB_HCA": "=mlx5_99"})
    assert none.problem and "selects no HCA with an ACTIVE port" in none.problem


def test_judge_bw_thresholds(fixture_text):
    result = parse_bw(fixture_text("perftest/v25.04_write_bw_gbits_roce.txt"))
    assert judge.judge_bw(result, 400.0).status == Status.PASS
    low = judge.judge_bw(result, 400.0, threshold=0.99)
    assert low.status == Status.FAIL and "97% of 400 Gb/s" in low.detail
    assert judge.judge_bw(result, None).status == Status.WARN


def test_busbw_ceiling_model():
    # 2 nodes × 8 GPUs: every node still moves (N-1)/N of the data: 15/8 of the aggregate
    assert judge.busbw_ceiling("all_gather_perf", 2, 16) == pytest.approx(1.875)
    assert judge.busbw_ceiling("all_reduce_perf", 2, 16) == pytest.approx(1.875)
    # many nodes: the hierarchical ceiling falls towards 1, SHARP keeps AllReduce near 2
    assert judge.busbw_ceiling("all_gather_perf", 64, 512) == pytest.approx(511 / 504)
    assert judge.busbw_ceiling("all_reduce_perf", 64, 512) == pytest.approx(2 * 511 / 512)
    # one GPU per node: a flat exchange, nothing to reduce inside the node
    assert judge.busbw_ceiling("all_gather_perf", 2, 2) == pytest.approx(1.0)
    assert judge.busbw_ceiling(None, 0, 0) == 2.0


def by_name(findings):
    return {f.name: f for f in findings}


def test_busbw_above_the_aggregate_but_below_the_ceiling_passes_and_says_why(fixture_text):
    r = parse(fixture_text("nccl_tests/v2.17.1_all_reduce_2node_mpirun.txt"))
    busbw = by_name(judge.judge_nccl_tests(r, 3200.0))["busbw"]
    assert busbw.status == Status.PASS
    assert "peak busbw 467.5 GB/s at 8 GiB = 117% of the 3200 Gb/s" in busbw.detail
    assert "average over all 11 sizes 160.3 GB/s" in busbw.detail
    assert "reduced inside each node first" in busbw.detail and "at most 188%" in busbw.detail


def test_busbw_above_the_ceiling_is_an_impossible_reading(fixture_text):
    r = parse(fixture_text("nccl_tests/v2.17.1_all_reduce_2node_mpirun.txt"))
    busbw = by_name(judge.judge_nccl_tests(r, 800.0))["busbw"]
    assert busbw.status == Status.FAIL and busbw.detail.startswith("impossible reading")
    assert "--line-rate" in (busbw.fix or "") and "never crossed the NICs" in (busbw.fix or "")


def test_single_node_busbw_is_not_judged(fixture_text):
    r = parse(fixture_text("nccl_tests/v2.19.6_all_reduce_per_iteration_one_node.txt"))
    found = by_name(judge.judge_nccl_tests(r, 3200.0))
    assert found["busbw"].status == Status.SKIP and "one node (hgx-h1)" in found["busbw"].detail
    assert found["correctness"].status == Status.PASS


def test_unchecked_results_are_not_called_correct(fixture_text):
    r = parse(fixture_text("nccl_tests/v2.11.0_all_gather_unchecked.txt"))
    assert by_name(judge.judge_nccl_tests(r, None))["correctness"].status == Status.SKIP


def test_a_failed_run_fails_with_its_cause(fixture_text):
    r = parse(fixture_text("nccl_tests/v2.19.6_all_reduce_network_failure.txt"))
    found = by_name(judge.judge_nccl_tests(r, 3200.0))
    assert found["run-failed"].status == Status.FAIL
    assert found["completion-error-12"].status == Status.FAIL
    assert found["busbw"].status == Status.SKIP and "failed after 64 MiB" in found["busbw"].detail
