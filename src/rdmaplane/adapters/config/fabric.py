"""The operator's fabric file (`apiVersion: rdmaplane.io/v1alpha1`, `kind: Fabric`;
docs/fabric.md), read straight into the fabric model's `Switch` and `Link`
(`rdmaplane.core.fabric`).

Checked as every config file is: camelCase keys, unknown keys refused with the key probably
meant (`switchs` → `switches`), every problem at once, naming the key. What the schema cannot
say (parents one tier up, no loop, links into tier-0 switches) `fabric.build_fabric` checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rdmaplane.adapters.config.base import ConfigError, validate
from rdmaplane.core.fabric import Fabric, FabricError, Link, Switch, build_fabric


@dataclass(frozen=True, slots=True)
class NodeDoc:
    name: str = field(metadata={"min_length": 1})


@dataclass(frozen=True, slots=True)
class FabricDoc:
    api_version: Literal["rdmaplane.io/v1alpha1"] = field(metadata={"alias": "apiVersion"})
    kind: Literal["Fabric"]
    switches: tuple[Switch, ...]
    nodes: tuple[NodeDoc | str, ...] = ()
    links: tuple[Link, ...] = ()


def fabric_from_document(doc: Any, where: str = "fabric file") -> Fabric:
    """Read and check a `kind: Fabric` document (already parsed YAML/JSON); `FabricError`
    names `where` and every problem."""
    if not isinstance(doc, dict):
        raise FabricError(f"{where}: expected a Fabric mapping at the top level")
    try:
        parsed = validate(FabricDoc, doc, f"{where}: ")
    except ConfigError as e:
        raise FabricError(str(e)) from None
    nodes = [n if isinstance(n, str) else n.name for n in parsed.nodes]
    return build_fabric(list(parsed.switches), list(parsed.links), nodes, where)
