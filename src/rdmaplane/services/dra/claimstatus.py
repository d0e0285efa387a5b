"""Sets the binding conditions of this node's devices in the ResourceClaims that hold them.

It watches ResourceClaims in every namespace (RBAC cannot narrow a watch to one node's
claims, and no field selector names the allocation; the claims of other nodes are dropped as
they arrive and not kept), keeps the ones allocated from this node's pool with devices that
carry binding conditions, and writes each such claim's `status.devices` (`readiness.
binding_status`) whenever the claim or the verdicts change. A write is a merge patch of the
status subresource carrying the claim's resourceVersion: a conflict means a newer claim is on
its way through the watch, which is judged again. Failed requests back off as the slice
publisher does; a broken watch is listed again.

The API server authorizes such a write per driver (`resourceclaims/driver`, the claim's
driver as its name): with a ServiceAccount token bound to the driver's pod the verb is
`associated-node:patch`, valid only for claims allocated to that pod's node
(deploy/dra/rbac.yaml grants only that).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.resources.resource_v1 import ResourceClaimStatus
from lightkube.types import PatchType

from rdmaplane.adapters.kube import ClaimDict
from rdmaplane.core.apitime import api_time
from rdmaplane.core.settings.agent import PublishSettings
from rdmaplane.services.dra.policy.readiness import Readiness, binding_status, waiting_results

log = logging.getLogger("rdmaplane.services.dra")
ClaimKey = tuple[str, str]  # namespace, name


class ClaimStatusWriter:
    def __init__(
        self,
        client: AsyncClient,
        driver: str,
        pool: str,
        config: PublishSettings,
    ) -> None:
        self.client = client
        self.driver = driver
        self.pool = pool
        self.config = config
        self.verdicts: dict[str, Readiness] = {}
        self.claims: dict[ClaimKey, Mapping[str, Any]] = {}
        self._dirty: set[ClaimKey] = set()
        self._wake = asyncio.Event()
        self.writes = 0
        self.failures = 0

    def set_verdicts(self, verdicts: Mapping[str, Readiness]) -> None:
        """New verdicts: every kept claim is judged again."""
        if dict(verdicts) == self.verdicts:
            return
        self.verdicts = dict(verdicts)
        self._dirty |= set(self.claims)
        self._wake.set()

    def observe(self, event: str, claim: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) or a listed claim (ADDED)."""
        key = _key_of(claim)
        if event == "DELETED" or not waiting_results(claim, self.driver, self.pool):
            self.claims.pop(key, None)
            self._dirty.discard(key)
            return
        self.claims[key] = claim
        self._dirty.add(key)
        self._wake.set()

    async def flush(self) -> int:
        """Write every claim whose conditions are not what the verdicts say; the number
        written. A request that fails leaves the claim to be written again and raises."""
        written = 0
        while self._dirty:
            key = self._dirty.pop()
            claim = self.claims.get(key)
            if claim is None:
                continue
            devices = binding_status(
                claim,
                driver=self.driver,
                pool=self.pool,
                verdicts=self.verdicts,
                now=api_time(time.time()),
            )
            if devices is None:
                continue
            try:
                await self._patch(claim, devices)
            except ApiError as e:
                if e.status.code in (404, 409):  # deleted, or a newer one is on its way
                    continue
                self._dirty.add(key)
                raise
            except BaseException:
                self._dirty.add(key)
                raise
            written += 1
        return written

    async def _patch(self, claim: Mapping[str, Any], devices: list[dict[str, Any]]) -> None:
        meta = claim["metadata"]
        body = {
            "metadata": {"resourceVersion": meta["resourceVersion"]},
            "status": {"devices": devices},
        }
        await self.client.patch(
            ResourceClaimStatus,
            meta["name"],
            body,
            namespace=meta["namespace"],
            patch_type=PatchType.MERGE,
        )
        self.writes += 1
        for d in devices:
            if d.get("driver") == self.driver:
                said = ", ".join(
                    f"{c['type']}={c['status']} ({c['reason']})" for c in d.get("conditions", [])
                )
                log.info(
                    "claim %s/%s: %s: %s", meta["namespace"], meta["name"], d["device"], said,
                    extra={"claim": f"{meta['namespace']}/{meta['name']}"},
                )  # fmt: skip

    async def run(self) -> None:
        """List, then watch from the list's version, and write as claims and verdicts change;
        forever (returns only when cancelled)."""
        writes = asyncio.create_task(self._writes())
        try:
            await self._watch()
        finally:
            writes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writes

    async def _watch(self) -> None:
        delay = self.config.backoff_initial_s
        while True:
            try:
                listing = self.client.list(ClaimDict, namespace="*")
                seen = set()
                async for claim in listing:
                    self.observe("ADDED", claim)
                    seen.add(_key_of(claim))
                for key in set(self.claims) - seen:  # deleted while the watch was down
                    self.observe("DELETED", self.claims[key])
                async for event, claim in self.client.watch(
                    ClaimDict, namespace="*", resource_version=listing.resourceVersion
                ):
                    self.observe(event, claim)
                    delay = self.config.backoff_initial_s
            except (ApiError, httpx2.HTTPError, OSError, TimeoutError) as e:
                log.warning(
                    "watching ResourceClaims: %s; listing again in %g s", _describe(e), delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.backoff_max_s)

    async def _writes(self) -> None:
        delay = self.config.backoff_initial_s
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
            except (ApiError, httpx2.HTTPError, OSError, TimeoutError) as e:
                self.failures += 1
                log.warning(
                    "writing ResourceClaim status failed (attempt %d): %s; retrying in %g s",
                    self.failures, _describe(e), delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.backoff_max_s)
                self._wake.set()
                continue
            self.failures, delay = 0, self.config.backoff_initial_s


def _key_of(claim: Mapping[str, Any]) -> ClaimKey:
    meta = claim.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def _describe(error: Exception) -> str:
    if isinstance(error, ApiError):
        return f"HTTP {error.status.code}: {error.status.message}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
