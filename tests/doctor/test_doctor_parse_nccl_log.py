from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


@given(st.text())
def test_junk_never_crashes(text):
    try:
        parse(text)
    except ParseError as e:
        assert str(e).startswith("could not parse")


@given(
    st.lists(
        st.sampled_from(
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
            ]
        )
    ).map("\n".join)
)
def test_near_miss_never_crashes(text):
    with contextlib.suppress(ParseError):
        parse(text)
