"""Thin PyTorch helpers over `rdmaplane.train.checkpoint` (import this module only where torch
is installed; the rest of `rdmaplane.train` needs nothing but the standard library).

`snapshot`/`restore` gather and put back what a bit-exact resume needs: the model's and the
optimizer's state dicts and the CPU RNG state. `any_rank` lets every rank of a
`torch.distributed` job agree to stop at the same step when one of them got the notice.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined, unused-ignore]

from rdmaplane.train import checkpoint


def snapshot(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, **extra: Any
) -> dict[str, Any]:
    """The state to checkpoint: model, optimizer, CPU RNG, plus `extra` (plain values)."""
    state: dict[str, Any] = {"model": model.state_dict(), "rng": torch.get_rng_state(), **extra}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    return state


def restore(
    state: Mapping[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> None:
    model.load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if "rng" in state:
        torch.set_rng_state(state["rng"])


def save(
    directory: str | os.PathLike[str],
    step: int,
    state: Mapping[str, Any],
    *,
    keep: int = 3,
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """`torch.save` of `state` into an atomic checkpoint."""
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    return checkpoint.save(directory, step, buffer.getvalue(), keep=keep, meta=meta)


def load(
    directory: str | os.PathLike[str], map_location: str = "cpu"
) -> tuple[int, dict[str, Any]] | None:
    """(step, state) of the newest checkpoint that verifies and loads (tensors and plain
    values only: `weights_only`), or None."""
    for found in checkpoint.valid(directory):
        try:
            state = torch.load(
                io.BytesIO(found.payload), map_location=map_location, weights_only=True
            )
        except Exception as e:  # a payload torch cannot read is skipped like a torn file
            warnings.warn(
                f"skipping checkpoint {found.path}: {e}", checkpoint.CheckpointWarning, stacklevel=2
            )
            continue
        return found.step, state
    return None


def init_distributed(backend: str = "gloo", timeout_s: float = 1800.0) -> None:
    """`init_process_group` that survives torchrun's own restarts (`--max-restarts`).

    A restarted worker group meets in the agent's store again, where the previous round's
    workers left their addresses under the same keys: measured with torch 2.15 and gloo, the
    restarted ranks then dial dead peers ("Connection refused", or a hang until the timeout).
    Keying the group by `TORCHELASTIC_RESTART_COUNT` gives each round a clean slate. Outside
    torchrun this is plain `init_process_group(backend)`."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        return
    world = int(os.environ["WORLD_SIZE"])
    store = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
    )
    dist.init_process_group(
        backend,
        store=PrefixStore(f"rdmaplane/restart-{restart}", store),
        rank=int(os.environ["RANK"]),
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


def any_rank(flag: bool) -> bool:
    """True on every rank if it is true on any (an all-reduce MAX); `flag` when not distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
