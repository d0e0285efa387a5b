"""The fabric as gang schedulers read it: a Kueue `Topology` and Volcano `HyperNode`s. Pure.

- Kueue topology-aware scheduling groups nodes by the values of node labels: a `Topology`
  lists those label keys from the widest level to the narrowest (`spec.levels[].nodeLabel`),
  `kubernetes.io/hostname` last; a `ResourceFlavor` names it in `spec.topologyName`.
- Volcano's network-topology-aware scheduling reads a tree of `HyperNode`s (cluster-scoped,
  `topology.volcano.sh/v1alpha1`): tier 1 holds nodes, each higher tier holds HyperNodes of the
  tier below (`spec.members[{type, selector: {exactMatch: {name}}}]`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rdmaplane.core import names
from rdmaplane.core.errors import InputError
from rdmaplane.core.fabric import HOSTNAME_LABEL, TierTree, object_name

KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
VOLCANO_API_VERSION = "topology.volcano.sh/v1alpha1"


class ExportError(InputError):
    """Nothing sensible to export (no tiers known, too few label keys for the tiers)."""


def kueue_topology(
    name: str, tier_keys: Sequence[str], depth: int, api_version: str = KUEUE_API_VERSION
) -> dict[str, Any]:
    """A Kueue `Topology` whose levels are the tier label keys, widest first, then hostname."""
    if depth <= 0:
        raise ExportError("no node has a fabric tier: nothing to make levels of")
    if len(tier_keys) < depth:
        raise ExportError(
            f"the fabric has {depth} tiers but only {len(tier_keys)} tier label keys are given"
        )
    keys = [k for k in reversed(tier_keys[:depth]) if k != HOSTNAME_LABEL]
    levels = [{"nodeLabel": k} for k in [*keys, HOSTNAME_LABEL]]
    return {
        "apiVersion": api_version,
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": levels},
    }


def hypernode_name(tier: int, name: str) -> str:
    """The HyperNode standing for fabric tier `tier` id `name` (Volcano tier = ours + 1)."""
    return object_name(f"tier{tier + 1}", name)


def volcano_hypernodes(fabric: TierTree) -> list[dict[str, Any]]:
    """One HyperNode per tier id: tier-0 ids hold their nodes, higher ids the ids below them."""
    if fabric.depth <= 0:
        raise ExportError("no node has a fabric tier: nothing to make HyperNodes of")
    out = []
    for tier in range(fabric.depth):
        for name in fabric.ids(tier):
            if tier == 0:
                members = [_member("Node", n) for n in fabric.nodes_under.get(name, ())]
            else:
                members = [
                    _member("HyperNode", hypernode_name(tier - 1, c))
                    for c in fabric.children(tier, name)
                ]
            if not members:
                continue
            out.append(
                {
                    "apiVersion": VOLCANO_API_VERSION,
                    "kind": "HyperNode",
                    "metadata": {
                        "name": hypernode_name(tier, name),
                        "labels": {names.FABRIC_TIER_LABEL: str(tier)},
                        "annotations": {names.FABRIC_ID_ANNOTATION: name},
                    },
                    "spec": {"tier": tier + 1, "members": members},
                }
            )
    return out


def _member(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "selector": {"exactMatch": {"name": name}}}
