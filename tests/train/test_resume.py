"""Real PyTorch training (gloo on CPU, 2 ranks under torchrun on loopback) with
`examples/train/ddp.py`, whose `fit` is docs/faults.md's loop: per-rank seeds for dropout and
augmentation (torch, Python's `random`, numpy), AdamW, a cosine schedule, a DistributedSampler.
Each case, for both layouts (DDP with `Checkpoints`, FSDP with `ShardedCheckpoints`), ends
with final weights equal bit for bit to an uninterrupted run's: a notice annotation that stays
on the pod while torchrun restarts the workers (it fires once; a new fault fires again), a
SIGTERM to one rank, a SIGKILL of the whole pod, a torn newest checkpoint. Needs torch
(`make torch`; marker `torch`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rdmaplane.train import ANNOTATION
from tests.train.annotations import FAULT, write_like_kubelet

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train" / "ddp.py"
STEPS, EVERY = 160, 20
TORCHRUN = Path(sys.executable).with_name("torchrun")


class Run:
    """One launch of the example under torchrun (under `rdmaplane.train.run` if `wrapped`), in
    a session of its own (a pod's processes); its output is collected as it comes."""

    def __init__(
        self,
        base: Path,
        *,
        sharded: bool,
        ckpt: Path | None = None,
        max_restarts: int = 0,
        step_time: float = 0.0,
        async_save: bool = False,
        wrapped: bool = False,
    ) -> None:
        self.ckpt = ckpt or base / "ckpt"
        self.final = base / f"final-{self.ckpt.name}.pt"
        self.tmpdir = base / "tmp"
        self.tmpdir.mkdir(exist_ok=True)
        args = [
            str(TORCHRUN),
            "--standalone",
            "--nproc-per-node=2",
            f"--max-restarts={max_restarts}",
            str(EXAMPLE),
            f"--checkpoint-dir={self.ckpt}",
            f"--steps={STEPS}",
            f"--every={EVERY}",
            f"--final={self.final}",
            f"--step-time={step_time}",
            *(["--sharded"] if sharded else []),
            *(["--async-save"] if async_save else []),
        ]
        if wrapped:
            args = [sys.executable, "-m", "rdmaplane.train.run", "--", *args]
        env = {
            **os.environ,
            "RDMAPLANE_ANNOTATIONS_FILE": str(base / "annotations"),
            "TMPDIR": str(self.tmpdir),
        }
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._out: list[str] = []
        self._err: list[str] = []
        self._readers = [
            threading.Thread(target=self._collect, args=(stream, into), daemon=True)
            for stream, into in ((self.process.stdout, self._out), (self.process.stderr, self._err))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _collect(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    @property
    def out(self) -> str:
        return "".join(self._out)

    @property
    def err(self) -> str:
        return "".join(self._err)

    def finish(self, timeout: float = 300) -> int:
        code = self.process.wait(timeout)
        for reader in self._readers:
            reader.join(timeout)
        return code

    def until(self, what: str, ready: Callable[[], bool], within_s: float = 120) -> None:
        deadline = time.monotonic() + within_s
        while not ready():
            assert self.process.poll() is None, f"ended before {what}:\n{self.out}\n{self.err}"
            assert time.monotonic() < deadline, f"no {what} within {within_s} s"
            time.sleep(0.05)

    def until_checkpoint(self, step: int) -> None:
        self.until(f"checkpoint of step >= {step}", lambda: newest_step(self.ckpt) >= step)

    def kill_pod(self) -> None:
        """SIGKILL to every process, the wrapper first (what it leaves is checked), as when a
        container dies (torchrun starts its workers in sessions of their own)."""
        rest = descendants(self.process.pid)
        os.kill(self.process.pid, signal.SIGKILL)
        for pid in rest:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.finish()

    def starts(self) -> list[int]:
        return [int(s) for s in re.findall(r"rank 0: starting at step (\d+)", self.out)]

    def worker(self, rank: int, within_s: float = 120) -> int:
        """The pid of the worker of `rank`, by its RANK variable, among our descendants."""
        found: list[int] = []

        def look() -> bool:
            found[:] = [p for p in descendants(self.process.pid) if env_of(p, "RANK") == str(rank)]
            return bool(found)

        self.until(f"a worker with RANK={rank}", look, within_s)
        return found[0]


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        children = Path(f"/proc/{todo.pop()}/task")
        for task in children.iterdir() if children.exists() else []:
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def env_of(pid: int, name: str) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = f"{name}=".encode()
    return next((e[len(prefix) :].decode() for e in environ if e.startswith(prefix)), None)


def newest_step(ckpt: Path) -> int:
    """The newest committed step, by name (both layouts commit by an atomic rename)."""
    names = os.listdir(ckpt) if ckpt.exists() else []
    pattern = re.compile(r"(?:ckpt-|step-)(\d{12})(?:\.rdmaplane)?")
    return max((int(m.group(1)) for n in names if (m := pattern.fullmatch(n))), default=-1)


def digest(path: Path) -> dict[str, str]:
    """SHA-256 of every tensor's raw bytes: equal means bit for bit."""
    import torch

    state = torch.load(path, weights_only=True)
    raw = {k: bytes(v.contiguous().view(torch.uint8).flatten().tolist()) for k, v in state.items()}
    return {k: hashlib.sha256(b).hexdigest() for k, b in raw.items()}


@pytest.fixture(params=[False, True], ids=["replicated", "sharded"])
def sharded(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[bool], dict[str, str]]:
    """The final weights of a run that was never interrupted, per layout."""
    done: dict[bool, dict[str, str]] = {}

    def weights(sharded: bool) -> dict[str, str]:
        if sharded not in done:
            run = Run(tmp_path_factory.mktemp("straight"), sharded=sharded)
            assert run.finish() == 0, run.err
            assert run.starts() == [0]
            done[sharded] = digest(run.final)
        return done[sharded]

    return weights


def fault(since: str, hca: str) -> dict[str, str]:
    return {"other": "x", ANNOTATION: json.dumps({**FAULT, "hca": hca, "since": since})}


def test_a_notice_that_stays_on_the_pod_fires_once_and_a_new_fault_fires_again(
    tmp_path: Path, sharded: bool, uninterrupted: Callable[[bool], dict[str, str]]
):
    """`fault.action: notify` with torchrun restarting the workers in the same pod: the
    annotation stays, and the restarted round, resuming from the checkpoint that answered
    it, trains on; a second fault (another `since`) stops it again."""
    annotations = tmp_path / "annotations"
    write_like_kubelet(annotations, {"other": "x"})
    run = Run(tmp_path, sharded=sharded, max_restarts=2, step_time=0.05)
    run.until_checkpoint(2 * EVERY)
    write_like_kubelet(annotations, fault("2026-11-30T13:00:00Z", "mlx5_3"))
    run.until("the first restart", lambda: len(run.starts()) == 2)
    first = run.starts()[1]
    run.until_checkpoint(first + 1)  # the restarted round trained past the notice it answered
    write_like_kubelet(annotations, fault("2026-11-30T13:05:00Z", "mlx5_5"))
    assert run.finish() == 0, run.err
    starts = run.starts()
    assert len(starts) == 3 and 0 < starts[1] < starts[2] < STEPS, run.out
    # each rank polls the file on its own: the one that saw it first stops the other
    reason = r"(annotation rdmaplane.io/fault|another rank's notice)"
    saved = re.findall(rf"rank (\d): saved step (\d+) \({reason}\)", run.out)
    assert sorted((r, int(s)) for r, s, _ in saved) == [(r, s) for r in "01" for s in starts[1:]]
    for step in starts[1:]:
        assert any(s == str(step) and why.startswith("annotation") for _, s, why in saved)
    answered = re.findall(r"notice (mlx5_\d):1 fatal since \S+ was answered", run.err)
    assert sorted(answered) == ["mlx5_3"] * 2 + ["mlx5_5"] * 2  # each rank, each later round
    assert digest(run.final) == uninterrupted(sharded)


def test_sigterm_to_one_rank_saves_every_rank_at_one_step_and_resumes_there(
    tmp_path: Path, sharded: bool, uninterrupted: Callable[[bool], dict[str, str]]
):
    """A PyTorchJob-style in-place restart: SIGTERM to rank 1 while periodic checkpoints are
    written in the background; every rank saves after the same step (the emergency save waits
    for a background one), exits 75, torchrun restarts them, they resume at that step. The
    wrapper, seeing torchrun succeed in the end, exits 0."""
    run = Run(
        tmp_path, sharded=sharded, max_restarts=1, step_time=0.02, async_save=True, wrapped=True
    )
    victim = run.worker(1)
    run.until_checkpoint(2 * EVERY)
    os.kill(victim, signal.SIGTERM)
    assert run.finish() == 0, run.err
    pattern = r"rank (\d): saved step (\d+) \((SIGTERM|another rank's notice)\); exiting 75"
    saved = re.findall(pattern, run.out)
    assert sorted(saved) == [
        ("0", saved[0][1], "another rank's notice"),
        ("1", saved[0][1], "SIGTERM"),
    ]
    assert run.starts() == [0, int(saved[0][1])]
    assert "exitcode" in run.err and "75" in run.err  # torchrun saw the workers exit 75
    assert digest(run.final) == uninterrupted(sharded)


def test_sigkill_of_the_pod_resumes_from_the_last_periodic_checkpoint_and_skips_a_torn_one(
    tmp_path: Path, sharded: bool, uninterrupted: Callable[[bool], dict[str, str]]
):
    """No notice at all: the wrapper, torchrun and the workers SIGKILLed while checkpoints are
    written in the background. Nothing is left in the temporary folder; the relaunch resumes
    from the newest committed checkpoint; with that one torn (and a killed save's leftovers
    beside it), from the one before, with a warning. Both end as the uninterrupted run."""
    run = Run(tmp_path, sharded=sharded, step_time=0.02, async_save=True, wrapped=True)
    run.until_checkpoint(2 * EVERY)
    run.kill_pod()
    assert list(run.tmpdir.glob("rdmaplane-run-*")) == []
    newest = newest_step(run.ckpt)
    assert newest % EVERY == 0 and newest >= 2 * EVERY

    torn = tmp_path / "torn"
    shutil.copytree(run.ckpt, torn)
    if sharded:
        damaged = torn / f"step-{newest:012d}" / "__1_0.distcp"
        leftover = torn / f".step-{newest + EVERY:012d}.partial"
        shutil.copytree(torn / f"step-{newest:012d}", leftover)
        expected = [f"skipping checkpoint {damaged.parent}: __1_0.distcp: ", f"removing {leftover}"]
    else:
        damaged = torn / f"ckpt-{newest:012d}.rdmaplane"
        leftover = torn / f".ckpt-{newest + EVERY:012d}.rdmaplane.4242.0badc0de.tmp"
        leftover.write_bytes(b"half a checkpoint")
        expected = [f"skipping checkpoint {damaged}: truncated"]
    damaged.write_bytes(damaged.read_bytes()[:-100])

    again = Run(tmp_path, sharded=sharded, ckpt=run.ckpt)
    assert again.finish() == 0, again.err
    assert again.starts() == [newest]
    assert digest(again.final) == uninterrupted(sharded)

    from_torn = Run(tmp_path, sharded=sharded, ckpt=torn)
    assert from_torn.finish() == 0, from_torn.err
    assert from_torn.starts() == [newest - EVERY]
    for warning in expected:
        assert warning in from_torn.err
    assert not leftover.exists()  # the next save (or the resume) cleared it
    assert digest(from_torn.final) == uninterrupted(sharded)
