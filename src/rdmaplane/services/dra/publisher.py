"""Writes the node's ResourceSlices: what the driver offers now, a new pool generation per change.

Handed the devices and their taints whenever they change, it reads the slices the API server
holds for this node and driver (field selectors `spec.nodeName`, `spec.driver`), and writes only
when their content differs: every wanted slice created or replaced under the next generation,
slices no longer wanted deleted (a vanished device leaves with its slice's next version, a pool
with no devices has no slices). A taint keeps the `timeAdded` the server holds for it, so a
republish never restarts the tolerationSeconds of the pods using the device. Failed writes are
retried with the agent's backoff; a resync reads the server back now and then and fixes drift.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice

from rdmaplane.core.apitime import api_time
from rdmaplane.core.faults import Taint
from rdmaplane.core.settings.agent import PublishSettings
from rdmaplane.services.dra.policy.devices import DraDevice
from rdmaplane.services.dra.policy.slices import (
    generation_of,
    same_content,
    slice_objects,
    taint_object,
)

log = logging.getLogger("rdmaplane.services.dra")
TaintKey = tuple[str, str, str, str]  # device, key, value, effect


class SlicePublisher:
    def __init__(
        self,
        client: AsyncClient,
        driver: str,
        node: str,
        config: PublishSettings,
        *,
        binding: bool = False,
    ) -> None:
        self.client = client
        self.driver = driver
        self.node = node
        self.config = config
        self.binding = binding  # devices with binding conditions (slices.slice_objects)
        self._devices: list[DraDevice] | None = None
        self._taints: dict[str, tuple[Taint, ...]] = {}
        self._added: dict[TaintKey, str] = {}  # when each taint was first published
        self._node_uid: str | None = None
        self._wake = asyncio.Event()
        self.failures = 0
        self.generation = 0  # of the pool the server holds, as last seen
        self.in_sync = asyncio.Event()

    def set_devices(
        self, devices: Sequence[DraDevice], taints: Mapping[str, tuple[Taint, ...]]
    ) -> None:
        self._devices, self._taints = list(devices), dict(taints)
        self.in_sync.clear()
        self._wake.set()

    async def run(self) -> None:
        """Publish forever; returns only when cancelled."""
        delay = self.config.backoff_initial_s
        while True:
            if self.failures == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.config.resync_interval_s)
            self._wake.clear()
            try:
                await self.publish_once()
            except (ApiError, httpx2.HTTPError, OSError, TimeoutError) as e:
                self.in_sync.clear()
                self.failures += 1
                self._node_uid = None
                log.warning(
                    "publishing ResourceSlices failed (attempt %d): %s; retrying in %g s",
                    self.failures,
                    _describe(e),
                    delay,
                    extra={"node": self.node, "attempt": self.failures, "retry_in_s": delay},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.backoff_max_s)
                continue
            if self.failures:
                log.info("ResourceSlices published again after %d failures", self.failures)
            self.failures, delay = 0, self.config.backoff_initial_s
            self.in_sync.set()

    async def publish_once(self) -> bool:
        """Make the server hold the wanted slices; True if anything was written. Raises on the
        first failed request (the caller backs off)."""
        if self._devices is None:
            return False
        started = time.perf_counter()
        if self._node_uid is None:
            node = await self.client.get(Node, self.node)
            self._node_uid = node.metadata.uid if node.metadata else None
        stored = [
            s.to_dict()
            async for s in self.client.list(
                ResourceSlice, fields={"spec.nodeName": self.node, "spec.driver": self.driver}
            )
        ]
        if not stored and not self._devices:
            return False  # no devices, no pool: nothing to publish or remove
        held = generation_of(stored)
        taints = self._stamped(stored)
        wanted = self._slices(taints, held)
        complete = {int(s["spec"]["pool"]["generation"]) for s in stored} == {held}
        if complete and same_content(stored, wanted):
            self.generation = held
            return False
        wanted = self._slices(taints, held + 1)
        by_name = {s["metadata"]["name"]: s for s in stored}
        for body in wanted:
            old = by_name.pop(body["metadata"]["name"], None)
            if old is None:
                await self.client.create(cast(ResourceSlice, ResourceSlice.from_dict(body)))
            else:
                body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                await self.client.replace(cast(ResourceSlice, ResourceSlice.from_dict(body)))
        for name in by_name:
            try:
                await self.client.delete(ResourceSlice, name)
            except ApiError as e:
                if e.status.code != 404:  # gone already: what we wanted
                    raise
        self.generation = held + 1
        log.info(
            "published %d devices in %d ResourceSlices (pool generation %d, %.0f ms)",
            len(self._devices),
            len(wanted),
            self.generation,
            (time.perf_counter() - started) * 1000,
            extra={"node": self.node, "generation": self.generation},
        )
        return True

    def _slices(self, taints: Mapping[str, Any], generation: int) -> list[dict[str, Any]]:
        assert self._devices is not None
        return slice_objects(
            self.driver,
            self.node,
            self._devices,
            taints,
            generation,
            self._node_uid,
            binding=self.binding,
        )

    def _stamped(self, stored: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, str]]]:
        """Each wanted taint as it goes on the wire, with the timeAdded the server holds for
        the same taint of the same device, else the one we gave it first, else now."""
        held: dict[TaintKey, str] = {}
        for s in stored:
            for d in s.get("spec", {}).get("devices") or []:
                for t in d.get("taints") or []:
                    key = (d["name"], t.get("key"), t.get("value", ""), t.get("effect"))
                    if t.get("timeAdded"):
                        held[key] = str(t["timeAdded"])
        out: dict[str, list[dict[str, str]]] = {}
        added: dict[TaintKey, str] = {}
        for name, taints in self._taints.items():
            for taint in taints:
                key = (name, taint.key, taint.value, taint.effect)
                added[key] = held.get(key) or self._added.get(key) or api_time(time.time())
                out.setdefault(name, []).append(taint_object(taint, added[key]))
        self._added = added
        return out


def _describe(error: Exception) -> str:
    if isinstance(error, ApiError):
        return f"HTTP {error.status.code}: {error.status.message}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
