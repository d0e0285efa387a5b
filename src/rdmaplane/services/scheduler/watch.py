"""Feed the cache from the API server: list, then watch from the list's version; on any error
back off (with jitter, up to 30 s) and list again. Nothing here is on the request path, and it
stays off it: after each event the loop lets waiting requests run (one read from the API server
carries dozens of events in a busy cluster, and kube-scheduler waits on every /filter and
/prioritize in its scheduling cycle).

Pods are most of the events (three or more per pod scheduled: created, bound, running), so
their watch reads the lines off the connection (`kube.watchstream`) and decodes each event
straight into the one Pod model (`rdmaplane.core.pod.Pod`), skipping every field it does not read
(managedFields, status, volumes…): lightkube's own watch, through its HTTP stack and a dict of
the whole object, cost the extender more CPU than deciding (bench/cluster.py). A pod the model
cannot read goes to the cache as a dict, which says so. NRTs and Nodes change seldom: they are
watched through lightkube, as dicts.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
from collections.abc import AsyncIterable, AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
from lightkube import AsyncClient

from rdmaplane.adapters.kube import NodeDict, NodeResourceTopology, PodDict, async_client
from rdmaplane.adapters.kube.watchstream import watch_lines
from rdmaplane.core.decoding import DecodeError, Decoder
from rdmaplane.core.errors import RdmaplaneError
from rdmaplane.core.pod import Pod
from rdmaplane.services.scheduler.cache import ClusterCache

log = logging.getLogger("rdmaplane.services.scheduler.watch")

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


class WatchEnded(RdmaplaneError):
    """The API server ended a watch with an ERROR event (410 Gone: the version is too old)."""


class _Event(msgspec.Struct, frozen=True):
    type: str
    object: msgspec.Raw


_EVENT = msgspec.json.Decoder(_Event)
_POD = Decoder(Pod)


def read_pod_event(line: bytes) -> tuple[str, Pod | dict[str, Any]]:
    """One line of a pod watch: the event type and the pod, through the extender's model
    (a dict when the model cannot read it: the cache then counts the pod as unreadable)."""
    event = _EVENT.decode(line)
    if event.type == "ERROR":
        raise WatchEnded(f"watch ended by the API server: {bytes(event.object)[:500]!r}")
    try:
        return event.type, _POD.decode(event.object)
    except DecodeError:
        return event.type, msgspec.json.decode(event.object)


async def pod_events(
    client: AsyncClient, version: str
) -> AsyncIterator[tuple[str, Pod | dict[str, Any]]]:
    """Every pod's events from `version` on, forever (a watch the server ends is resumed at
    the last version seen), with lightkube's cluster and credentials."""
    while True:
        params = {"watch": "true", "resourceVersion": version}
        async for line in watch_lines(client.config, "/api/v1/pods", params):
            kind, pod = read_pod_event(line)
            if isinstance(pod, Pod):
                version = pod.metadata.resource_version or version
            yield kind, pod


def _events(kind: str, client: AsyncClient, version: str) -> AsyncIterator[tuple[str, Any]]:
    if kind == "pod":
        return pod_events(client, version)
    resource, selectors = _RESOURCES[kind]
    return _as_dicts(client.watch(resource, resource_version=version, **selectors))


async def _as_dicts(events: AsyncIterable[tuple[str, Any]]) -> AsyncIterator[tuple[str, Any]]:
    async for event, obj in events:
        yield event, as_dict(obj)


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
            async for event, obj in _events(kind, client, listing.resourceVersion):
                cache.apply(kind, event, obj)
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
