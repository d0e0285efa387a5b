"""What a checkpoint holds and puts back, in one process: every RNG (torch, Python, numpy, and
CUDA's per device through a stand-in of CPU generators, as there is no GPU here), the model,
optimizer and scheduler, the notices answered; a background save writes the state of the
moment it was asked for; a failed one is reported. Needs torch (marker `torch`)."""

from __future__ import annotations

import io
import random
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest

from rdmaplane.train import FaultNotice, checkpoint

try:
    import numpy as np
    import torch

    from rdmaplane.train import pytorch as tp
    from rdmaplane.train import rng
except ImportError:  # conftest's `torch_installed` fails these tests, saying how to get torch
    pass


def draws() -> list[float]:
    return [torch.rand(1).item(), random.random(), float(np.random.random())]


def test_every_generator_comes_back_through_a_weights_only_checkpoint():
    torch.manual_seed(1), random.seed(2), np.random.seed(3)
    draws()
    buffer = io.BytesIO()
    torch.save(rng.capture(), buffer)
    expected = draws()
    torch.manual_seed(9), random.seed(9), np.random.seed(9)
    rng.restore(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    assert draws() == expected


class CudaStandIn:
    """`torch.cuda`'s RNG calls over real CPU generators, one per "device"."""

    def __init__(self, devices: int, initialized: bool = True, seed: int = 100) -> None:
        self.generators = [torch.Generator().manual_seed(seed + d) for d in range(devices)]
        self.initialized = initialized

    def is_available(self) -> bool:
        return bool(self.generators)

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return len(self.generators)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [g.get_state() for g in self.generators]

    def set_rng_state(self, new_state: torch.Tensor, device: int = 0) -> None:
        self.generators[device].set_state(new_state)

    def draws(self) -> list[float]:
        return [torch.rand(1, generator=g).item() for g in self.generators]


def test_cuda_generators_are_saved_and_restored_per_device():
    saved_on = CudaStandIn(2)
    state = rng.capture(saved_on)
    expected = saved_on.draws()
    resumed_on = CudaStandIn(2, seed=200)
    assert resumed_on.draws() != expected
    rng.restore(state, resumed_on)
    assert resumed_on.draws() == expected


def test_fewer_devices_or_none_restore_what_they_can_and_warn():
    state = rng.capture(CudaStandIn(2))
    fewer = CudaStandIn(1)
    with pytest.warns(rng.ResumeWarning, match="CUDA RNG of 2 devices, this process sees 1"):
        rng.restore(state, fewer)
    assert fewer.generators[0].get_state().equal(state["cuda"][0])
    with pytest.warns(rng.ResumeWarning, match="this process sees 0"):
        rng.restore(state, CudaStandIn(0))


def test_cuda_that_never_started_has_nothing_to_save():
    assert "cuda" not in rng.capture(CudaStandIn(2, initialized=False))
    assert "cuda" not in rng.capture()  # the real torch.cuda here: no GPU


def test_without_numpy_the_rest_is_saved_and_a_numpy_state_warns(tmp_path: Path):
    script = textwrap.dedent(
        """
        import sys, warnings
        sys.modules["numpy"] = None           # not importable, as in a pod without it
        import torch
        from rdmaplane.train import rng
        state = rng.capture()
        assert set(state) == {"torch", "python"}, set(state)
        state["numpy"] = {"bit_generator": "MT19937", "key": [0] * 624, "pos": 0,
                          "has_gauss": 0, "gauss": 0.0}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rng.restore(state)
        print([str(w.message) for w in caught])
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "the checkpoint holds numpy's RNG, but numpy is not installed" in result.stdout


def training(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
    return net, optimizer, scheduler


def train_steps(net, optimizer, scheduler, n: int) -> None:
    for _ in range(n):
        optimizer.zero_grad()
        net(torch.randn(5, 4)).sum().backward()
        optimizer.step()
        scheduler.step()


def weights(net: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def test_resume_puts_back_model_optimizer_scheduler_rng_and_answered_notices(tmp_path: Path):
    net, optimizer, scheduler = training()
    train_steps(net, optimizer, scheduler, 3)
    notice = FaultNotice(tmp_path / "annotations", signals=(), answered={"mlx5_3:1 fatal since x"})
    notice.fire("SIGTERM")
    ckpt = tp.Checkpoints(tmp_path / "ckpt", net, optimizer, scheduler=scheduler)
    ckpt.save(3, notice)
    train_steps(net, optimizer, scheduler, 4)
    expected = weights(net)

    net2, optimizer2, scheduler2 = training(seed=7)
    resumed = tp.Checkpoints(tmp_path / "ckpt", net2, optimizer2, scheduler=scheduler2)
    assert resumed.resume() == 3
    assert resumed.answered == frozenset()  # SIGTERM has no id; the old one is not in the file
    train_steps(net2, optimizer2, scheduler2, 4)
    assert all(a.equal(b) for a, b in zip(weights(net2), expected, strict=True))


def test_a_background_save_writes_the_state_it_was_asked_for(tmp_path: Path, monkeypatch):
    """The writer is held until training changed the weights in place: the file still holds
    the weights of the step saved."""
    net, optimizer, scheduler = training()
    go = threading.Event()
    write = checkpoint.save_with

    def held(*args, **kwargs):
        assert go.wait(30)
        return write(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_with", held)
    ckpt = tp.Checkpoints(tmp_path, net, optimizer, scheduler=scheduler)
    before = weights(net)
    ckpt.save(1, background=True)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    go.set()
    ckpt.wait()
    net2, optimizer2, scheduler2 = training(seed=7)
    assert tp.Checkpoints(tmp_path, net2, optimizer2, scheduler=scheduler2).resume() == 1
    assert all(a.equal(b) for a, b in zip(weights(net2), before, strict=True))


def test_a_failed_background_save_is_raised_by_the_next_call(tmp_path: Path):
    blocker = tmp_path / "ckpt"
    blocker.write_text("a file where the folder should be")
    net, optimizer, _ = training()
    ckpt = tp.Checkpoints(blocker / "run", net, optimizer)
    ckpt.save(5, background=True)
    with pytest.raises(checkpoint.CheckpointError, match="cannot write the checkpoint of step 5"):
        ckpt.close()


def test_a_checkpoint_of_another_world_size_resumes_without_its_random_state(tmp_path: Path):
    net, optimizer, _ = training()
    tp.Checkpoints(tmp_path, net, optimizer).save(2)
    found = checkpoint.latest(tmp_path)
    with found.open() as f:
        state = torch.load(f, weights_only=True)
    state["rdmaplane"]["ranks"] *= 2  # as if two ranks had saved it
    checkpoint.save_with(tmp_path, 3, lambda out: torch.save(state, out))
    with warnings.catch_warnings():
        warnings.simplefilter("error", rng.ResumeWarning)
        with pytest.raises(rng.ResumeWarning, match="saved by 2 ranks and is resumed by 1"):
            tp.Checkpoints(tmp_path, *training()[:2]).resume()
