"""Writes the node's state to the API server: idempotent, retried with backoff, never blocking.

The agent hands over the whole desired state whenever something changed; the publisher writes
only what differs from its last successful write (node labels/annotation as one merge patch,
the `RDMAReady` condition on the status subresource, the NRT object), then the queued Events.
When a write fails it forgets what it wrote (the server may have lost or kept it), logs once per
backoff step and tries again; when the server answers again, everything is written afresh.

A fleet of agents acts in step (a job starts on a thousand nodes, every agent restarts with its
DaemonSet), so the timings are spread (bench/apiserver_load.py measured why). A change to the
NRT alone (pods starting and ending) waits a random delay up to `writeJitter`, and such updates
leave at most every `nrtMinInterval` (the scheduler extender counts pods bound meanwhile
itself); a change to labels, the condition or Events does not wait, and takes the NRT along.
The resync period varies by ±10 %; retries wait a random 50-100 % of the backoff step. A 429
from API Priority and Fairness is not a failure: nothing was written or lost, so the same write
is retried after the server's Retry-After (or the backoff step), without reading anything back.

When an NRT write frees devices (a pod ended), the publisher also stamps the Node
(`rdmaplane.io/devices-freed`, the time): kube-scheduler looks again at a pod the extender
refused only on a Pod or Node event, never on an NRT's, so without it a pod refused while the
old NRT still counted the ended pod would wait for kube-scheduler's 5-minute flush.

The NRT belongs to its Node (an owner reference: the garbage collector deletes it with the
Node). When another program writes the same NRT (NFD's topology-updater has the same name and
kind), the agent does not fight it: whenever it reads the object back and finds content owned
by another field manager, it stops writing the NRT, says so once (a warning, a Warning Event on
the Node, `rdmaplane_agent_nrt_written_by_others`), keeps publishing everything else, and
writes the NRT again only once no other writer owns it (e.g. it was deleted).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import httpx2  # lightkube's transport; its errors are what an unreachable server raises
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Event, Node
from lightkube.types import PatchType

from rdmaplane.adapters.kube import NodeResourceTopology
from rdmaplane.adapters.kube.client import FIELD_MANAGER
from rdmaplane.core import names, nrt
from rdmaplane.core.apitime import api_time
from rdmaplane.core.settings.agent import PublishSettings
from rdmaplane.services.agent.metrics import AgentMetrics
from rdmaplane.services.agent.policy.desired import CONDITION_TYPE, Condition

log = logging.getLogger("rdmaplane.services.agent.publisher")
COMPONENT = "rdmaplane-agent"
FREED_ANNOTATION = names.DEVICES_FREED_ANNOTATION  # when an NRT write last freed devices
MAX_AGGREGATED = 64  # distinct Events remembered for aggregation


@dataclass(frozen=True)
class Desired:
    labels: Mapping[str, str | None]
    annotations: Mapping[str, str]
    condition: Condition
    nrt: Mapping[str, Any]


@dataclass(frozen=True)
class PendingEvent:
    type: str  # Normal | Warning
    reason: str
    message: str
    at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))


@dataclass
class _Posted:
    """An Event we created, so a repeat within the window bumps its count instead."""

    name: str
    count: int
    last: dt.datetime


@dataclass
class _Written:
    """What the API server holds as far as we know; None = unknown, write it."""

    meta: tuple[tuple[str, str | None], ...] | None = None
    condition: Condition | None = None
    nrt: Mapping[str, Any] | None = None
    nrt_version: str | None = None


class Publisher:
    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        config: PublishSettings,
        metrics: AgentMetrics,
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.config = config
        self.metrics = metrics
        self._desired: Desired | None = None
        self._written = _Written()
        self._events: deque[PendingEvent] = deque(maxlen=config.max_pending_events)
        self._posted: OrderedDict[tuple[str, str, str], _Posted] = OrderedDict()
        self._wake = asyncio.Event()
        self._node_uid: str | None = None
        # The condition as the node holds it: status and since when (kept across our restarts).
        self._status: bool | None = None
        self._since: str | None = None
        self.failures = 0  # consecutive failed cycles
        self.throttled = 0  # consecutive cycles turned away with 429
        self.cycles = 0  # cycles that wrote something
        self.in_sync = asyncio.Event()  # set while the server holds the desired state
        self._random = random.Random()
        self._nrt_at = -float("inf")  # when the NRT was last written (monotonic)
        self._nrt_due: float | None = None  # an NRT update held back until then
        self._nrt_writers: list[str] = []  # others writing the NRT: it is left to them
        self._freed_due = False  # an NRT write freed devices: the Node is to say so

    def set_desired(self, desired: Desired) -> None:
        self._desired = desired
        self.in_sync.clear()
        self._wake.set()

    def record_event(self, type_: str, reason: str, message: str) -> None:
        self._events.append(PendingEvent(type_, reason, message))
        self._wake.set()

    async def run(self) -> None:
        """Publish forever; returns only when cancelled."""
        delay = self.config.backoff_initial_s
        resync_at = time.monotonic() + self._resync_period()
        while True:
            if self.failures == 0 and self.throttled == 0:
                await self._until_due(resync_at)
            self._wake.clear()
            if time.monotonic() >= resync_at:
                self._node_uid = None  # read back what the server holds, fix what drifted
                resync_at = time.monotonic() + self._resync_period()
            try:
                await self.publish_once()
            except (ApiError, httpx2.HTTPError, OSError, TimeoutError) as e:
                wait = self._random.uniform(delay / 2, delay)
                retry_after = _retry_after(e)
                if retry_after is None:
                    self._failed(e, wait)
                else:
                    wait = max(wait, retry_after)
                    self._throttled(wait)
                await asyncio.sleep(wait)
                delay = min(delay * 2, self.config.backoff_max_s)
                continue
            if self.failures:
                log.info(
                    "API server reachable again after %d failed attempts; state republished",
                    self.failures,
                    extra={"node": self.node_name},
                )
            self.failures = self.throttled = 0
            delay = self.config.backoff_initial_s
            self.metrics.api_reachable.set(1)
            if self._nrt_due is None:
                self.in_sync.set()

    def _resync_period(self) -> float:
        return self.config.resync_interval_s * self._random.uniform(0.9, 1.1)

    async def _until_due(self, resync_at: float) -> None:
        """Wait for a change, the resync or a held-back NRT update; a change to the NRT alone
        then waits a random part of `writeJitter` (more changes meanwhile join it, and one
        that is not to the NRT alone ends the wait)."""
        due = min(resync_at, self._nrt_due if self._nrt_due is not None else resync_at)
        if not await self._woken(due) or not self._nrt_only():
            return
        jitter = self._random.uniform(0, self.config.write_jitter_s)
        log.debug("NRT-only change: written in %.1f s", jitter)
        until = time.monotonic() + jitter
        while self._nrt_only() and await self._woken(until):
            pass

    async def _woken(self, until: float) -> bool:
        """Wait for a change until `until` (monotonic); whether one came."""
        try:
            await asyncio.wait_for(self._wake.wait(), max(0.0, until - time.monotonic()))
        except TimeoutError:
            return False
        self._wake.clear()
        return True

    def _nrt_only(self) -> bool:
        desired = self._desired
        return (
            desired is not None
            and not self._events
            and _meta(desired) == self._written.meta
            and desired.condition == self._written.condition
            and self._nrt_pending(desired)
        )

    def _nrt_pending(self, desired: Desired) -> bool:
        """The NRT differs from what we wrote, and it is ours to write."""
        return desired.nrt != self._written.nrt and not self._nrt_writers

    def _throttled(self, wait: float) -> None:
        """A 429: the server is there and wrote nothing; the same write goes again later."""
        self.in_sync.clear()
        self.throttled += 1
        self.metrics.publish_errors.inc()
        log.info(
            "the API server asked to slow down (429, attempt %d); retrying in %.1f s",
            self.throttled,
            wait,
            extra={"node": self.node_name, "attempt": self.throttled, "retry_in_s": wait},
        )

    def _failed(self, error: Exception, delay: float) -> None:
        self.in_sync.clear()
        self.failures += 1
        self._written = _Written()
        self._node_uid = None
        self.metrics.publish_errors.inc()
        self.metrics.api_reachable.set(0)
        log.warning(
            "publishing to the API server failed (attempt %d): %s; retrying in %.1f s",
            self.failures,
            _describe(error),
            delay,
            extra={"node": self.node_name, "attempt": self.failures, "retry_in_s": delay},
        )

    async def publish_once(self) -> bool:
        """Write whatever differs from the last successful write; True if anything was written.
        Raises on the first failed request (the caller backs off)."""
        desired = self._desired
        if desired is None:
            return False
        started = time.perf_counter()
        wrote = False
        if self._node_uid is None:
            await self._read_back(desired)
        meta = _meta(desired)
        if meta != self._written.meta:
            await self._patch_meta(desired)
            self._written.meta = meta
            wrote = True
        if desired.condition != self._written.condition:
            await self._patch_condition(desired.condition)
            self._written.condition = desired.condition
            wrote = True
        self._nrt_due = None
        if self._nrt_pending(desired):
            due = self._nrt_at + self.config.nrt_min_interval_s
            alone = not wrote and not self._events and self._written.nrt is not None
            if alone and time.monotonic() < due:
                self._nrt_due = due  # the loop comes back for it
                log.debug("NRT update held back %.1f s", due - time.monotonic())
            else:
                before = self._written.nrt
                await self._write_nrt(desired.nrt)
                wrote = True
                if before is not None and self._written.nrt is desired.nrt:
                    self._freed_due |= nrt.frees(
                        nrt.from_object(before), nrt.from_object(desired.nrt)
                    )
        if self._freed_due:
            await self._patch_freed()
            wrote = True
        while self._events:
            await self._post_event(self._events[0])
            self._events.popleft()
            wrote = True
        if wrote:
            self.cycles += 1
            self.metrics.publish_seconds.observe(time.perf_counter() - started)
        return wrote

    async def _read_back(self, desired: Desired) -> None:
        """What the server holds (at start, after an outage, at each resync): the node's UID and
        condition, and whatever already equals the desired state, which is then not rewritten
        (a restarted agent on an unchanged node writes nothing)."""
        self._written = _Written()
        node = await self.client.get(Node, self.node_name)
        meta = node.metadata
        self._node_uid = meta.uid if meta else None
        labels, annotations = (meta.labels or {}, meta.annotations or {}) if meta else ({}, {})
        if all(labels.get(k) == v for k, v in desired.labels.items()) and all(
            annotations.get(k) == v for k, v in desired.annotations.items()
        ):
            self._written.meta = tuple(sorted({**desired.labels, **desired.annotations}.items()))
        conditions = (node.status.conditions if node.status else None) or []
        current = next((c for c in conditions if c.type == CONDITION_TYPE), None)
        if current is not None:
            self._status = current.status == "True"
            since = current.lastTransitionTime
            self._since = api_time(since) if isinstance(since, dt.datetime) else since
            held = Condition(self._status, current.reason or "", current.message or "")
            if held == desired.condition:
                self._written.condition = held
        try:
            found = await self.client.get(NodeResourceTopology, self.node_name)
            stored: dict[str, Any] = found.to_dict()  # type: ignore[no-untyped-call]
        except ApiError as e:
            if e.status.code != 404:
                raise
            self._hold_nrt([])  # none: whoever wrote it, it is ours to create
            return
        self._written.nrt_version = _version_of(stored)
        if self._hold_nrt(nrt.other_writers(stored, FIELD_MANAGER)):
            return
        owners = (stored.get("metadata") or {}).get("ownerReferences") or []
        owned = any(o.get("uid") == self._node_uid for o in owners)
        if owned and all(stored.get(k) == desired.nrt.get(k) for k in ("attributes", "zones")):
            self._written.nrt = desired.nrt

    def _hold_nrt(self, writers: list[str]) -> bool:
        """Leave the NRT to `writers` (other field managers owning its content) while there
        are any; say so when that changes. Whether it is left to them."""
        if writers != self._nrt_writers:
            who = ", ".join(writers)
            if writers:
                message = (
                    f"NodeResourceTopology {self.node_name} is also written by {who}; "
                    "the agent leaves it to them (run one writer: docs/agent.md)"
                )
                log.warning(message, extra={"node": self.node_name})
                self._events.append(PendingEvent("Warning", "NRTWrittenByOthers", message))
            else:
                log.info(
                    "NodeResourceTopology %s: no other writer left; the agent writes it again",
                    self.node_name,
                    extra={"node": self.node_name},
                )
            self.metrics.nrt_written_by_others.set(1 if writers else 0)
            self._nrt_writers = writers
        return bool(writers)

    async def _patch_meta(self, desired: Desired) -> None:
        patch = {
            "metadata": {"labels": dict(desired.labels), "annotations": dict(desired.annotations)}
        }
        await self.client.patch(Node, self.node_name, patch, patch_type=PatchType.MERGE)
        self.metrics.writes.labels("node").inc()

    async def _patch_freed(self) -> None:
        """Stamp the Node: devices came free (`FREED_ANNOTATION`), which kube-scheduler sees."""
        stamp = {FREED_ANNOTATION: api_time(dt.datetime.now(dt.UTC))}
        patch = {"metadata": {"annotations": stamp}}
        await self.client.patch(Node, self.node_name, patch, patch_type=PatchType.MERGE)
        self.metrics.writes.labels("freed").inc()
        self._freed_due = False

    async def _patch_condition(self, condition: Condition) -> None:
        now = dt.datetime.now(dt.UTC)
        flipped = self._status is not None and self._status != condition.status
        since = api_time(now) if flipped or self._since is None else self._since
        patch = {
            "status": {
                "conditions": [
                    {
                        "type": CONDITION_TYPE,
                        "status": "True" if condition.status else "False",
                        "reason": condition.reason,
                        "message": condition.message,
                        "lastHeartbeatTime": api_time(now),
                        "lastTransitionTime": since,
                    }
                ]
            }
        }
        await self.client.patch(Node.Status, self.node_name, patch, patch_type=PatchType.STRATEGIC)
        self.metrics.writes.labels("condition").inc()
        if flipped or (self._status is None and not condition.status):
            self._events.append(
                PendingEvent(
                    "Normal" if condition.status else "Warning",
                    "RDMAReady" if condition.status else "RDMANotReady",
                    f"{CONDITION_TYPE} is {'True' if condition.status else 'False'}: "
                    f"{condition.reason}: {condition.message}",
                )
            )
        self._status, self._since = condition.status, since

    async def _write_nrt(self, obj: Mapping[str, Any]) -> None:
        body = {**obj, "metadata": {**obj["metadata"], "ownerReferences": self._owner()}}
        if self._written.nrt_version is None:
            try:
                created = await self.client.create(NodeResourceTopology.from_dict(body))
            except ApiError as e:
                if e.status.code != 409:
                    raise
                current = await self.client.get(NodeResourceTopology, self.node_name)
                self._written.nrt_version = _version(current)
                stored: dict[str, Any] = current.to_dict()  # type: ignore[no-untyped-call]
                if self._hold_nrt(nrt.other_writers(stored, FIELD_MANAGER)):
                    return
            else:
                self._remember_nrt(obj, created)
                return
        body["metadata"] = {**body["metadata"], "resourceVersion": self._written.nrt_version}
        # A 404/409 here (deleted or changed under us) fails the cycle, which forgets the version:
        # the retry creates the object or reads the current version first.
        replaced = await self.client.replace(NodeResourceTopology.from_dict(body))
        self._remember_nrt(obj, replaced)

    def _owner(self) -> list[dict[str, str]]:
        """The NRT's owner: its Node (known once read back), so it goes when the Node goes."""
        if self._node_uid is None:
            return []
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": self._node_uid}]

    def _remember_nrt(self, obj: Mapping[str, Any], stored: Any) -> None:
        self._written.nrt = obj
        self._written.nrt_version = _version(stored)
        self._nrt_at = time.monotonic()
        self.metrics.writes.labels("nrt").inc()

    async def _post_event(self, event: PendingEvent) -> None:
        """Create the Event, or, when the same one was posted within `event_aggregate_s`, bump
        its count (as client-go's correlator does): a flapping port yields two Events with
        rising counts, not a flood."""
        key = (event.type, event.reason, event.message[:1024])
        posted = self._posted.get(key)
        window = dt.timedelta(seconds=self.config.event_aggregate_s)
        if posted is not None and event.at - posted.last < window:
            patch = {"count": posted.count + 1, "lastTimestamp": api_time(event.at)}
            try:
                await self.client.patch(
                    Event,
                    posted.name,
                    patch,
                    namespace=self.config.event_namespace,
                    patch_type=PatchType.MERGE,
                )
            except ApiError as e:
                if e.status.code != 404:  # expired (events have a TTL) or deleted: create anew
                    raise
            else:
                posted.count, posted.last = posted.count + 1, event.at
                self._posted.move_to_end(key)
                self.metrics.writes.labels("event").inc()
                return
        created = await self.client.create(cast(Event, Event.from_dict(self._event_body(event))))
        self.metrics.writes.labels("event").inc()
        if created.metadata is not None and created.metadata.name:
            self._posted[key] = _Posted(created.metadata.name, 1, event.at)
            self._posted.move_to_end(key)
            while len(self._posted) > MAX_AGGREGATED:
                self._posted.popitem(last=False)

    def _event_body(self, event: PendingEvent) -> dict[str, Any]:
        at = api_time(event.at)
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{self.node_name}.",
                "namespace": self.config.event_namespace,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node_name,
                "uid": self._node_uid,
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": COMPONENT, "host": self.node_name},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node_name,
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
        }


def _meta(desired: Desired) -> tuple[tuple[str, str | None], ...]:
    """Labels and annotations as the publisher compares them."""
    return tuple(sorted({**desired.labels, **desired.annotations}.items()))


def _retry_after(error: Exception) -> float | None:
    """For a 429 (API Priority and Fairness turning the request away), the seconds the server
    asks us to wait (0 when it does not say); None for any other error."""
    response = (
        getattr(error, "response", None) if isinstance(error, httpx2.HTTPStatusError) else None
    )
    if response is None or response.status_code != 429:
        return None
    value = response.headers.get("Retry-After", "")
    return float(value) if value.isdigit() else 0.0


def _version(obj: Any) -> str | None:
    meta = getattr(obj, "metadata", None)
    return meta.resourceVersion if meta is not None else None


def _version_of(obj: Mapping[str, Any]) -> str | None:
    version = obj.get("metadata", {}).get("resourceVersion")
    return version if isinstance(version, str) else None


def _describe(error: Exception) -> str:
    if isinstance(error, ApiError):
        return f"HTTP {error.status.code}: {error.status.message}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
