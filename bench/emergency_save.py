"""How long an emergency checkpoint takes, for 1, 4 and 16 GiB of state on tmpfs and a disk:
what `fault.graceSeconds` and `terminationGracePeriodSeconds` must cover (docs/faults.md).

Usage: python bench/emergency_save.py [--sizes 1,4,16] [--runs 3] [--tmpfs /dev/shm]
                                      [--disk DIR] [--layouts replicated,sharded]

The state is a module of 256 MiB float32 tensors adding up to the size (a model with its
optimizer's moments looks the same to a checkpoint: large tensors). Per size, file system and
layout (`Checkpoints`, one file; `ShardedCheckpoints`, torch.distributed.checkpoint in a
one-rank gloo group, so one shard of every byte), in one process, `--runs` times up to 4 GiB
and once above (a minute each on a slow disk):

  save        the foreground save an emergency makes: from the call until the checkpoint is
              fsynced, renamed and its folder fsynced (Checkpoints.save)
  held        a background save's cost to training: until save(background=True) returns
              (the copy of the state into CPU memory); the write goes on in a thread
  written     that background save, until it is on disk (wait())

A case whose memory does not fit what the machine has available now, with a margin (the state;
on tmpfs its file; for the background save a second copy), is not run: its save time is then
printed as extrapolated from the throughput measured at the largest size that ran on that file
system and layout, and marked `extrapolated`. Nothing else is estimated.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from rdmaplane.train import pytorch as tp  # noqa: E402

GIB = 1024**3
TENSOR = 256 * 1024**2  # bytes per tensor
MARGIN = 4 * GIB  # left to the rest of the machine


class State(torch.nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        count = max(1, size // TENSOR)
        self.tensors = torch.nn.ParameterList(
            torch.nn.Parameter(torch.full((size // count // 4,), float(i)), requires_grad=False)
            for i in range(count)
        )


def available() -> int:
    """MemAvailable, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def fs_type(path: Path) -> str:
    """The file system type of the mount holding `path` (the longest matching mount point)."""
    real, best = str(path.resolve()), ("", "?")
    for line in Path("/proc/mounts").read_text().splitlines():
        _, point, kind, *_ = line.split()
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best[0]):
            best = (point, kind)
    return best[1]


def needed(size: int, on_tmpfs: bool, background: bool) -> int:
    """Memory a case takes beyond what is in use: the state, its file on tmpfs, the copy."""
    return size * (1 + on_tmpfs + background) + MARGIN


def timed(action: Callable[..., object], *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    action(*args, **kwargs)
    return time.perf_counter() - start


def raw_write(root: Path, size: int) -> float:
    """Seconds to write `size` bytes of one buffer to a file and fsync it: the file system's
    own pace, without serializing or checksumming (the reference line of the table)."""
    block = bytes(64 * 1024**2)
    fd, name = tempfile.mkstemp(prefix="emergency-save-", dir=root)
    try:
        start = time.perf_counter()
        for _ in range(size // len(block)):
            os.write(fd, block)
        os.fsync(fd)
        return time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(name)


def one_case(
    layout: type[tp.Checkpoints], size: int, root: Path, runs: int
) -> dict[str, list[float]]:
    """Seconds of each measure, per run (each into a fresh folder, then removed)."""
    state = State(size)
    got: dict[str, list[float]] = {"save": [], "held": [], "written": []}
    for run in range(runs):
        for background in (False, True):
            if background and needed(size, fs_type(root) == "tmpfs", True) > available() + size:
                continue  # the state is in use already; a copy does not fit beside it
            folder = Path(tempfile.mkdtemp(prefix="emergency-save-", dir=root))
            try:
                ckpt = layout(folder, state)
                if background:
                    got["held"].append(timed(ckpt.save, run + 1, background=True))
                    got["written"].append(got["held"][-1] + timed(ckpt.wait))
                else:
                    got["save"].append(timed(ckpt.save, run + 1))
            finally:
                shutil.rmtree(folder)
    return got


def spread(values: list[float]) -> str:
    median = statistics.median(values)
    return (
        f"{median:.2f}"
        if len(values) == 1
        else f"{median:.2f} [{min(values):.2f}-{max(values):.2f}]"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16", help="GiB of state, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tmpfs", type=Path, default=Path("/dev/shm"))
    parser.add_argument(
        "--disk", type=Path, default=Path(tempfile.gettempdir()), help="a folder on a disk"
    )
    parser.add_argument("--layouts", default="replicated,sharded")
    args = parser.parse_args()
    sizes = [int(s) * GIB for s in args.sizes.split(",")]
    layouts = {"replicated": tp.Checkpoints, "sharded": tp.ShardedCheckpoints}
    chosen = [(name, layouts[name]) for name in args.layouts.split(",")]

    torch.set_num_threads(1)
    store = dist.HashStore()  # type: ignore[attr-defined, unused-ignore]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    load = os.getloadavg()[0]
    print(
        f"emergency save, median [min-max] of {args.runs} runs (1 above 4 GiB), seconds; "
        f"{os.cpu_count()} CPUs, load {load:.1f}, {available() / GIB:.1f} GiB available"
    )
    print(f"{'state':>8}  {'file system':<18} {'layout':<10} {'save':>20} {'GiB/s':>5}", end="")
    print(f" {'held':>5} {'written':>7}")
    for root in (args.tmpfs, args.disk):
        kind = fs_type(root)
        place = f"{kind} {root}"
        raw = 1 / raw_write(root, GIB)  # GiB/s
        print(f"{1:>4} GiB  {place:<18} {'raw write':<10} {'':>20} {raw:5.2f}")
        for name, layout in chosen:
            rate = None  # GiB/s of the largest size that ran, for the ones that did not
            for size in sizes:
                gib = size // GIB
                row = f"{gib:>4} GiB  {place:<18} {name:<10}"
                if needed(size, kind == "tmpfs", False) > available():
                    guess = f"{gib / rate:.1f} extrapolated" if rate else "not measured"
                    need = needed(size, kind == "tmpfs", False) / GIB
                    print(f"{row} {guess:>20}        (needs {need:.0f} GiB)")
                    continue
                m = one_case(layout, size, root, args.runs if size <= 4 * GIB else 1)
                rate = gib / statistics.median(m["save"])
                print(f"{row} {spread(m['save']):>20} {rate:5.2f}", end="")
                held = statistics.median(m["held"]) if m["held"] else None
                written = statistics.median(m["written"]) if m["written"] else None
                print(f" {held:5.2f} {written:7.2f}" if held and written else "     -       -")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
