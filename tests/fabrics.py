"""Fabric files of the shapes the tests, the benchmark and the demos use."""

from __future__ import annotations

from typing import Any

HEADER = {"apiVersion": "rdmaplane.io/v1alpha1", "kind": "Fabric"}


def leaf_spine(
    leaves: int = 4, per_leaf: int = 16, leaves_per_spine: int = 2, prefix: str = "gpu"
) -> dict[str, Any]:
    """Three tiers: `leaves` leaves of `per_leaf` nodes, `leaves_per_spine` leaves per spine,
    one core above the spines; each node cabled as a whole (one NIC, or all on one leaf)."""
    spines = (leaves + leaves_per_spine - 1) // leaves_per_spine
    switches: list[dict[str, Any]] = [{"name": "core", "tier": 2}]
    switches += [{"name": f"spine-{s}", "tier": 1, "parent": "core"} for s in range(spines)]
    switches += [
        {"name": f"leaf-{i}", "tier": 0, "parent": f"spine-{i // leaves_per_spine}"}
        for i in range(leaves)
    ]
    nodes = [node_name(prefix, i, n, per_leaf) for i in range(leaves) for n in range(per_leaf)]
    links = [{"node": name, "switch": f"leaf-{k // per_leaf}"} for k, name in enumerate(nodes)]
    return {**HEADER, "switches": switches, "nodes": nodes, "links": links}


def rail_optimised(
    units: int = 2, per_unit: int = 8, rails: int = 8, groups: bool = True, prefix: str = "gpu"
) -> dict[str, Any]:
    """A rail-optimised fabric: scalable unit u has one leaf per rail (`su{u}-rail{r}`), NIC r
    of every node in it (`mlx5_{r}`) plugs into rail r's leaf; rail r's leaves of all units
    share the rail spine `spine-rail{r}`."""
    switches: list[dict[str, Any]] = [{"name": f"spine-rail{r}", "tier": 1} for r in range(rails)]
    for u in range(units):
        for r in range(rails):
            leaf: dict[str, Any] = {
                "name": f"su{u}-rail{r}",
                "tier": 0,
                "parent": f"spine-rail{r}",
                "rail": r,
            }
            if groups:
                leaf["group"] = f"su{u}"
            switches.append(leaf)
    nodes = [node_name(prefix, u, n, per_unit) for u in range(units) for n in range(per_unit)]
    links = [
        {
            "node": name,
            "hca": f"mlx5_{r}",
            "switch": f"su{k // per_unit}-rail{r}",
            "switchPort": f"Ethernet{k % per_unit + 1}",
        }
        for k, name in enumerate(nodes)
        for r in range(rails)
    ]
    return {**HEADER, "switches": switches, "nodes": nodes, "links": links}


def node_name(prefix: str, group: int, index: int, per_group: int) -> str:
    return f"{prefix}-{group * per_group + index:03d}"
