"""The fault actor's Events: on a pod (its notice, clearing, eviction) and on the fault budget's
Lease (the blast-radius breaker opening or closing), posted as `rdmaplane-agent` from this node;
and how faults read in them and in the logs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import cast

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Event, Pod

from rdmaplane.core import breaker
from rdmaplane.core.apitime import api_time
from rdmaplane.core.faults import Fault
from rdmaplane.core.settings.agent import BreakerSettings

log = logging.getLogger(__package__)
COMPONENT = "rdmaplane-agent"


def describe(faults: Iterable[Fault]) -> str:
    """Faults as Events and logs say them: `mlx5_3 port 1 fatal: port 1 DOWN (DISABLED); ...`."""
    return "; ".join(f"{f.hca} port {f.port} {f.cls.value}: {f.reason}" for f in faults)


class FaultEvents:
    def __init__(self, kube: AsyncClient, node_name: str) -> None:
        self.kube = kube
        self.node_name = node_name

    async def on_pod(self, pod: Pod, type_: str, reason: str, message: str) -> None:
        assert pod.metadata is not None and pod.metadata.namespace is not None
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.metadata.name,
            "namespace": pod.metadata.namespace,
            "uid": pod.metadata.uid,
        }
        await self.post(involved, pod.metadata.namespace, type_, reason, message)

    async def breaker(self, change: breaker.Change, settings: BreakerSettings) -> None:
        """One Event for the cluster when the breaker opens or closes: on the budget's Lease,
        posted by the agent whose write changed it."""
        reason = "RDMAFaultBreakerOpen" if change.opened else "RDMAFaultBreakerClosed"
        said = f"breaker open: {change.reason}" if change.opened else change.reason
        if change.opened:
            said += "; fault actions held (notices only) until the storm is over"
        else:
            said += "; held fault actions go ahead within the budget"
        lease = {"name": settings.lease, "namespace": settings.namespace}
        await self.post(
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", **lease},
            lease["namespace"],
            "Warning" if change.opened else "Normal",
            reason,
            said,
        )
        log.warning("%s (%s)", said, reason)

    async def post(
        self, involved: Mapping[str, object], namespace: str, type_: str, reason: str, message: str
    ) -> None:
        now = api_time(time.time())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": involved,
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT, "host": self.node_name},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self.kube.create(cast(Event, Event.from_dict(event)))
