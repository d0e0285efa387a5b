"""Every process-wide random number generator a training step may draw from, taken and put back
per process: torch's CPU generator, CUDA's per device, Python's `random` (augmentation), and
numpy's global RNG. A bit-exact resume needs each rank's own: dropout and augmentation are
usually seeded per rank.

CUDA's are taken once CUDA is initialized in the process (a model or tensor on the GPU does
that; before it, the CUDA generators have not been drawn from), one per visible device, and put
back lazily (torch applies them when CUDA starts). numpy's is taken when numpy is loaded (torch
loads it when it is installed) and put back when numpy can be imported. Tensors and plain values
only, so a checkpoint holding them loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import importlib
import random
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch


class ResumeWarning(UserWarning):
    """Part of the saved random state cannot be put back here (no CUDA, fewer devices, no
    numpy, another world size): training goes on, but not bit for bit."""


class CudaRandom(Protocol):
    """What is used of `torch.cuda`."""

    def is_available(self) -> bool: ...
    def is_initialized(self) -> bool: ...
    def device_count(self) -> int: ...
    def get_rng_state_all(self) -> list[torch.Tensor]: ...
    def set_rng_state(self, new_state: torch.Tensor, device: int = ...) -> None: ...


def capture(cuda: CudaRandom = torch.cuda) -> dict[str, Any]:
    """This process's generator states."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
    }
    if cuda.is_available() and cuda.is_initialized():
        state["cuda"] = cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        legacy = numpy.random.get_state(legacy=False)
        state["numpy"] = {
            "bit_generator": str(legacy["bit_generator"]),
            "key": [int(k) for k in legacy["state"]["key"]],
            "pos": int(legacy["state"]["pos"]),
            "has_gauss": int(legacy["has_gauss"]),
            "gauss": float(legacy["gauss"]),
        }
    return state


def restore(state: Mapping[str, Any], cuda: CudaRandom = torch.cuda) -> None:
    """Put back what `capture` took; warns (`ResumeWarning`) for what cannot be."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state:
        _restore_cuda(state["cuda"], cuda)
    if "numpy" in state:
        _restore_numpy(state["numpy"])


def _restore_cuda(states: Sequence[torch.Tensor], cuda: CudaRandom) -> None:
    here = cuda.device_count() if cuda.is_available() else 0
    if here < len(states):
        warnings.warn(
            f"the checkpoint holds the CUDA RNG of {len(states)} devices, this process sees "
            f"{here}: the others are not restored",
            ResumeWarning,
            stacklevel=3,
        )
    for device, saved in enumerate(states[:here]):
        cuda.set_rng_state(saved, device)


def _restore_numpy(saved: Mapping[str, Any]) -> None:
    try:
        numpy = importlib.import_module("numpy")
    except ImportError:
        warnings.warn(
            "the checkpoint holds numpy's RNG, but numpy is not installed", ResumeWarning, 3
        )
        return
    numpy.random.set_state(
        {
            "bit_generator": saved["bit_generator"],
            "state": {"key": numpy.array(saved["key"], dtype=numpy.uint32), "pos": saved["pos"]},
            "has_gauss": saved["has_gauss"],
            "gauss": saved["gauss"],
        }
    )
