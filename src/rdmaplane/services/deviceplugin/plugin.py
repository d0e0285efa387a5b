"""The device plugin as a whole: one pool server per configured pool, fed with topologies.

`RdmaDevicePlugin` takes its `NodeTopology` from outside (`update(topo)`), so the node agent's
single discovery loop can feed it; `run_standalone` is the small loop of its own that
`rdmaplane device-plugin` uses, reading sysfs every `healthPollInterval`, in one process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Callable, Mapping
from pathlib import Path

from rdmaplane.adapters.atomicfile import write_atomically
from rdmaplane.adapters.discovery.probe import Probe, settle
from rdmaplane.adapters.discovery.sysfs import read_node
from rdmaplane.adapters.supervisor import Supervisor
from rdmaplane.core import paths
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.selectors import natural_key
from rdmaplane.core.settings.deviceplugin import PluginSettings, Pool
from rdmaplane.services.deviceplugin.grpc import PoolServer
from rdmaplane.services.deviceplugin.manager import PluginDevice, ResourceManager

log = logging.getLogger("rdmaplane.services.deviceplugin")


def cdi_kind(pool: Pool) -> str:
    """CDI kinds are `vendor/class`; classes allow no dots."""
    vendor, _, name = pool.resource_name.partition("/")
    return f"{vendor}/{name.replace('.', '_')}"


class RdmaDevicePlugin:
    """Every pool of one config, served to the kubelet; embeddable in the node agent."""

    def __init__(
        self,
        config: PluginSettings,
        *,
        kubelet_dir: str | Path = paths.KUBELET_DIR,
        dev_root: str = paths.DEV,
        recheck_interval: float = 30.0,
        max_backoff: float = 5.0,
    ) -> None:
        self.config = config
        self._own_tasks: Supervisor | None = None
        self.servers = [
            PoolServer(
                ResourceManager(
                    pool,
                    dev_root=dev_root,
                    cdi_kind=cdi_kind(pool) if config.cdi_spec_dir else None,
                ),
                kubelet_dir=kubelet_dir,
                registration=config.registration,
                resend_interval=config.resend_interval,
                recheck_interval=recheck_interval,
                max_backoff=max_backoff,
            )
            for pool in config.pools
        ]
        self._members: dict[str, tuple[str, ...]] = {}  # per pool, as last logged

    def update(
        self,
        topo: NodeTopology,
        faults: Mapping[str, str] | None = None,
        rails: Mapping[str, int] | None = None,
    ) -> None:
        """Take a new topology, faults judged outside the plugin (HCA name → why) and the HCAs'
        rails where the fabric is known; streams are woken only for pools whose devices
        changed."""
        for server in self.servers:
            self._changed(server, lambda m: m.update(topo, faults, rails))
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
        chosen = pool.selectors.to_config()
        log.warning(
            "%s: no HCA port matches %s; the pool offers no device",
            pool.resource_name,
            f"the selectors {json.dumps(chosen)}" if chosen else "(no selectors: no RDMA device)",
        )

    def recheck(self) -> None:
        """Look at the device nodes again (cheap: one listing per pool); call it every poll."""
        for server in self.servers:
            self._changed(server, ResourceManager.recheck)

    def _changed(self, server: PoolServer, change: Callable[[ResourceManager], bool]) -> None:
        manager = server.manager
        before = {d.id: d for d in manager.devices}
        if not change(manager):
            return
        server.notify()
        log_health_changes(manager.pool.resource_name, before, manager.devices)
        if self.config.cdi_spec_dir:
            self._write_cdi_spec(manager, self.config.cdi_spec_dir)

    async def start(self, supervisor: Supervisor | None = None) -> None:
        """Serve every pool; the tasks that keep them registered run under `supervisor` (the
        agent's, so its /healthz sees them), else under one of the plugin's own."""
        if supervisor is None:
            supervisor = self._own_tasks = Supervisor()
        for server in self.servers:
            await server.start(supervisor)

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()
        if self._own_tasks is not None:
            await self._own_tasks.close()
            self._own_tasks = None

    def _write_cdi_spec(self, manager: ResourceManager, spec_dir: str) -> None:
        kind = manager.cdi_kind or ""
        folder = Path(spec_dir)
        target = folder / (kind.replace("/", "-") + ".json")
        try:
            if not folder.is_dir():  # /var/run is tmpfs: gone after a reboot until written
                folder.mkdir(parents=True)
                log.info("created the CDI spec folder %s", folder)
            write_atomically(target, json.dumps(manager.cdi_spec(), indent=1).encode())
        except OSError as e:
            log.error("cannot write CDI spec %s: %s", target, e)


def log_health_changes(
    resource: str, before: Mapping[str, PluginDevice], after: list[PluginDevice]
) -> None:
    """One line per device whose health or reason changed; at start (nothing before) only the
    devices that cannot be handed out, so a node where nothing is usable says so at once."""
    for dev in after:
        old = before.get(dev.id)
        if old is not None and (old.healthy, old.problem) == (dev.healthy, dev.problem):
            continue
        if dev.problem is not None:
            log.warning(
                "%s: device %s is Unhealthy (%s): %s",
                resource,
                dev.id,
                dev.problem.reason,
                dev.problem.message,
                extra={"resource": resource, "device": dev.id, "reason": dev.problem.reason},
            )
        elif old is not None:
            log.info("%s: device %s is Healthy again", resource, dev.id)


REDISCOVER_S = 300.0  # a full read now and then, for what the probe does not watch


async def poll_topology(
    plugin: RdmaDevicePlugin,
    sysfs_root: str,
    interval: float,
    first: NodeTopology | None = None,
) -> None:
    """Probe sysfs every `interval` seconds (port states, device listings, in-use GIDs: ~120
    small files on a big node, plus a listing of the device nodes) and read it fully only when
    the probe saw a change, or every `REDISCOVER_S` (and at the start, to settle the probe's
    baseline against `first`, the topology the plugin was started with, or a fresh read).

    Full reads (tens of ms of Python on a big node) run in a thread: the interpreter hands the
    event loop its turn every few ms, so gRPC answers wait at most that long, and only when
    something changed. A read that fails keeps the last topology: a flaky read must not make
    devices vanish."""
    loop = asyncio.get_running_loop()

    async def read() -> NodeTopology:
        return await asyncio.to_thread(read_node, sysfs_root)

    def probe_for(topo: NodeTopology) -> Probe:
        return Probe(sysfs_root, topo, watched=())

    probe: Probe | None = None
    seen: tuple[object, ...] | None = None
    read_at = 0.0
    if first is not None:  # the plugin serves `first` already: registering comes first
        await asyncio.sleep(interval)
    while True:
        if probe is not None:
            plugin.recheck()
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
    config: PluginSettings,
    *,
    sysfs_root: str = paths.SYSFS,
    kubelet_dir: str = paths.KUBELET_DIR,
    dev_root: str = paths.DEV,
) -> None:
    """Serve until SIGTERM/SIGINT, then remove the sockets and return. One process: the
    gRPC server, the registration watchers and the sysfs poller share one event loop, each
    long task under a supervisor (a fault is logged and the task restarted)."""
    plugin = RdmaDevicePlugin(config, kubelet_dir=kubelet_dir, dev_root=dev_root)
    topo = read_node(sysfs_root)  # nothing to serve yet: no need to leave the loop free
    plugin.update(topo)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = Supervisor()
    try:
        await plugin.start(tasks)
        interval = config.health_poll_interval
        tasks.spawn("poll", lambda: poll_topology(plugin, sysfs_root, interval, first=topo))
        await stop.wait()
        log.info("shutting down")
    finally:
        await tasks.close()
        await plugin.stop()
