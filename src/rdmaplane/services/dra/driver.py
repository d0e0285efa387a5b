"""The DRA driver as the node agent embeds it: fed topologies and port faults, it keeps the
node's ResourceSlices current and prepares the claims the kubelet hands it.

Prepare, per batch: claims already prepared are answered from the checkpoint (their CDI spec
written again only if it went missing); the others are read from the API server (concurrently,
outside the lock), resolved (`claims.prepare`), saved as `started`, their specs written, then
saved as `prepared`. Every failure stays with its claim. Unprepare removes the spec and the
entry; a claim the driver never saw is unprepared already.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.resources.resource_v1 import ResourceClaim

from rdmaplane.adapters.config import parse
from rdmaplane.adapters.config.dra import RDMA_DEVICE_CONFIG
from rdmaplane.adapters.discovery.devnodes import device_nodes
from rdmaplane.adapters.supervisor import Supervisor
from rdmaplane.core import paths
from rdmaplane.core.faults import Fault, Taint
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.nccl import NcclSettings
from rdmaplane.core.nrt import Uplink
from rdmaplane.core.porthealth import FaultClass, PortKey
from rdmaplane.core.selectors import natural_key
from rdmaplane.core.settings import deviceplugin as plugin_settings
from rdmaplane.core.settings.agent import AgentSettings
from rdmaplane.core.settings.dra import DraSharing
from rdmaplane.core.usability import Unusable
from rdmaplane.services.dra import files
from rdmaplane.services.dra.checkpoint import PREPARED, STARTED, DraCheckpoint, PreparedEntry
from rdmaplane.services.dra.claimstatus import ClaimStatusWriter
from rdmaplane.services.dra.grpc import DeviceHealth, HealthFeed, KubeletPlugin, Outcome
from rdmaplane.services.dra.policy.claims import (
    ClaimError,
    ClaimRef,
    PreparedClaim,
    prepare,
    spec_name,
)
from rdmaplane.services.dra.policy.devices import DraDevice, DraPool, offer, unusable
from rdmaplane.services.dra.policy.readiness import Readiness, readiness
from rdmaplane.services.dra.policy.slices import device_taints
from rdmaplane.services.dra.publisher import SlicePublisher

log = logging.getLogger("rdmaplane.services.dra")


def pools_of(configs: Sequence[plugin_settings.Pool], sharing: DraSharing) -> list[DraPool]:
    """The device plugin's pools, as the DRA driver offers them (the same ports, same plan);
    a shared pool's ports go to several claims, each taking a share of the port's rate."""
    return [
        DraPool(p.resource_name, p.selectors, p.nccl, sharing if p.shared else None)
        for p in configs
    ]


def read_device_config(parameters: object, where: str) -> NcclSettings | None:
    """An `RdmaDeviceConfig` from a claim's opaque parameters; ConfigError names `where`."""
    return parse(parameters, RDMA_DEVICE_CONFIG, where).nccl


class DraDriver:
    def __init__(
        self,
        config: AgentSettings,
        pools: Sequence[plugin_settings.Pool],
        kube: AsyncClient | None,
    ) -> None:
        dra = config.dra
        self.driver = dra.driver_name
        self.node = config.node_name
        self.pools = pools_of(pools, dra.sharing)
        self.settings = {p.name: p.settings for p in self.pools}
        self.effects = {
            FaultClass.FATAL: None if dra.taints.fatal == "off" else dra.taints.fatal,
            FaultClass.DEGRADED: None if dra.taints.degraded == "off" else dra.taints.degraded,
        }
        self.cdi_dir = dra.cdi_dir
        self.dev_root = str(config.dev_root)
        self.devices_dir = config.dev_root / "infiniband"
        self.checkpoint = DraCheckpoint(config.dra_plugin_dir / "checkpoint.json")
        self.kube = kube
        self.health = HealthFeed(self.node, dra.health.timeout_s, dra.health.resend_s)
        self.plugin = KubeletPlugin(
            self.driver,
            self,
            plugin_dir=config.dra_plugin_dir,
            registry_dir=config.kubelet_dir / paths.PLUGINS_REGISTRY,
            health=self.health,
        )
        binding = dra.binding_conditions
        self.publisher = (
            SlicePublisher(kube, self.driver, self.node, config.publish, binding=binding)
            if kube
            else None
        )
        self.claim_status = (
            ClaimStatusWriter(kube, self.driver, self.node, config.publish)
            if kube and binding
            else None
        )
        self.topo = NodeTopology()
        self.devices: dict[str, DraDevice] = {}  # as handed over (`_sync`)
        self._offered: dict[str, DraDevice] = {}  # as the last `offer` made them
        self.taints: dict[str, tuple[Taint, ...]] = {}
        self.verdicts: dict[str, Readiness] = {}
        self._faults: dict[PortKey, Fault] = {}
        self._reported: dict[PortKey, str] = {}  # port → why the agent's health rules refuse it
        self._nodes: frozenset[str] = frozenset()  # what <dev_root>/infiniband holds
        self.stats: Counter[str] = Counter()  # prepared, cached, failed, unprepared
        self._lock = asyncio.Lock()

    # ---------------------------------------------------------------- what the node offers

    def update(
        self,
        topo: NodeTopology,
        faults: Mapping[PortKey, Fault],
        uplinks: Iterable[Uplink] = (),
        reported: Mapping[PortKey, str] | None = None,
    ) -> None:
        """Take a new topology and the faults of its ports (`offer`, then `taint`)."""
        self.offer(topo, uplinks)
        self.taint(faults, reported)

    def offer(self, topo: NodeTopology, uplinks: Iterable[Uplink] = ()) -> None:
        """Make the devices of a topology's ports, to be judged with the device nodes as they
        are now (the agent calls it every poll: a driver loaded late is seen) and handed over
        by the `taint` that follows (the agent's poll has the faults only after the health
        rules, which read `hcas` first): so one poll judges and hands over once."""
        self.topo = topo
        self._nodes = device_nodes(self.dev_root)
        self._offered = offer(topo, self.pools, uplinks, self._offered)

    def taint(
        self, faults: Mapping[PortKey, Fault], reported: Mapping[PortKey, str] | None = None
    ) -> None:
        """Taint the devices of faulty ports as configured, and those of ports the agent's
        health rules call unhealthy (`reported`: port → why) as ones that cannot be handed out;
        untaint recovered ones."""
        self._faults = dict(faults)
        self._reported = dict(reported or {})
        self._sync(self._offered)

    def _sync(self, devices: dict[str, DraDevice]) -> None:
        """Republish when the devices or their taints differ from what was handed over; tell
        the claims (binding conditions) and the kubelet (health) what each device is now."""
        found = unusable(self.topo, devices, self.pools, self._nodes, self.dev_root, self._reported)
        taints = device_taints(devices, self._faults, self.effects, found)
        self._judge(readiness(self.topo, devices, found, self._faults))
        if devices == self.devices and taints == self.taints:
            return
        self._log_changes(devices, taints, found)
        self.devices, self.taints = devices, taints
        if self.publisher is not None:
            self.publisher.set_devices(list(devices.values()), taints)

    def _judge(self, verdicts: dict[str, Readiness]) -> None:
        self.verdicts = verdicts
        if self.claim_status is not None:
            self.claim_status.set_verdicts(verdicts)
        self.health.publish(
            [
                DeviceHealth(name, v.healthy, "" if v.healthy else f"{v.reason}: {v.message}")
                for name, v in sorted(verdicts.items())
            ]
        )

    def _log_changes(
        self,
        devices: Mapping[str, DraDevice],
        taints: Mapping[str, tuple[Taint, ...]],
        found: Mapping[str, Unusable],
    ) -> None:
        gone = sorted(set(self.devices) - set(devices))
        new = sorted(set(devices) - set(self.devices))
        if new:
            log.info("offering %s", ", ".join(f"{n} ({_port(devices[n])})" for n in new))
        if gone:
            log.warning("no longer offering %s (gone from the node)", ", ".join(gone))
        for name in sorted(set(taints) | set(self.taints)):
            before, after = self.taints.get(name, ()), taints.get(name, ())
            for t in after:
                if t not in before:
                    problem = found.get(name)
                    why = f" ({problem})" if problem and t.value == problem.reason else ""
                    log.warning("%s: tainted %s=%s:%s%s", name, t.key, t.value, t.effect, why)
            for t in before:
                if t not in after:
                    log.info("%s: taint %s=%s:%s removed", name, t.key, t.value, t.effect)

    def hcas(self) -> list[str]:
        """The HCAs offered to claims (as the last `offer` made them)."""
        return sorted({d.hca for d in self._offered.values()}, key=natural_key)

    # ---------------------------------------------------------------- lifecycle

    async def start(self, supervisor: Supervisor) -> None:
        """Read the checkpoint, clear what a crash left, serve the kubelet; the sockets' watch
        and the slice publisher run under `supervisor` (the agent's)."""
        self.checkpoint.load()
        for folder in (self.cdi_dir, self.checkpoint.path.parent):
            for left in files.leftovers(folder):
                files.remove(left)
                log.info("removed %s, left by an interrupted write", left)
        await self.plugin.start(supervisor)
        if self.publisher is not None:
            supervisor.spawn("dra slices", self.publisher.run)
        if self.claim_status is not None:
            supervisor.spawn("dra claim status", self.claim_status.run)

    async def stop(self) -> None:
        await self.plugin.stop()

    # ---------------------------------------------------------------- the kubelet's calls

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Outcome]:
        out: dict[str, Outcome] = {}
        todo = []
        for ref in claims:
            entry = self.checkpoint.entries.get(ref.uid)
            if entry is not None and entry.state == PREPARED:
                out[ref.uid] = await self._cached(entry)
            else:
                todo.append(ref)
        fetched = await asyncio.gather(*(self._read_claim(ref) for ref in todo))
        async with self._lock:
            resolved: list[PreparedClaim] = []
            for ref, claim in zip(todo, fetched, strict=True):
                entry = self.checkpoint.entries.get(ref.uid)
                if entry is not None and entry.state == PREPARED:  # a concurrent call did it
                    out[ref.uid] = await self._cached(entry)
                    continue
                try:
                    if isinstance(claim, str):
                        raise ClaimError(claim)
                    resolved.append(self._resolve(claim, ref))
                except ClaimError as e:
                    out[ref.uid] = self._failed(ref, str(e))
            out.update(await asyncio.to_thread(self._write, resolved))
        return out

    def _resolve(self, claim: Mapping[str, Any], ref: ClaimRef) -> PreparedClaim:
        return prepare(
            claim,
            ref,
            driver=self.driver,
            pool=self.node,
            devices=self.devices,
            topo=self.topo,
            pool_settings=self.settings,
            read_config=read_device_config,
            present=lambda name: os.path.exists(self.devices_dir / name),
        )

    def _write(self, resolved: Sequence[PreparedClaim]) -> dict[str, Outcome]:
        """Checkpoint as started, write the specs, checkpoint as prepared (see `checkpoint`)."""
        out: dict[str, Outcome] = {}
        if not resolved:
            return out
        for claim in resolved:
            self.checkpoint.entries[claim.ref.uid] = PreparedEntry(STARTED, claim)
        try:
            self.checkpoint.save()
        except OSError as e:
            for claim in resolved:
                del self.checkpoint.entries[claim.ref.uid]
                out[claim.ref.uid] = self._failed(claim.ref, f"cannot save the checkpoint: {e}")
            return out
        done = []
        for claim in resolved:
            try:
                self._write_spec(claim)
            except OSError as e:
                out[claim.ref.uid] = self._failed(claim.ref, f"cannot write its CDI spec: {e}")
                continue
            self.checkpoint.entries[claim.ref.uid] = PreparedEntry(PREPARED, claim)
            out[claim.ref.uid] = Outcome(claim.devices)
            done.append(claim)
        try:
            self.checkpoint.save()
        except OSError as e:  # the specs are there; the next call finds them `started`
            log.error("cannot save the checkpoint %s: %s", self.checkpoint.path, e)
            return out
        for claim in done:  # logged once recorded: a claim is prepared once
            self.stats["prepared"] += 1
            log.info(
                "prepared claim %s (%s): %s",
                claim.ref,
                claim.ref.uid,
                ", ".join(d.device for d in claim.devices) or "no device of this driver",
                extra={"claim": str(claim.ref), "uid": claim.ref.uid},
            )
        return out

    def _write_spec(self, claim: PreparedClaim) -> None:
        if claim.spec is not None:
            files.write_json(self.cdi_dir / f"{claim.spec_name}.json", claim.spec)

    async def _cached(self, entry: PreparedEntry) -> Outcome:
        claim = entry.claim
        self.stats["cached"] += 1
        log.debug("claim %s: prepared already (checkpoint)", claim.ref)
        if claim.spec is not None and not (self.cdi_dir / f"{claim.spec_name}.json").exists():
            try:
                await asyncio.to_thread(self._write_spec, claim)
            except OSError as e:
                return self._failed(claim.ref, f"cannot write its CDI spec again: {e}")
            log.warning("claim %s: its CDI spec had gone; written again", claim.ref)
        return Outcome(claim.devices)

    async def _read_claim(self, ref: ClaimRef) -> Mapping[str, Any] | str:
        """The claim as the API server holds it, or why it cannot be had."""
        if self.kube is None:
            return f"claim {ref}: no API server to read it from"
        try:
            found = await self.kube.get(ResourceClaim, ref.name, namespace=ref.namespace)
        except ApiError as e:
            if e.status.code == 404:
                return f"claim {ref}: not found"
            return f"claim {ref}: reading it failed: HTTP {e.status.code}: {e.status.message}"
        except (httpx2.HTTPError, OSError) as e:
            return f"claim {ref}: the API server cannot be reached: {type(e).__name__}: {e}"
        claim: dict[str, Any] = found.to_dict()
        return claim

    def _failed(self, ref: ClaimRef, error: str) -> Outcome:
        self.stats["failed"] += 1
        message = error if error.startswith(f"claim {ref}") else f"claim {ref}: {error}"
        log.warning(message, extra={"claim": str(ref), "uid": ref.uid})
        return Outcome(error=message)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        async with self._lock:
            return await asyncio.to_thread(self._unprepare, claims)

    def _unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        for ref in claims:
            entry = self.checkpoint.entries.get(ref.uid)
            name = entry.claim.spec_name if entry is not None else spec_name(self.driver, ref.uid)
            try:
                files.remove(self.cdi_dir / f"{name}.json")
            except OSError as e:
                out[ref.uid] = f"claim {ref}: cannot remove its CDI spec: {e}"
                continue
            self.checkpoint.entries.pop(ref.uid, None)
            out[ref.uid] = ""
            if entry is not None:
                self.stats["unprepared"] += 1
                log.info("unprepared claim %s (%s)", ref, ref.uid)
        try:
            self.checkpoint.save()
        except OSError as e:
            unsaved = f"cannot save the checkpoint: {e}"
            return {uid: error or unsaved for uid, error in out.items()}
        return out


def _port(device: DraDevice) -> str:
    return f"{device.hca} port {device.port}"
