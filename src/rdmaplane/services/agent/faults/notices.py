"""The fault notice on a pod (`rdmaplane.io/fault`, the contract in `rdmaplane.core.notice`),
with a Warning Event saying what broke and what comes next; cleared, with a Normal Event, when
the devices recover."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from rdmaplane.core.apitime import api_time
from rdmaplane.core.faults import CONDITION, Action, Fault
from rdmaplane.core.notice import ANNOTATION, Notice, encode
from rdmaplane.core.porthealth import FaultClass
from rdmaplane.services.agent.faults.events import FaultEvents, describe
from rdmaplane.services.agent.faults.pods import ours

log = logging.getLogger(__package__)


def notice(fault: Fault, wall_since: float, held: str = "") -> str:
    """The `rdmaplane.io/fault` annotation (`rdmaplane.core.notice`): what broke, how badly,
    why, since when, and why the breaker holds the action back (`held`), when it does."""
    since = api_time(wall_since)
    return encode(Notice(fault.hca, fault.port, fault.cls.value, fault.reason, since, held))


class Notices:
    def __init__(
        self,
        kube: AsyncClient,
        node_name: str,
        events: FaultEvents,
        action: Action,
        grace_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.events = events
        self.action = action
        self.grace_s = grace_s
        self._clock = clock

    async def notify(
        self, namespace: str, name: str, faults: Sequence[Fault], held: str = ""
    ) -> None:
        """Annotate the pod with its worst fault (`since` on the wall clock) and say so."""
        pod = await ours(self.kube, self.node_name, namespace, name)
        worst = faults[0]
        wall = time.time() - (self._clock() - worst.since)
        patch = {"metadata": {"annotations": {ANNOTATION: notice(worst, wall, held)}}}
        await self.kube.patch(Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE)
        then = {
            Action.EVICT: f"; evicting in {self.grace_s:g} s",
            Action.NOTIFY: f"; condition {CONDITION} in {self.grace_s:g} s",
        }.get(self.action, "")
        if held:
            then = f"; held: {held}"
        fatal = worst.cls == FaultClass.FATAL
        message = describe(faults) + (then if fatal else "")
        await self.events.on_pod(pod, "Warning", "RDMAFault", message)
        log.warning("fault notice to %s/%s: %s", namespace, name, message, extra={"pod": name})

    async def clear(self, namespace: str, name: str) -> None:
        pod = await ours(self.kube, self.node_name, namespace, name)
        patch = {"metadata": {"annotations": {ANNOTATION: None}}}
        await self.kube.patch(Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE)
        await self.events.on_pod(pod, "Normal", "RDMAFaultCleared", "the RDMA devices recovered")
        log.info("fault notice cleared on %s/%s", namespace, name)
