"""Median time to read and model the largest bundled sample node (goal: <= 20 ms).

Usage: python bench/discovery.py [--runs N]

Materialises every sample, picks the one with the most sysfs files, then times
`rdmaplane.adapters.discovery.read_node` (every file the reader needs: PCI functions, NUMA nodes,
netdevs, HCAs, ports and their full GID tables) after one warm-up read. The tree lives on
tmpfs when /dev/shm is writable, as /sys does.

In the same runs, interleaved, it times the floor: opening, reading and closing exactly the
files the reader read (directory-relative, no parsing, no model). On this shared VM the floor
itself moves by ±30 % between minutes; the difference is the reader's own cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from rdmaplane.adapters.discovery import samples
from rdmaplane.adapters.discovery.sysfs import Recording, read_node


def syscall_floor(root: str, files: list[str]) -> None:
    """The least any reader must do: open, read and close each file (one fd per folder)."""
    folder_fd, folder = -1, None
    for rel in files:
        parent, _, name = rel.rpartition("/")
        if parent != folder:
            if folder_fd >= 0:
                os.close(folder_fd)
            folder_fd, folder = os.open(f"{root}/{parent}", os.O_RDONLY | os.O_DIRECTORY), parent
        try:
            fd = os.open(name, os.O_RDONLY, dir_fd=folder_fd)
        except OSError:
            continue
        try:
            os.read(fd, 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
    os.close(folder_fd)


def summary(times: list[float]) -> str:
    times = sorted(times)
    return (
        f"median {statistics.median(times):.1f} ms, "
        f"p90 {times[int(len(times) * 0.9) - 1]:.1f} ms, min {times[0]:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    sizes = {}
    for name in samples.names():
        with samples.materialised(name) as root:
            sizes[name] = sum(len(files) for _, _, files in os.walk(root))
    largest = max(sizes, key=lambda n: sizes[n])
    with samples.materialised(largest) as root:
        recording = Recording()
        topo = read_node(str(root), recording=recording)
        files = list(recording.files)  # in the order the reader read them
        times, floors = [], []
        for _ in range(args.runs):
            start = time.perf_counter()
            read_node(str(root))
            times.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            syscall_floor(str(root), files)
            floors.append((time.perf_counter() - start) * 1000)
    gids = sum(len(p.gids) for h in topo.hcas for p in h.ports)
    print(
        f"sample: {largest} ({sizes[largest]} files in the tree; the reader reads "
        f"{len(recording.files)} files, {len(recording.dirs)} dirs, {len(recording.links)} links)"
    )
    print(f"model: {len(topo.gpus)} GPUs, {len(topo.hcas)} HCAs, {gids} non-empty GIDs")
    print(f"read+model over {args.runs} runs: {summary(times)} (goal <= 20 ms)")
    print(f"floor (open+read+close of the same files, same runs): {summary(floors)}")
    own = statistics.median(t - f for t, f in zip(times, floors, strict=True))
    print(f"the reader's own cost above the floor: median {own:.1f} ms")


if __name__ == "__main__":
    main()
