"""NCCL_DEBUG=INFO logs of every format change from 2.4 to 2.28, and the order-free verdict."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from rdmaplane.services.doctor.policy import judge
from rdmaplane.services.doctor.policy.parse_nccl_log import _PREFIX, parse
from rdmaplane.services.doctor.policy.verdict import ParseError, Status, exit_code, worst
from tests.doctor.corpus import FIXTURES, tool_output

P, W, F, S = Status.PASS, Status.WARN, Status.FAIL, Status.SKIP

# fixture → (NCCL versions, RDMA used, the verdict: every finding's name and status)
CORPUS = {
    "v2.4.8_ib_ring_gdr": (["2.4.8+cuda10.1"], True, {"transport": P}),
    "v2.6.4_roce_cqe4": (["2.6.4+cuda10.2"], True, {"transport": P, "completion-error-4": F}),
    "v2.7.8_channel_gdr_roce": (["2.7.8+cuda11.0"], True, {"transport": P}),
    "v2.9.9_roce_gid0_cqe12": (
        ["2.9.9+cuda11.3"],
        True,
        {"transport": P, "completion-error-12": F, "roce-gid-0": W},
    ),
    "v2.11.4_async_port_error_cqe5": (
        ["2.11.4+cuda11.4"],
        True,
        {"transport": P, "port-error": F, "completion-error-5": F},
    ),
    "v2.12.12_ib_pxn": (["2.12.12+cuda11.7"], True, {"transport": P}),
    "v2.14.3_ib_disabled_socket": (
        ["2.14.3+cuda11.7"],
        False,
        {"ib-disabled": F, "socket-fallback": F},
    ),
    "v2.16.5_gdr_no_module": (["2.16.5+cuda12.0"], True, {"transport": P, "gdr-off": W}),
    "v2.17.1_reg_mr_failed": (
        ["2.17.1+cuda12.0"],
        True,
        {"transport": P, "memory-registration": F},
    ),
    "v2.18.5_no_verbs_socket_fallback": (
        ["2.18.5+cuda12.2"],
        False,
        {"libibverbs-missing": F, "no-rdma-device": F, "socket-fallback": F},
    ),
    "v2.18.6_cqe10_remote_access": (
        ["2.18.6+cuda12.2"],
        True,
        {"transport": P, "completion-error-10": F},
    ),
    "v2.19.3_dev_shm": (["2.19.3+cuda12.3"], True, {"transport": S, "dev-shm": F}),
    "v2.19.3_modify_qp_timeout_mixed_gid": (
        ["2.19.3+cuda12.3"],
        True,
        {"transport": P, "modify-qp-timeout": F, "gdr-off": W, "gid-index-differs": W},
    ),
    "v2.20.5_cqe13_rnr": (["2.20.5+cuda12.4"], True, {"transport": P, "completion-error-13": F}),
    "v2.21.5_reg_mr_enomem": (["2.21.5+cuda12.4"], True, {"transport": S, "memlock": F}),
    "v2.21.5_roce_ok": (["2.21.5+cuda12.4"], True, {"transport": P}),
    "v2.22.3_version_skew_gid_change": (
        ["2.21.5+cuda12.4", "2.22.3+cuda12.5"],
        True,
        {"transport": P, "gid-changed": W, "version-skew": W},
    ),
    "v2.23.4_gid_einval": (["2.23.4+cuda12.6"], True, {"transport": S, "gid-einval": F}),
    "v2.24.3_gdr0_summary": (["2.24.3+cuda12.6"], True, {"transport": P, "gdr-off": W}),
    "v2.24.3_modify_qp_timeout_retry": (
        ["2.24.3+cuda12.6"],
        True,
        {"transport": P, "modify-qp-timeout": F},
    ),
    "v2.26.5_mixed_link_layers": (
        ["2.26.5+cuda12.8"],
        True,
        {"transport": S, "mixed-link-layers": F},
    ),
    "v2.26.5_timestamped_cqe12_pci": (
        ["2.26.5+cuda12.8"],
        True,
        {"transport": P, "completion-error-12": F},
    ),
    "v2.27.7_single_node": (["2.27.7+cuda12.9"], True, {"transport": S}),
    "v2.28.9_ibext_plugin": (["2.28.9+cuda13.0"], True, {"transport": P}),
    "v2.28.9_status_names_cqe4_port_error": (
        ["2.28.9+cuda13.0"],
        True,
        {"transport": P, "port-error": F, "completion-error-4": F},
    ),
}


def log_text(name: str) -> str:
    return tool_output(FIXTURES / "nccl" / f"{name}.txt")


def verdict(text: str) -> dict[str, Status]:
    return {f.name: f.status for f in judge.judge_nccl_log(parse(text))}


def test_the_corpus_covers_every_fixture():
    assert {p.stem for p in (FIXTURES / "nccl").glob("*.txt")} == set(CORPUS)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_release_format_gets_its_verdict(name):
    versions, rdma, expected = CORPUS[name]
    log = parse(log_text(name))
    assert list(log.versions) == versions
    assert log.rdma_used is rdma
    assert verdict(log_text(name)) == expected
    found = {d.finding.name: d for d in log.diagnoses}
    for code, status in expected.items():
        if status == F and code in found:
            assert found[code].finding.fix, f"{code} has no fix"
            assert found[code].line, f"{code} names no evidence line"
    assert exit_code(worst(expected.values())) == (1 if F in expected.values() else 0)


def test_nccl_2_4_ring_lines_without_bus_ids():
    log = parse(log_text("v2.4.8_ib_ring_gdr"))
    assert [(r.rank, r.host, r.cuda_dev) for r in log.ranks] == [
        (0, "ib-node-03", 0),
        (1, "ib-node-03", 1),
        (2, "ib-node-04", 0),
        (3, "ib-node-04", 1),
    ]
    assert all(r.network == "IB" and r.net_channels == 1 and r.gdr == "on" for r in log.ranks)
    assert log.ranks[0].hcas == ("mlx5_0:1/IB", "mlx5_1:1/IB")


def test_nccl_2_7_channels_without_connection_index_use_rdma():
    """The issue's case: `Channel 00 : 0[1b000] -> …` was read as "the log does not say"."""
    log = parse(log_text("v2.7.8_channel_gdr_roce"))
    assert log.rdma_used and log.net_channels == 8
    assert {r.gdr for r in log.ranks} == {"on"} and {r.gid_indices for r in log.ranks} == {(3,)}


def test_pxn_channels_are_counted_as_proxied_rdma():
    log = parse(log_text("v2.12.12_ib_pxn"))
    pxn = {r.rank: r.pxn_channels for r in log.ranks if r.pxn_channels}
    assert pxn == {1: 1, 3: 1, 7: 1}
    assert all(r.gdr == "on" for r in log.ranks if r.net_channels)


def test_gdr_off_names_its_cause():
    module = next(
        d.finding
        for d in parse(log_text("v2.16.5_gdr_no_module")).diagnoses
        if d.finding.name == "gdr-off"
    )
    assert "nvidia_peermem" in module.detail
    distance = next(
        d.finding
        for d in parse(log_text("v2.24.3_gdr0_summary")).diagnoses
        if d.finding.name == "gdr-off"
    )
    assert "further apart than NCCL_NET_GDR_LEVEL" in distance.detail


def test_gdr_in_pci_mode_counts_as_gdr():
    log = parse(log_text("v2.26.5_timestamped_cqe12_pci"))
    assert {r.gdr for r in log.ranks} == {"on"}


def test_plugin_network_is_rdma():
    log = parse(log_text("v2.28.9_ibext_plugin"))
    assert {r.network for r in log.ranks} == {"IBext_v8"}
    assert log.ranks[0].hcas == ("mlx5_0:1/IB", "mlx5_3:1/IB")


def test_modify_qp_retries_alone_are_not_a_failure():
    text = log_text("v2.24.3_modify_qp_timeout_retry")
    retries_only = "\n".join(ln for ln in text.splitlines() if "NCCL WARN" not in ln)
    assert "modify-qp-timeout" not in verdict(retries_only)
    assert verdict(text)["modify-qp-timeout"] == F


def test_evidence_is_the_first_line_of_each_failure():
    log = parse(log_text("v2.19.3_modify_qp_timeout_mixed_gid"))
    qp = next(d for d in log.diagnoses if d.finding.name == "modify-qp-timeout")
    assert qp.line.startswith("0: worker-a:5120:5163") and "errno 110" in qp.line
    assert "NCCL_IB_GID_INDEX" in (qp.finding.fix or "")
    assert log.ranks[0].gid_indices == (1,) and log.ranks[1].gid_indices == (3,)


def test_completion_error_says_what_the_status_means():
    log = parse(log_text("v2.28.9_status_names_cqe4_port_error"))
    cqe = next(d.finding for d in log.diagnoses if d.finding.name == "completion-error-4")
    assert "IBV_WC_LOC_PROT_ERR" in cqe.detail and "nvidia_peermem" in (cqe.fix or "")


def test_a_process_without_rank_gets_its_own_row():
    (proc,) = parse(log_text("v2.23.4_gid_einval")).ranks
    assert proc.rank < 0 and proc.host == "gpu-7" and proc.network == "IB"


def test_bare_version_line_alone_is_read():
    log = parse("NCCL version 2.5.7+cuda10.2\n")
    assert log.versions == ("2.5.7+cuda10.2",) and log.ranks == ()
    assert verdict("NCCL version 2.5.7+cuda10.2\n") == {"transport": W}


def test_not_an_nccl_log():
    with pytest.raises(ParseError, match="no 'host:pid:tid") as e:
        parse("hello\nworld\n")
    assert e.value.line_no == 1
    with pytest.raises(ParseError, match="empty input"):
        parse("\n \n")


# ---------------------------------------------------------------- the verdict ignores order

NAMES = sorted(CORPUS)
# Lines NCCL prints that say nothing about the transport (from the same releases' sources).
BENIGN = [
    "cudaDriverVersion 12040",
    "Connected all trees",
    "NVLS multicast support is not available on dev 0",
    "P2P Chunksize set to 524288",
    "24 coll channels, 32 collnet channels, 0 nvls channels, 32 p2p channels, 2 p2p channels "
    "per peer",
    "threadThresholds 8/8/64 | 128/8/64 | 512 | 512",
    "comm 0x55d4c61a2b90 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0",
    "Setting affinity for GPU 3 to ffff,ffffffff",
    "Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1",
    "DMA-BUF is available on GPU device 0",
]


@given(st.sampled_from(NAMES), st.randoms(use_true_random=False))
def test_lines_in_any_order_give_the_same_verdict(name, rnd):
    lines = log_text(name).splitlines()
    rnd.shuffle(lines)
    assert verdict("\n".join(lines)) == CORPUS[name][2]


@given(
    st.sampled_from(NAMES),
    st.lists(st.text(max_size=120), max_size=20),
    st.lists(st.tuples(st.sampled_from(BENIGN), st.integers(0, 7)), max_size=20),
    st.randoms(use_true_random=False),
)
def test_unknown_lines_never_change_the_verdict(name, junk, benign, rnd):
    for line in junk:
        assume("\n" not in line and "\r" not in line and not _PREFIX.match(line.strip()))
        assume("NCCL version" not in line)
    lines = log_text(name).splitlines()
    lines += junk
    lines += [f"gpu-z9:4242:4243 [{dev}] NCCL INFO {msg}" for msg, dev in benign]
    rnd.shuffle(lines)
    assert verdict("\n".join(lines)) == CORPUS[name][2]


@given(st.sampled_from(NAMES), st.randoms(use_true_random=False))
def test_ranks_interleaved_as_a_launcher_merges_them(name, rnd):
    """Each process's lines keep their order, the processes' streams interleave at random and
    each carries its own launcher prefix, as mpirun --tag-output prints them."""
    streams: dict[str, list[str]] = {}
    for line in log_text(name).splitlines():
        m = _PREFIX.match(line.split(":", 1)[-1].strip()) or _PREFIX.match(line.strip())
        key = f"{m['host']}:{m['pid']}" if m else "-"
        streams.setdefault(key, []).append(line)
    tags = {key: f"[1,{n}]<stdout>:" for n, key in enumerate(sorted(streams))}
    merged = []
    while streams:
        key = rnd.choice(sorted(streams))
        merged.append(tags[key] + streams[key].pop(0))
        if not streams[key]:
            del streams[key]
    assert verdict("\n".join(merged)) == CORPUS[name][2]


def test_launcher_prefixes_change_nothing():
    for name in NAMES:
        text = log_text(name)
        prefixed = "\n".join(f"[1,{i % 4}]<stdout>:{ln}" for i, ln in enumerate(text.splitlines()))
        labelled = "\n".join(f"{i % 4}: {ln}" for i, ln in enumerate(text.splitlines()))
        assert verdict(prefixed) == verdict(labelled) == CORPUS[name][2], name


def test_shuffled_logs_keep_their_ranks():
    text = log_text("v2.21.5_roce_ok")
    lines = text.splitlines()
    random.Random(7).shuffle(lines)
    assert parse("\n".join(lines)).ranks == parse(text).ranks
