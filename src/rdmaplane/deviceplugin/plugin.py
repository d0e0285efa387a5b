"""The device plugin as a whole: one pool server per configured pool, fed with topologies.

`RdmaDevicePlugin` takes its `NodeTopology` from outside (`update(topo)`), so the node agent's
single discovery loop can feed it; `run_standalone` is the small loop of its own that
`rdmaplane device-plugin` uses, reading sysfs every `healthPollInterval`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import multiprocessing
import os
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rdmaplane.config import DevicePluginConfig, PoolConfig
from rdmaplane.deviceplugin.resources import ResourceManager
from rdmaplane.deviceplugin.server import PoolServer
from rdmaplane.discovery import read_node
from rdmaplane.discovery.probe import Probe, settle
from rdmaplane.model import NodeTopology
from rdmaplane.selectors import natural_key

log = logging.getLogger("rdmaplane.deviceplugin")


def cdi_kind(pool: PoolConfig) -> str:
    """CDI kinds are `vendor/class`; classes allow no dots."""
    vendor, _, name = pool.resource_name.partition("/")
    return f"{vendor}/{name.replace('.', '_')}"


class RdmaDevicePlugin:
    """Every pool of one config, served to the kubelet; embeddable in the node agent."""

    def __init__(
        self,
        config: DevicePluginConfig,
        *,
        kubelet_dir: str | Path = "/var/lib/kubelet",
        dev_root: str = "/dev",
        watch_interval: float = 1.0,
        max_backoff: float = 5.0,
    ) -> None:
        self.config = config
        self.servers = [
            PoolServer(
                ResourceManager(
                    pool, dev_root=dev_root, cdi_kind=cdi_kind(pool) if config.cdi.enabled else None
                ),
                kubelet_dir=kubelet_dir,
                registration=config.registration,
                resend_interval=config.resend_interval,
                watch_interval=watch_interval,
                max_backoff=max_backoff,
            )
            for pool in config.pools
        ]
        self._members: dict[str, tuple[str, ...]] = {}  # per pool, as last logged

    def update(self, topo: NodeTopology, faults: Mapping[str, str] | None = None) -> None:
        """Take a new topology and faults judged outside the plugin (HCA name → why); streams
        are woken only for pools whose devices changed."""
        for server in self.servers:
            if server.manager.update(topo, faults):
                server.notify()
                if self.config.cdi.enabled:
                    self._write_cdi_spec(server.manager)
            self._log_members(server.manager)

    def _log_members(self, manager: ResourceManager) -> None:
        """Each pool's HCAs at the first topology and whenever they change; a pool that matches
        nothing is a warning (it registers and offers nothing, rarely what was meant)."""
        pool = manager.pool
        names = tuple(sorted((h.name for h in manager.members), key=natural_key))
        if self._members.get(pool.resource_name) == names:
            return
        self._members[pool.resource_name] = names
        if names:
            log.info(
                "%s: %d HCA%s (%s): %s",
                pool.resource_name,
                len(names),
                "" if len(names) == 1 else "s",
                pool.mode,
                ", ".join(names),
            )
            return
        chosen = pool.selectors.model_dump(by_alias=True, exclude_defaults=True)
        log.warning(
            "%s: no HCA port matches %s; the pool offers no device",
            pool.resource_name,
            f"the selectors {json.dumps(chosen)}" if chosen else "(no selectors: no RDMA device)",
        )

    async def start(self) -> None:
        for server in self.servers:
            await server.start()

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()

    def _write_cdi_spec(self, manager: ResourceManager) -> None:
        kind = manager.cdi_kind or ""
        folder = Path(self.config.cdi.spec_dir)
        target = folder / (kind.replace("/", "-") + ".json")
        try:
            if not folder.is_dir():  # /var/run is tmpfs: gone after a reboot until written
                folder.mkdir(parents=True)
                log.info("created the CDI spec folder %s", folder)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".rdmaplane-")
            with os.fdopen(fd, "w") as f:
                json.dump(manager.cdi_spec(), f, indent=1)
            os.replace(tmp, target)
        except OSError as e:
            log.error("cannot write CDI spec %s: %s", target, e)


REDISCOVER_S = 300.0  # a full read now and then, for what the probe does not watch


async def poll_topology(
    plugin: RdmaDevicePlugin,
    sysfs_root: str,
    interval: float,
    executor: concurrent.futures.Executor | None = None,
    first: NodeTopology | None = None,
) -> None:
    """Probe sysfs every `interval` seconds (port states, device listings, in-use GIDs: ~120
    small files on a big node) and read it fully only when the probe saw a change, or every
    `REDISCOVER_S` (and at the start, to settle the probe's baseline against `first`, the
    topology the plugin was started with, or a fresh read).

    A full read of a big node is tens of ms of Python; in a thread it would hold the GIL and
    stall gRPC answers for that long, so the standalone plugin passes a process pool. A read
    that fails keeps the last topology: a flaky read must not make devices vanish."""
    loop = asyncio.get_running_loop()

    async def read() -> NodeTopology:
        return await loop.run_in_executor(executor, read_node, sysfs_root)

    def probe_for(topo: NodeTopology) -> Probe:
        return Probe(sysfs_root, topo, watched=())

    probe: Probe | None = None
    seen: tuple[object, ...] | None = None
    read_at = 0.0
    while True:
        if probe is not None:
            fingerprint = (await asyncio.to_thread(probe.read)).fingerprint
            if fingerprint == seen and loop.time() - read_at < REDISCOVER_S:
                await asyncio.sleep(interval)
                continue
        try:
            settled = await settle(read, probe_for, first=first)
        except Exception as e:  # the reader is tolerant; anything left is logged, not fatal
            log.error("reading %s failed: %s", sysfs_root, e)
        else:
            plugin.update(settled.topo)
            probe, seen, read_at = settled.probe, settled.fingerprint, loop.time()
            first = None
        await asyncio.sleep(interval)


async def run_standalone(
    config: DevicePluginConfig,
    *,
    sysfs_root: str = "/sys",
    kubelet_dir: str = "/var/lib/kubelet",
    dev_root: str = "/dev",
) -> None:
    """Serve until SIGTERM/SIGINT, then remove the sockets and return."""
    plugin = RdmaDevicePlugin(config, kubelet_dir=kubelet_dir, dev_root=dev_root)
    topo = await asyncio.to_thread(read_node, sysfs_root)
    plugin.update(topo)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await plugin.start()
    # spawn, not fork: forking a process that runs gRPC threads is unsafe
    reader = concurrent.futures.ProcessPoolExecutor(1, multiprocessing.get_context("spawn"))
    poller = asyncio.create_task(
        poll_topology(plugin, sysfs_root, config.health_poll_interval, reader, first=topo)
    )
    try:
        await stop.wait()
        log.info("shutting down")
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        reader.shutdown(cancel_futures=True)
        await plugin.stop()
