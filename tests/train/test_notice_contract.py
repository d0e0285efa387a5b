"""The fault notice is one contract (`rdmaplane.core.notice`): what the agent writes on a pod,
the in-pod library reads, through the downward-API file as the kubelet writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdmaplane import train
from rdmaplane.core import notice as contract
from rdmaplane.core.faults import Fault
from rdmaplane.core.porthealth import FaultClass
from rdmaplane.services.agent.faults import notice as agent_writes
from tests.train.annotations import write_like_kubelet

WALL = 1_800_000_000.0  # 2027-01-15T08:00:00Z
DOWN = Fault("mlx5_3", 1, FaultClass.FATAL, "port 1 DOWN (DISABLED)", 12.0)


def library_reads(tmp_path: Path, value: str, answered: frozenset[str] = frozenset()):
    path = tmp_path / "annotations"
    write_like_kubelet(path, {"other": "x", "rdmaplane.io/fault": value})
    notice = train.FaultNotice(path, signals=(), answered=answered)
    notice.check()
    return notice


def test_what_the_agent_writes_the_library_reads(tmp_path: Path):
    notice = library_reads(tmp_path, agent_writes(DOWN, WALL))
    assert notice.is_set() and notice.reason == "annotation rdmaplane.io/fault"
    assert notice.fault == {
        "class": "fatal",
        "hca": "mlx5_3",
        "port": 1,
        "reason": "port 1 DOWN (DISABLED)",
        "since": "2027-01-15T08:00:00Z",
    }
    assert notice.fired_id == "mlx5_3:1 fatal since 2027-01-15T08:00:00Z"
    assert train.ANNOTATION == contract.ANNOTATION == "rdmaplane.io/fault"


def test_a_held_notice_reads_with_why(tmp_path: Path):
    value = agent_writes(DOWN, WALL, held="breaker open: 12 of 100 nodes faulty")
    notice = library_reads(tmp_path, value)
    assert notice.fault is not None
    assert notice.fault["held"] == "breaker open: 12 of 100 nodes faulty"
    assert contract.decode(value).held == "breaker open: 12 of 100 nodes faulty"


def test_the_agent_rewording_a_fault_is_not_a_new_notice(tmp_path: Path):
    answered = frozenset({train.notice_id(agent_writes(DOWN, WALL))})
    reworded = Fault("mlx5_3", 1, FaultClass.FATAL, "port 1 DOWN (POLLING)", 12.0)
    assert not library_reads(tmp_path, agent_writes(reworded, WALL), answered).is_set()
    degraded = Fault("mlx5_3", 1, FaultClass.DEGRADED, "symbol errors", 12.0)
    assert library_reads(tmp_path, agent_writes(degraded, WALL), answered).is_set()


@pytest.mark.parametrize("held", ["", "the fault budget is spent"])
def test_decode_reads_what_encode_writes(held: str):
    notice = contract.Notice("mlx5_0", 2, "degraded", "symbol errors", "2026-12-03T10:00:00Z", held)
    value = contract.encode(notice)
    assert contract.decode(value) == notice
    assert ("held" in json.loads(value)) == bool(held)


@pytest.mark.parametrize(
    "value",
    [
        "[]",
        '{"hca":"mlx5_0"}',
        '{"hca":"mlx5_0","port":true,"class":"fatal","reason":"","since":""}',
    ],
)
def test_decode_refuses_what_is_not_a_notice(value: str):
    with pytest.raises(ValueError):
        contract.decode(value)


def test_the_lenient_reader_keeps_what_it_cannot_decode():
    assert contract.document("not json") == {"reason": "not json"}
    assert contract.document("[1]") is None
