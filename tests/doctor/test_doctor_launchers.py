"""NCCL logs as launchers hand them over (issue 40): torchrun's `[default0]:` and `[rank0]:`
(`--tee`/`--log-line-prefix-template` defaults), Slurm's `srun --label` `0: `, OpenMPI's
`mpirun --tag-output` `[1,0]<stdout>:`, `kubectl logs --prefix` `[pod/x/c] `, and those nested;
each line is read by what follows its prefix. A 16-rank run whose connections failed is named
as such, never "one node"."""

from __future__ import annotations

import pytest

from rdmaplane.services.doctor.policy import judge
from rdmaplane.services.doctor.policy.parse_nccl_log import parse
from rdmaplane.services.doctor.policy.verdict import Status
from tests.doctor.test_doctor_parse_nccl_log import CORPUS, NAMES, log_text

LAUNCHERS = {
    "torchrun-default": lambda i: f"[default{i % 8}]:",
    "torchrun-rank": lambda i: f"[rank{i % 16}]:",
    "slurm": lambda i: f"{i % 16}: ",
    "openmpi": lambda i: f"[1,{i % 16}]<stdout>:",
    "kubectl": lambda i: f"[pod/trainer-{i % 2}/pytorch] ",
    "kubectl+torchrun": lambda i: f"[pod/trainer-{i % 2}/pytorch] [default{i % 8}]:",
    "slurm+openmpi": lambda i: f"{i % 4}: [1,{i % 4}]<stderr>:",
}


def verdict(text: str) -> dict[str, Status]:
    return {f.name: f.status for f in judge.judge_nccl_log(parse(text))}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_every_launcher_prefix_gives_the_same_verdict(launcher: str) -> None:
    prefix = LAUNCHERS[launcher]
    for name in NAMES:
        lines = log_text(name).splitlines()
        text = "\n".join(prefix(i) + line for i, line in enumerate(lines))
        assert verdict(text) == CORPUS[name][2], (launcher, name)
        assert parse(text).ranks == parse(log_text(name)).ranks


# torchrun (PyTorch 2.4, `--tee 3`) of a 16-rank job, 2 nodes × 8 GPUs; node 0's log: NCCL
# 2.21.5 chose IB, set up its NVLink channels, then could not reach node 1.
TORCHRUN_16_RANKS = "\n".join(
    [
        "[default0]:NCCL version 2.21.5+cuda12.4",
        *(
            f"[default{r}]:trainer-0:{88 + r}:{88 + r} [{r}] NCCL INFO NET/IB : Using "
            f"[0]mlx5_{r}:1/RoCE [RO]; OOB eth0:10.244.5.21<0>"
            for r in range(8)
        ),
        *(
            f"[default{r}]:trainer-0:{88 + r}:{88 + r} [{r}] NCCL INFO Using network IB"
            for r in range(8)
        ),
        *(
            f"[default{r}]:trainer-0:{88 + r}:{121 + r} [{r}] NCCL INFO ncclCommInitRank comm "
            f"0x5623a1f0b3c{r} rank {r} nranks 16 cudaDev {r} nvmlDev {r} busId {r}d000 "
            "commId 0x21f3e4d5c6b7a890 - Init START"
            for r in range(8)
        ),
        *(
            f"[default{r}]:trainer-0:{88 + r}:{121 + r} [{r}] NCCL INFO Channel 00/0 : "
            f"{r}[{r}] -> {(r + 1) % 8}[{(r + 1) % 8}] via P2P/CUMEM/read"
            for r in range(8)
        ),
        "[default0]:trainer-0:88:130 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: "
        "Connect to 10.244.6.17<43211> failed : Software caused connection abort",
        "[default0]:trainer-0:88:130 [0] NCCL INFO misc/socket.cc:565 -> 2",
        "[default0]:trainer-0:88:130 [0] NCCL INFO transport/net_socket.cc:... -> 2",
    ]
)


def test_a_16_rank_run_that_failed_to_connect_is_not_one_node() -> None:
    log = parse(TORCHRUN_16_RANKS)
    assert log.nranks == 16 and log.hosts == ("trainer-0",) and not log.one_node
    found = {f.name: f for f in judge.judge_nccl_log(log)}
    assert found["connect-failed"].status is Status.FAIL
    assert found["transport"].status is Status.FAIL
    assert "one node" not in found["transport"].detail
    assert "16 ranks" in found["transport"].detail
    assert "connections between nodes failed" in found["transport"].detail


def test_a_single_node_run_is_still_one_node() -> None:
    log = parse(log_text("v2.27.7_single_node"))
    assert log.one_node
    (transport,) = [f for f in judge.judge_nccl_log(log) if f.name == "transport"]
    assert transport.status is Status.SKIP and "one node" in transport.detail
