"""Acting on a pod whose fault outlived the grace period: the RDMAFault condition first (so the
job controller sees why when the pod fails), then, under `fault.action: evict`, the eviction
through the Eviction API (never a delete: PodDisruptionBudgets and the job controllers' rules
apply)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from rdmaplane.core.apitime import api_time
from rdmaplane.core.faults import CONDITION, Fault
from rdmaplane.services.agent.faults.events import FaultEvents, describe
from rdmaplane.services.agent.faults.pods import ours

log = logging.getLogger(__package__)


class Evictions:
    def __init__(self, kube: AsyncClient, node_name: str, events: FaultEvents) -> None:
        self.kube = kube
        self.node_name = node_name
        self.events = events

    async def act(self, namespace: str, name: str, faults: Sequence[Fault], evict: bool) -> None:
        """The RDMAFault condition first (so the job controller sees why when the pod fails),
        then the eviction."""
        pod = await ours(self.kube, self.node_name, namespace, name)
        condition = {
            "type": CONDITION,
            "status": "True",
            "reason": "FatalPortFault",
            "message": describe(faults)[:1024],
            "lastTransitionTime": api_time(time.time()),
        }
        patch = {"status": {"conditions": [condition]}}
        await self.kube.patch(
            Pod.Status, name, patch, namespace=namespace, patch_type=PatchType.STRATEGIC
        )
        if not evict:
            log.warning("fault: %s/%s marked %s", namespace, name, CONDITION)
            return
        eviction = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))
        await self.kube.create(eviction, name, namespace=namespace)
        await self.events.on_pod(
            pod, "Warning", "RDMAFaultEviction", f"evicted: {describe(faults)}"
        )
        log.warning("fault: evicted %s/%s: %s", namespace, name, describe(faults))
