"""Work-completion statuses and known failure messages: every wording, every code."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.services.doctor.policy import failures
from rdmaplane.services.doctor.policy.verdict import Status

# `enum ibv_wc_status` in the order libibverbs (and NCCL's ibvcore.h) declares it: the number of
# each status is its position.
IBV_WC_ENUM = (
    "IBV_WC_SUCCESS",
    "IBV_WC_LOC_LEN_ERR",
    "IBV_WC_LOC_QP_OP_ERR",
    "IBV_WC_LOC_EEC_OP_ERR",
    "IBV_WC_LOC_PROT_ERR",
    "IBV_WC_WR_FLUSH_ERR",
    "IBV_WC_MW_BIND_ERR",
    "IBV_WC_BAD_RESP_ERR",
    "IBV_WC_LOC_ACCESS_ERR",
    "IBV_WC_REM_INV_REQ_ERR",
    "IBV_WC_REM_ACCESS_ERR",
    "IBV_WC_REM_OP_ERR",
    "IBV_WC_RETRY_EXC_ERR",
    "IBV_WC_RNR_RETRY_EXC_ERR",
    "IBV_WC_LOC_RDD_VIOL_ERR",
    "IBV_WC_REM_INV_RD_REQ_ERR",
    "IBV_WC_REM_ABORT_ERR",
    "IBV_WC_INV_EECN_ERR",
    "IBV_WC_INV_EEC_STATE_ERR",
    "IBV_WC_FATAL_ERR",
    "IBV_WC_RESP_TIMEOUT_ERR",
    "IBV_WC_GENERAL_ERR",
    "IBV_WC_TM_ERR",
    "IBV_WC_TM_RNDV_INCOMPLETE",
)


def test_every_error_status_has_a_cause_and_a_fix():
    assert sorted(failures.WC_STATUSES) == list(range(1, len(IBV_WC_ENUM)))
    for code, status in failures.WC_STATUSES.items():
        assert status.symbol == IBV_WC_ENUM[code]
        assert status.text and status.cause and status.fix


# The wordings of the releases that print them (see failures.py's docstring for the sources).
WORDINGS = [
    "NET/IB : Got completion with error {c}, opcode 0, len 0, vendor err 129",
    "NET/IB : Got completion from peer 10.0.0.2<43211> with error {c}, opcode 1, len 32768, "
    "vendor err 136",
    "NET/IB : Got completion from peer 10.0.0.2<43211> with error {c}, opcode 1, len 0, vendor err"
    " 136 (Send) localGid ::ffff:10.0.0.1 remoteGid ::ffff:10.0.0.2",
    "NET/IB : Got completion from peer 10.0.0.2<60144> with status={c} opcode=0 len=0 vendor err "
    "135 (Recv) localGid ::ffff:10.0.0.1 remoteGids::ffff:10.0.0.2",
    "NET/IB: Got completion from peer 10.0.0.2<41877> with status={c} opcode=1 len=0 vendor err 129"
    " (Send) localGid ::ffff:10.0.0.1 remoteGids::ffff:10.0.0.2 hca mlx5_0",
    "NET/IB: Got completion from peer 10.0.0.2<39012> with status={symbol}({c}) opcode="
    "IBV_WC_RDMA_WRITE(1) reqSize=524288 vendor_err=81 req_type=Send hca mlx5_3",
    "NET/IB/GIN: Got completion from peer 10.0.0.2<1> with status={c} opcode=0 len=0 vendor err 0",
    " Failed status {c}: wr_id 0 syndrom 0x81",
    " Failed status-{text} ({c}): wr_id 3 syndrom 0x88",
]


@pytest.mark.parametrize("wording", WORDINGS)
@pytest.mark.parametrize("code", sorted(failures.WC_STATUSES))
def test_every_wording_yields_the_status(wording, code):
    status = failures.WC_STATUSES[code]
    line = wording.format(c=code, symbol=status.symbol, text=status.text)
    assert failures.completion_status(line) == code
    (finding,) = [f for f in failures.classify(line) if f.name.startswith("completion-error")]
    assert finding.name == f"completion-error-{code}" and finding.status == Status.FAIL
    assert status.symbol in finding.detail


def test_an_undefined_status_says_so():
    f = failures.completion_finding(42)
    assert f.status == Status.FAIL and "does not define" in f.detail


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("Call to ibv_modify_qp failed with error Connection timed out", "modify-qp-timeout"),
        (
            "Call to ibv_modify_qp failed with error Connection timed out errno 110",
            "modify-qp-timeout",
        ),
        (
            "Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_0:1, curr "
            "state INIT, next state RTR, local GID index 3, local GID ::ffff:10.0.0.1, remote "
            "GID ::ffff:10.0.1.1",
            "modify-qp-timeout",
        ),
        ("Call to ibv_modify_qp failed with error Invalid argument errno 22", "modify-qp-einval"),
        ("Call to ibv_reg_mr failed with error Cannot allocate memory", "memlock"),
        ("Call to ibv_reg_dmabuf_mr failed with error Bad address", "gpu-memory-registration"),
        ("Call to ibv_reg_mr failed", "memory-registration"),
        ("NET/IB : Got async event : port error", "port-error"),
        ("NET/IB : mlx5_0:1 Got async error event: port error", "port-error"),
        ("NET/IB : mlx5_0:1 Got non-fatal async event: port error(10)", "port-error"),
        ("NET/IB : mlx5_0:1 async fatal event: local catastrophic error", "hca-fatal"),
        ("NET/IB : Got async event : local catastrophic error", "hca-fatal"),
        ("NET/IB : mlx5_0:1 GID table changed", "gid-changed"),
        ("NET/IB : No IP interface found.", "no-oob-interface"),
        ("NET/IB: read failed in ncclIbRoceGetVersionNum: Invalid argument", "gid-einval"),
    ],
)
def test_known_failure_wordings(message, code):
    assert code in {f.name for f in failures.classify(message)}


def test_a_retried_modify_qp_is_not_a_failure():
    retry = (
        "Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_0:1, curr state "
        "INIT, next state RTR, local GID index 3, local GID ::ffff:10.0.0.1, remote GID "
        "::ffff:10.0.1.1, retrying 1/34 after 100 msec of sleep"
    )
    assert failures.classify(retry) == []


def test_benign_async_events_are_not_failures():
    assert failures.classify("NET/IB : mlx5_0:1 Got async error event: port active") == []


@given(st.text())
def test_classify_never_crashes(text):
    assert all(f.fix for f in failures.classify(text))


def test_docs_list_every_status_and_every_known_failure():
    """docs/doctor.md's tables name every code with its symbol, and every finding."""
    doc = (Path(__file__).parents[2] / "docs" / "doctor.md").read_text()
    for code, status in failures.WC_STATUSES.items():
        assert f"| {code} | `{status.symbol}` |" in doc, code
    for rule in failures.NCCL_RULES:
        assert f"| `{rule.code}` | {rule.status.name} |" in doc, rule.code
