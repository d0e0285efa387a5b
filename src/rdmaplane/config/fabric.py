"""The operator's fabric file (`apiVersion: rdmaplane.io/v1alpha1`, `kind: Fabric`;
docs/fabric.md): its schema, read into the fabric model (`rdmaplane.fabric`).

Checked as every config file is: camelCase keys, unknown keys refused with the key probably
meant (`switchs` → `switches`), every problem at once, naming the key. What the schema cannot
say (parents one tier up, no loop, links into tier-0 switches) `fabric.build_fabric` checks.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from rdmaplane.config.base import ConfigError, Section, validate
from rdmaplane.fabric import MAX_TIERS, Fabric, FabricError, Link, Switch, build_fabric


class SwitchDoc(Section):
    name: Annotated[str, Field(min_length=1)]
    tier: Annotated[int, Field(ge=0, lt=MAX_TIERS)]
    parent: str | None = None
    rail: Annotated[int, Field(ge=0)] | None = None
    group: str | None = None


class NodeDoc(Section):
    name: Annotated[str, Field(min_length=1)]


class LinkDoc(Section):
    node: Annotated[str, Field(min_length=1)]
    switch: Annotated[str, Field(min_length=1)]
    hca: str = ""
    port: Annotated[int, Field(ge=1)] = 1
    switch_port: str = ""
    rail: Annotated[int, Field(ge=0)] | None = None


class FabricDoc(Section):
    api_version: Literal["rdmaplane.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["Fabric"]
    switches: list[SwitchDoc]
    nodes: list[NodeDoc | str] = []
    links: list[LinkDoc] = []


def fabric_from_document(doc: Any, where: str = "fabric file") -> Fabric:
    """Read and check a `kind: Fabric` document (already parsed YAML/JSON); `FabricError`
    names `where` and every problem."""
    if not isinstance(doc, dict):
        raise FabricError(f"{where}: expected a Fabric mapping at the top level")
    try:
        parsed = validate(FabricDoc, doc, f"{where}: ")
    except ConfigError as e:
        raise FabricError(str(e)) from None
    switches = [Switch(s.name, s.tier, s.parent, s.rail, s.group) for s in parsed.switches]
    nodes = [n if isinstance(n, str) else n.name for n in parsed.nodes]
    links = [Link(x.node, x.switch, x.hca, x.port, x.switch_port, x.rail) for x in parsed.links]
    return build_fabric(switches, links, nodes, where)
