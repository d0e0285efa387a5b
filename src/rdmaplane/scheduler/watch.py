"""Feed the cache from the API server: list, then watch from the list's version; on any error
back off (with jitter, up to 30 s) and list again. Nothing here is on the request path, and it
stays off it: objects are decoded straight to dicts, and after each event the loop lets waiting
requests run (one read from the API server carries dozens of events in a busy cluster, and
kube-scheduler waits on every /filter and /prioritize in its scheduling cycle)."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightkube import AsyncClient

from rdmaplane.kube import NodeDict, NodeResourceTopology, PodDict, async_client
from rdmaplane.scheduler.cache import ClusterCache

log = logging.getLogger("rdmaplane.scheduler.watch")

_RESOURCES: dict[str, tuple[Any, dict[str, Any]]] = {
    "nrt": (NodeResourceTopology, {}),
    "node": (NodeDict, {}),
    # every namespace (lightkube would otherwise use the client's default); pending pods too,
    # so that job-aware scoring knows how many pods a job has before they are bound
    "pod": (PodDict, {"namespace": "*"}),
}
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 30.0


def make_client(kubeconfig: Path | None) -> AsyncClient:
    """The kubeconfig's cluster, else the pod's service account (raises until one exists)."""
    return async_client(kubeconfig)


def as_dict(obj: Any) -> dict[str, Any]:
    """A lightkube object as the plain dict the cache reads (the dict resources are one)."""
    return obj if isinstance(obj, dict) else dict(obj.to_dict())


async def watch_kind(
    kind: str,
    cache: ClusterCache,
    client_factory: Callable[[], AsyncClient],
    on_restart: Callable[[str], None] = lambda kind: None,
) -> None:
    """Keep one kind of the cache current, forever."""
    resource, selectors = _RESOURCES[kind]
    delay = BACKOFF_FIRST
    client: AsyncClient | None = None
    while True:
        try:
            client = client or client_factory()
            listing = client.list(resource, **selectors)
            objs = [as_dict(o) async for o in listing]
            cache.replace(kind, objs)
            del objs
            # Long-lived cache objects out of the collector's reach: full collections over a
            # 5,000-node cache would otherwise stall requests for hundreds of milliseconds.
            gc.freeze()
            log.info("listed %s objects", kind)
            delay = BACKOFF_FIRST
            async for event, obj in client.watch(
                resource, resource_version=listing.resourceVersion, **selectors
            ):
                cache.apply(kind, event, as_dict(obj))
                await asyncio.sleep(0)  # requests that arrived meanwhile go first
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the API server being away must never stop us
            on_restart(kind)
            log.warning("%s watch: %s: %s; retrying in %.1fs", kind, type(exc).__name__, exc, delay)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, BACKOFF_MAX)


async def watch_all(
    cache: ClusterCache,
    client_factory: Callable[[], AsyncClient],
    on_restart: Callable[[str], None] = lambda kind: None,
) -> None:
    await asyncio.gather(*(watch_kind(k, cache, client_factory, on_restart) for k in _RESOURCES))
