"""Real PyTorch distributed training (gloo on CPU, 2 ranks under torchrun on loopback) with
`examples/train/ddp.py`: a fault notice to one rank, a SIGKILL, and a torn checkpoint, each
compared bit for bit with a run that was never interrupted. Needs torch (`make test` installs
it; marker `torch`)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rdmaplane import train

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train" / "ddp.py"
STEPS, EVERY = 120, 20
TORCHRUN = Path(sys.executable).with_name("torchrun")


def torchrun(ckpt: Path, final: Path, *, max_restarts: int = 0, step_time: float = 0.0):
    args = [
        str(TORCHRUN),
        "--standalone",
        "--nproc-per-node=2",
        f"--max-restarts={max_restarts}",
        str(EXAMPLE),
        f"--checkpoint-dir={ckpt}",
        f"--steps={STEPS}",
        f"--every={EVERY}",
        f"--final={final}",
        f"--step-time={step_time}",
    ]
    env = {**os.environ, "RDMAPLANE_ANNOTATIONS_FILE": str(ckpt.parent / "annotations")}
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def finish(process: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def digest(path: Path) -> dict[str, str]:
    """SHA-256 of every tensor's raw bytes: equal means bit for bit."""
    import torch

    state = torch.load(path, weights_only=True)
    raw = {k: bytes(v.contiguous().view(torch.uint8).flatten().tolist()) for k, v in state.items()}
    return {k: hashlib.sha256(b).hexdigest() for k, b in raw.items()}


@pytest.fixture(scope="module", autouse=True)
def torch_installed() -> None:
    """Fail (never skip) without torch, saying how to get it."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.fail("torch is not installed: run `make torch` (make test does)", pytrace=False)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("straight")
    code, _, err = finish(torchrun(base / "ckpt", base / "final.pt"))
    assert code == 0, err
    return digest(base / "final.pt")


def rank_pid(launcher: subprocess.Popen[str], rank: int, within_s: float = 120) -> int:
    """The worker process of `rank` among torchrun's children (by its RANK variable)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
        for pid in children.read_text().split() if children.exists() else []:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in environ:
                return int(pid)
        time.sleep(0.1)
    raise AssertionError(f"no worker with RANK={rank}")


def wait_for_checkpoint(ckpt: Path, step: int, within_s: float = 120) -> None:
    deadline = time.monotonic() + within_s
    while (found := train.latest(ckpt)) is None or found.step < step:
        assert time.monotonic() < deadline, f"no checkpoint of step >= {step}"
        time.sleep(0.05)


def started_at(out: str) -> list[int]:
    return [int(s) for s in re.findall(r"rank 0: starting at step (\d+)", out)]


def test_sigterm_to_one_rank_saves_exits_75_and_torchrun_resumes_at_that_step(
    tmp_path: Path, uninterrupted: dict[str, str]
):
    """What a PyTorchJob with `torchrun --max-restarts` does: the workers exit 75 after an
    emergency checkpoint, torchrun restarts them, they resume at exactly the saved step."""
    ckpt, final = tmp_path / "ckpt", tmp_path / "final.pt"
    launcher = torchrun(ckpt, final, max_restarts=1, step_time=0.02)
    victim = rank_pid(launcher, 1)
    wait_for_checkpoint(ckpt, 2 * EVERY)
    os.kill(victim, signal.SIGTERM)
    code, out, err = finish(launcher)
    assert code == 0, err
    saved = {
        int(s)
        for s in re.findall(
            r"rank \d: saved step (\d+) \((?:SIGTERM|another rank's notice)\); exiting 75", out
        )
    }
    assert len(saved) == 1, out  # both ranks stopped after the same step
    (step,) = saved
    assert "rank 1: saved step" in out and "(SIGTERM)" in out
    assert step % EVERY != 0 or step > 2 * EVERY  # an emergency checkpoint, mid-interval or not
    assert "exitcode" in err and "75" in err  # torchrun saw the workers exit 75
    assert started_at(out) == [0, step]  # resumed at exactly the saved step
    assert digest(final) == uninterrupted


def test_sigkill_resumes_from_the_last_periodic_checkpoint_and_skips_a_torn_one(
    tmp_path: Path, uninterrupted: dict[str, str]
):
    """No notice at all: the relaunch resumes from the newest periodic checkpoint (losing at
    most `--every` steps); with that one torn, from the one before it (with a warning). Both
    finish with the uninterrupted run's weights."""
    ckpt, final = tmp_path / "ckpt", tmp_path / "final.pt"
    launcher = torchrun(ckpt, final, step_time=0.02)
    victim = rank_pid(launcher, 1)
    wait_for_checkpoint(ckpt, 2 * EVERY)
    os.kill(victim, signal.SIGKILL)
    code, _, err = finish(launcher)
    assert code != 0
    assert "-9" in err or "SIGKILL" in err
    newest = train.latest(ckpt)
    assert newest is not None and newest.step % EVERY == 0 and newest.step >= 2 * EVERY
    torn = tmp_path / "torn"
    shutil.copytree(ckpt, torn)
    newest_torn = torn / newest.path.name
    newest_torn.write_bytes(newest_torn.read_bytes()[:-100])

    code, out, err = finish(torchrun(ckpt, final))
    assert code == 0, err
    assert started_at(out) == [newest.step]
    assert digest(final) == uninterrupted

    final_torn = tmp_path / "final-torn.pt"
    code, out, err = finish(torchrun(torn, final_torn))
    assert code == 0, err
    assert started_at(out) == [newest.step - EVERY]
    assert f"skipping checkpoint {newest_torn}: truncated" in err
    assert digest(final_torn) == uninterrupted
