"""Where this node sits on the fabric, for the agent to publish: tier labels on the Node and
one HCA zone per cabled HCA in the NRT (its tier-0 switch, rail and switch port).

The operator's fabric file is read first (it can name tiers above tier-0); without one, or when
it lists no link of this node, LLDP tells the tier-0 switch of each compute NIC. With neither
source (`lldp: off` and no file, or no lldpcli on the node) the agent owns no tier label and
leaves whatever another tool (topograph, a cloud provider) put there alone.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence

from rdmaplane.adapters.config.fabric import fabric_from_document
from rdmaplane.adapters.discovery import lldp
from rdmaplane.adapters.documents import DocumentError, read_document
from rdmaplane.core import fabric as fab
from rdmaplane.core import nrt
from rdmaplane.core.fabric import NOTHING, NodeFabric
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.settings.agent import FabricSettings

log = logging.getLogger("rdmaplane.services.agent.fabric")


class FabricSource:
    def __init__(self, config: FabricSettings, node: str) -> None:
        self.config = config
        self.node = node
        self._problem: str | None = None

    @property
    def owned_keys(self) -> tuple[str, ...]:
        """The tier labels the agent owns (sets, or removes when they no longer hold)."""
        if self.config.file is not None or self._lldp_available():
            return tuple(self.config.tier_labels)
        return ()

    def _lldp_available(self) -> bool:
        command = self.config.lldp_command[0]
        return self.config.lldp == "auto" and shutil.which(command) is not None

    def read(self, topo: NodeTopology) -> NodeFabric:
        """The node's place now (blocking: runs lldpcli; call it off the event loop)."""
        fabric = self._fabric_file()
        if fabric is not None and fabric.links_of(self.node):
            links, source = list(fabric.links_of(self.node)), "file"
            where = fabric.location(self.node)
            switches = dict(fabric.switches)
        elif self.config.lldp == "auto":
            neighbors, problem = lldp.read_neighbors(self.config.lldp_command)
            self._say(problem)
            links, source = lldp.links_from_neighbors(self.node, topo, neighbors), "lldp"
            switches = {x.switch: fab.Switch(x.switch, 0) for x in links}
            rails = fab.rails_of(links, switches)
            where = fab.Location((fab.collapse(x.switch for x in links),), rails) if links else None
        else:
            return NOTHING
        if where is None:
            return NOTHING
        labels = fab.tier_labels(where, self.config.tier_labels)
        return NodeFabric(labels, uplinks(topo, links, switches), source)

    def _fabric_file(self) -> fab.Fabric | None:
        if self.config.file is None:
            return None
        try:
            doc = read_document(self.config.file)
            return fabric_from_document(doc, str(self.config.file))
        except (DocumentError, fab.FabricError) as exc:
            self._say(f"{exc}; trying LLDP")
            return None

    def _say(self, problem: str | None) -> None:
        if problem != self._problem and problem is not None:
            log.warning("fabric: %s", problem)
        self._problem = problem


def uplinks(
    topo: NodeTopology, links: Sequence[fab.Link], switches: dict[str, fab.Switch]
) -> tuple[nrt.Uplink, ...]:
    """An NRT uplink per cabled HCA of this node, with its rail and where it sits."""
    rails = fab.hca_rails(links, switches)
    out = []
    for link in links:
        hca = topo.hca(link.hca) if link.hca else None
        if hca is not None:
            numa = -1 if hca.numa is None else hca.numa
            up = nrt.Uplink(
                hca.name, link.switch, rails.get(hca.name), link.switch_port, numa, hca.pcie_root
            )
            out.append(up)
    return tuple(out)
