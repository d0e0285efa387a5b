from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.doctor import judge, ncclenv
from rdmaplane.doctor.parse_perftest import parse_bw
from rdmaplane.doctor.verdict import Status


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


def test_compute_hcas(sample_nodes):
    h200 = sample_nodes["hgx-h200-ib"]
    paired = [h.name for h in judge.compute_hcas(h200, {})]
    assert sorted(paired) == sorted(
        ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
    )
    assert judge.aggregate_gbps(judge.compute_hcas(h200, {})) == 3200.0
    chosen = judge.compute_hcas(h200, {"NCCL_IB_HCA": "=mlx5_1,mlx5_2"})
    assert [h.name for h in chosen] == ["mlx5_1", "mlx5_2"]
    assert judge.aggregate_gbps(chosen) == 400.0
    ws = sample_nodes["workstation"]  # GPUs and NIC across sockets: every up HCA counts
    assert {h.name for h in judge.compute_hcas(ws, {})} == {"mlx5_0", "rxe0"}


def test_judge_bw_thresholds(fixture_text):
    result = parse_bw(fixture_text("perftest/write_bw_gbits_roce.txt"))
    assert judge.judge_bw(result, 400.0).status == Status.PASS
    low = judge.judge_bw(result, 400.0, threshold=0.99)
    assert low.status == Status.FAIL and "97% of 400 Gb/s" in low.detail
    assert judge.judge_bw(result, None).status == Status.WARN
