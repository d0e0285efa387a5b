"""How long the GID plan takes at cluster scale: `audit` over 5,000 HGX nodes (8×400G RoCE each,
one node in fifty with an HCA whose IPv4 GID moved to index 5), and `nccl_env` per allocation.

Run: .venv/bin/python bench/gid_audit.py [NODES]
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from rdmaplane.adapters.discovery import samples
from rdmaplane.core.gid import audit
from rdmaplane.core.model import Gid, NodeTopology
from rdmaplane.core.nccl import nccl_env
from rdmaplane.core.selectors import compute_ports


def shifted(topo: NodeTopology, hostname: str) -> NodeTopology:
    """mlx5_3's table with two extra IPv6 entries in front of its IPv4 pair (3 → 5)."""
    hcas = []
    for h in topo.hcas:
        if h.name == "mlx5_3":
            p = h.ports[0]
            extra = (
                Gid(2, "fd00:0099:0000:0000:0000:0000:0000:0001", p.gids[2].type, p.netdev),
                Gid(3, "fd00:0099:0000:0000:0000:0000:0000:0001", p.gids[3].type, p.netdev),
            )
            moved = tuple(replace(g, index=g.index + 2) for g in p.gids[2:])
            h = replace(h, ports=(replace(p, gids=p.gids[:2] + extra + moved),))
        hcas.append(h)
    return replace(topo, hostname=hostname, hcas=tuple(hcas))


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    base = samples.read_sample("hgx-h100-roce")
    odd = shifted(base, "odd")
    nodes = [replace(odd if i % 50 == 0 else base, hostname=f"gpu-{i:05d}") for i in range(count)]

    start = time.perf_counter()
    result = audit(nodes)
    took = time.perf_counter() - start
    print(
        f"audit: {count} nodes × 8 RoCE ports in {took:.3f} s "
        f"({took / count * 1e6:.0f} µs/node); majority index {result.majority_index}, "
        f"{len(result.deviations)} deviations"
    )

    ports = compute_ports(base)
    rounds = 2000
    start = time.perf_counter()
    for _ in range(rounds):
        nccl_env(base, ports)
    took = time.perf_counter() - start
    print(f"nccl_env: 8-port allocation in {took / rounds * 1e6:.0f} µs ({rounds} rounds)")


if __name__ == "__main__":
    main()
