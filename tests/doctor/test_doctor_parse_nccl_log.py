from __future__ import annotations

import pytest

from rdmaplane.doctor.parse_nccl_log import parse
from rdmaplane.doctor.verdict import ParseError, Status


def codes(log):
    return {d.finding.name for d in log.diagnoses}


def test_roce_with_gdr_on_every_rank(fixture_text):
    log = parse(fixture_text("nccl/log_roce_ok.txt"))
    assert log.version == "2.21.5+cuda12.4"
    assert [r.rank for r in log.ranks] == [0, 1, 2, 3]
    r0, r1, r2, r3 = log.ranks
    assert (r0.host, r0.cuda_dev, r1.cuda_dev, r2.host) == ("roce-node-01", 0, 1, "roce-node-02")
    assert all(r.network == "IB" for r in log.ranks)
    assert r0.hcas == ("mlx5_0:1/RoCE", "mlx5_1:1/RoCE")
    assert r0.net_channels == 2 and r0.gdr == "on"
    assert r3.gdr == "on"
    assert r0.gid_indices == (3,)
    assert log.rdma_used
    assert codes(log) == set()


def test_socket_fallback(fixture_text):
    log = parse(fixture_text("nccl/log_socket_fallback.txt"))
    assert not log.rdma_used
    assert [r.network for r in log.ranks] == ["Socket", "Socket"]
    assert log.ranks[0].socket_channels == 2
    assert {"no-rdma-device", "socket-fallback"} <= codes(log)
    nodev = next(d for d in log.diagnoses if d.finding.name == "no-rdma-device")
    assert nodev.line_no == 4 and "No device found" in nodev.line
    assert nodev.finding.status == Status.FAIL
    assert "rdmaplane.io/hca" in (nodev.finding.fix or "")
    assert "gdr-off" not in codes(log)


def test_gid_timeout_and_mixed_indices(fixture_text):
    log = parse(fixture_text("nccl/log_gid_timeout.txt"))
    assert {"modify-qp-timeout", "gid-index-differs", "gdr-off"} == codes(log)
    assert log.ranks[0].gid_indices == (1,) and log.ranks[1].gid_indices == (3,)
    assert log.ranks[0].gdr == "off"
    qp = next(d for d in log.diagnoses if d.finding.name == "modify-qp-timeout")
    assert "NCCL_IB_GID_INDEX" in (qp.finding.fix or "")
    assert qp.line.startswith("0: worker-a:5120:5163")


def test_einval_and_completion_error_12(fixture_text):
    log = parse(fixture_text("nccl/log_einval_cqe12.txt"))
    assert {"gid-einval", "completion-error-12"} <= codes(log)
    (proc,) = log.ranks  # no Init line: the process gets a row of its own
    assert proc.rank < 0 and proc.host == "gpu-7" and proc.network == "IB"


def test_not_an_nccl_log():
    with pytest.raises(ParseError, match="no 'host:pid:tid") as e:
        parse("hello\nworld\n")
    assert e.value.line_no == 1
