"""The one check before anything is written to a pod: it is still ours to act on."""

from __future__ import annotations

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod

from rdmaplane.core.errors import RdmaplaneError


class NotOurs(RdmaplaneError):
    """The pod is not ours to act on any more (gone, elsewhere, already going)."""


async def ours(kube: AsyncClient, node_name: str, namespace: str, name: str) -> Pod:
    """The pod, if it is still on this node and not already going away."""
    try:
        pod = await kube.get(Pod, name, namespace=namespace)
    except ApiError as e:
        if e.status.code == 404:
            raise NotOurs(f"{namespace}/{name} is gone") from None
        raise
    node = pod.spec.nodeName if pod.spec else None
    if node != node_name:
        raise NotOurs(f"{namespace}/{name} runs on {node}, not {node_name}: stale view")
    if pod.metadata is not None and pod.metadata.deletionTimestamp is not None:
        raise NotOurs(f"{namespace}/{name} is already terminating")
    return pod
