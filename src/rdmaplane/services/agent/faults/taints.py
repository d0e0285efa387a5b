"""Our taints on the Node: `rdmaplane.io/rdma-unhealthy` (every compute HCA fatal; NoExecute by
default, which evicts) and `rdmaplane.io/rdma-quarantine` (a port out of service for failing
again and again), reconciled by an optimistic update that leaves every other taint alone."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from rdmaplane.core.faults import TAINT_KEY, Taint
from rdmaplane.core.porthealth import PortKey
from rdmaplane.core.repeat import QUARANTINE_TAINT_KEY
from rdmaplane.services.agent.metrics import FaultMetrics

log = logging.getLogger(__package__)
OURS = (TAINT_KEY, QUARANTINE_TAINT_KEY)


class Taints:
    def __init__(
        self,
        kube: AsyncClient | None,
        node_name: str,
        quarantine_effect: str | None,
        node_event: Callable[[str, str, str], None],
        metrics: FaultMetrics,
    ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.quarantine_effect = quarantine_effect
        self._node_event = node_event
        self.metrics = metrics
        self.written: dict[str, Taint] | None = None  # ours on the Node; None: not known

    def wanted(self, taint: Taint | None, quarantined: Mapping[PortKey, str]) -> dict[str, Taint]:
        """Our taints on the Node, by key: rdma-unhealthy (`taint`: every compute HCA fatal)
        and rdma-quarantine (a port out of service for failing again and again)."""
        out = {TAINT_KEY: taint} if taint is not None else {}
        effect = self.quarantine_effect
        if effect is not None and quarantined:
            value = f"{len(quarantined)}-ports"
            out[QUARANTINE_TAINT_KEY] = Taint(QUARANTINE_TAINT_KEY, value, effect)
        return out

    def new_noexecute(self, taint: Taint | None) -> bool:
        """The rdma-unhealthy taint wanted evicts (NoExecute) and is not on the Node yet."""
        written = (self.written or {}).get(TAINT_KEY)
        return taint is not None and taint.effect == "NoExecute" and written != taint

    async def reconcile(self, wanted: dict[str, Taint], may_taint: bool) -> None:
        """Make the node carry exactly the taints wanted under our keys, by an optimistic
        update: a concurrent change of the taints (409) is retried on the next round. A new
        NoExecute taint waits for the budget's token (`may_taint`)."""
        assert self.kube is not None
        if not may_taint and TAINT_KEY in wanted:
            wanted = {k: t for k, t in wanted.items() if k != TAINT_KEY}
            if self.written is not None and TAINT_KEY in self.written:
                wanted[TAINT_KEY] = self.written[TAINT_KEY]
        if wanted == self.written:
            return
        node = await self.kube.get(Node, self.node_name)
        current = list((node.spec.taints if node.spec else None) or [])
        ours = {t.key: Taint(t.key, t.value or "", t.effect) for t in current if t.key in OURS}
        if ours == wanted:
            self.written = wanted
            return
        kept = [t.to_dict() for t in current if t.key not in OURS]
        taints = kept + [
            {"key": t.key, "value": t.value, "effect": t.effect} for t in wanted.values()
        ]
        assert node.metadata is not None
        patch = {
            "metadata": {"resourceVersion": node.metadata.resourceVersion},
            "spec": {"taints": taints},
        }
        await self.kube.patch(Node, self.node_name, patch, patch_type=PatchType.MERGE)
        self.written = wanted
        for key in sorted(wanted.keys() | ours.keys()):
            self._said(key, ours.get(key), wanted.get(key))

    def _said(self, key: str, before: Taint | None, after: Taint | None) -> None:
        if before == after:
            return
        if after is not None:
            why = {TAINT_KEY: "every compute HCA fatal"}.get(key, "ports quarantined")
            message = f"taint {after.key}={after.value}:{after.effect}: {why}"
            self._node_event("Warning", "RDMANodeTainted", message)
            log.warning(message)
        else:
            self._node_event("Normal", "RDMANodeUntainted", f"taint {key} removed")
            log.info("taint %s removed", key)
        self.metrics.decisions.labels("taint" if after else "untaint", "done").inc()
