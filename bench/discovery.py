"""Median time to read and model the largest bundled sample node (goal: <= 20 ms).

Usage: python bench/discovery.py [--runs N]

Materialises every sample, picks the one with the most sysfs files, then times
`rdmaplane.discovery.read_node` (every file the reader needs: PCI functions, NUMA nodes,
netdevs, HCAs, ports and their full GID tables) after one warm-up read. The tree lives on
tmpfs when /dev/shm is writable, as /sys does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from rdmaplane.discovery import samples
from rdmaplane.discovery.sysfs import Recording, read_node


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
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            read_node(str(root))
            times.append((time.perf_counter() - start) * 1000)
    times.sort()
    gids = sum(len(p.gids) for h in topo.hcas for p in h.ports)
    print(
        f"sample: {largest} ({sizes[largest]} files in the tree; the reader reads "
        f"{len(recording.files)} files, {len(recording.dirs)} dirs, {len(recording.links)} links)"
    )
    print(f"model: {len(topo.gpus)} GPUs, {len(topo.hcas)} HCAs, {gids} non-empty GIDs")
    print(
        f"read+model over {args.runs} runs: median {statistics.median(times):.1f} ms, "
        f"p90 {times[int(len(times) * 0.9) - 1]:.1f} ms, min {times[0]:.1f} ms (goal <= 20 ms)"
    )


if __name__ == "__main__":
    main()
