"""The benches' fabric: 256 nodes under 16 leaves of 16, 4 leaves per spine, one core above the
spines; hops between nodes by rdmaplane's own fabric model."""

from __future__ import annotations

import itertools

from rdmaplane.core import fabric as fab

LEAVES, PER_LEAF, LEAVES_PER_SPINE = 16, 16, 4
TOP_HOPS = 5.0


def build_fabric(
    leaves: int = LEAVES, per_leaf: int = PER_LEAF, per_spine: int = LEAVES_PER_SPINE
) -> fab.Fabric:
    spines = -(-leaves // per_spine)
    switches = [fab.Switch("core", 2)]
    switches += [fab.Switch(f"spine-{s}", 1, "core") for s in range(spines)]
    switches += [fab.Switch(f"leaf-{i:02d}", 0, f"spine-{i // per_spine}") for i in range(leaves)]
    nodes = [f"gpu-{k:03d}" for k in range(leaves * per_leaf)]
    links = [fab.Link(n, f"leaf-{k // per_leaf:02d}") for k, n in enumerate(nodes)]
    return fab.build_fabric(switches, links, nodes)


def mean_hops(where: dict[str, fab.Location], nodes: list[str]) -> float:
    pairs = list(itertools.combinations(nodes, 2))
    return sum(fab.hops(where[a], where[b]) for a, b in pairs) / len(pairs) if pairs else 1.0


def leaves_of(fabric: fab.Fabric) -> dict[str, str]:
    return {n: loc.tiers[0] for n, loc in fabric.locations().items()}
