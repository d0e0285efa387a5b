"""A kubelet stand-in speaking the device plugin protocol from the same generated stubs.

It does what the kubelet's device manager does with a plugin, no more: serves
`Registration.Register` on `device-plugins/kubelet.sock` (or finds plugins in
`plugins_registry/` and asks them `GetInfo`), dials the plugin back, keeps reading its
`ListAndWatch` stream, filters the healthy devices by a NUMA affinity as the Topology Manager
does before `GetPreferredAllocation`, then calls `Allocate`. `restart()` behaves like a kubelet
restart: its streams die, every socket in `device-plugins/` is deleted, a new one comes up. A
second Register from a connected socket is refused, and sticks, as in the v1.37.2 kubelet
(`kubelet_process.DeviceManagerRecords`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from rdmaplane.adapters.kubelet.api.pluginregistration.v1 import api_pb2 as reg
from rdmaplane.adapters.kubelet.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from rdmaplane.core.settings.agent import AgentSettings
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.services.agent.deviceplugin import EmbeddedPlugin
from tests.integration.kubelet_process import DeviceManagerRecords, listen


def device_nodes(sysfs: Path, root: Path) -> Path:
    """The host's `/dev` as the plugin sees it, under `root`: an `infiniband/` entry (a plain
    file) for every uverbs/umad/issm device of the sysfs tree, and `rdma_cm`."""
    (root / "infiniband").mkdir(parents=True)
    for cls in ("infiniband_verbs", "infiniband_mad"):
        for entry in (sysfs / "class" / cls).iterdir():
            if entry.is_symlink():
                (root / "infiniband" / entry.name).touch()
    (root / "infiniband" / "rdma_cm").touch()
    return root


def agent_with_plugin(
    sysfs: Path, short_dir: Path, **extra: Any
) -> tuple[AgentSettings, EmbeddedPlugin]:
    """An agent config whose kubelet folder is `short_dir` (unix socket paths are short), and
    the plugin it embeds, with a device node for every HCA of the tree under `short_dir/dev`."""
    cfg = AgentSettings(
        node_name="hgx-h100-017",
        sysfs_root=sysfs,
        kubelet_dir=short_dir,
        metrics_address="127.0.0.1",
        metrics_port=0,
        **extra,
    )
    dev_root = device_nodes(sysfs, short_dir / "dev")
    return cfg, EmbeddedPlugin(PluginSettings(), kubelet_dir=cfg.kubelet_dir, dev_root=dev_root)


@dataclass
class SeenDevice:
    health: str
    numa: tuple[int, ...]


@dataclass
class Plugin:
    """What the stand-in knows about one registered resource."""

    resource: str
    endpoint: str
    options: dp.DevicePluginOptions | None = None
    devices: dict[str, SeenDevice] = field(default_factory=dict)
    lists: int = 0  # ListAndWatch responses received
    registered_at: float = 0.0
    first_list_at: float | None = None


class KubeletStandIn(dp_grpc.RegistrationServicer):
    def __init__(self, kubelet_dir: Path) -> None:
        self.dir = Path(kubelet_dir)
        self.plugins_dir = self.dir / "device-plugins"
        self.registry_dir = self.dir / "plugins_registry"
        self.socket = self.plugins_dir / "kubelet.sock"
        self.plugins: dict[str, Plugin] = {}
        self.registrations: list[dp.RegisterRequest] = []
        self.refusals: list[str] = []
        self.register_delay = 0.0
        self.register_received = asyncio.Event()  # set by every Register received
        self.records = DeviceManagerRecords()
        self.changed = asyncio.Condition()
        self._server: grpc.aio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._channels: list[grpc.aio.Channel] = []

    # --- lifecycle
    async def start(self) -> None:
        self.plugins_dir.mkdir(parents=True, exist_ok=True)
        self._server = await listen(self, self.socket)  # renamed into place: see `listen`

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for ch in self._channels:
            await ch.close()
        self._channels.clear()
        if self._server:
            await self._server.stop(grace=None)
            self._server = None

    async def restart(self) -> None:
        """Go away, wipe device-plugins/ as the kubelet does on start, come back."""
        await self.stop()
        self.plugins.clear()
        self.records = DeviceManagerRecords()
        for sock in self.plugins_dir.glob("*"):
            sock.unlink()
        await self.start()

    # --- Registration service (device-plugins/kubelet.sock)
    async def Register(
        self, request: dp.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> dp.Empty:
        self.registrations.append(request)
        self.register_received.set()
        await asyncio.sleep(self.register_delay)  # a kubelet slow to answer
        endpoint = str(self.plugins_dir / request.endpoint)
        refusal = await self._connect(request.resource_name, endpoint)
        if refusal is not None:
            await context.abort(grpc.StatusCode.UNKNOWN, refusal)
        return dp.Empty()

    # --- plugin watcher (plugins_registry/)
    async def discover_registry(self) -> list[reg.PluginInfo]:
        """Find plugin sockets in plugins_registry/, ask who they are, connect, notify."""
        infos = []
        for sock in sorted(self.registry_dir.glob("*.sock")):
            if sock.name.startswith("."):  # the kubelet's watcher skips these too
                continue
            channel = self._channel(str(sock))
            watcher = reg_grpc.RegistrationStub(channel)
            info = await watcher.GetInfo(reg.InfoRequest(), timeout=5)
            infos.append(info)
            refusal = await self._connect(info.name, info.endpoint or str(sock))
            await watcher.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=refusal is None, error=refusal or ""),
                timeout=5,
            )
        return infos

    # --- talking to plugins
    def _channel(self, path: str) -> grpc.aio.Channel:
        channel = grpc.aio.insecure_channel(f"unix://{path}")
        self._channels.append(channel)
        return channel

    def stub(self, resource: str) -> dp_grpc.DevicePluginStub:
        return dp_grpc.DevicePluginStub(self._channel(self.plugins[resource].endpoint))

    async def _connect(self, resource: str, endpoint: str) -> str | None:
        """Dial the plugin and connect its endpoint, as the device manager does before it
        answers; then follow its ListAndWatch. None, or the refusal."""
        stub = dp_grpc.DevicePluginStub(self._channel(endpoint))
        options, refusal = await self.records.register(endpoint, stub)
        if refusal is not None:
            self.refusals.append(refusal)
            async with self.changed:
                self.changed.notify_all()
            return refusal
        plugin = Plugin(resource, endpoint, options, registered_at=time.perf_counter())
        self.plugins[resource] = plugin
        task = asyncio.create_task(self._watch(plugin, stub, self.records))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return None

    async def _watch(
        self, plugin: Plugin, stub: dp_grpc.DevicePluginStub, records: DeviceManagerRecords
    ) -> None:
        try:
            await self._list_and_watch(plugin, stub)
        finally:
            records.stream_ended(plugin.endpoint)

    async def _list_and_watch(self, plugin: Plugin, stub: dp_grpc.DevicePluginStub) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):  # the kubelet logs and waits, too
            async for response in stub.ListAndWatch(dp.Empty()):
                plugin.devices = {
                    d.ID: SeenDevice(d.health, tuple(n.ID for n in d.topology.nodes))
                    for d in response.devices
                }
                plugin.lists += 1
                if plugin.first_list_at is None:
                    plugin.first_list_at = time.perf_counter()
                async with self.changed:
                    self.changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], within: float = 5.0) -> None:
        """Until `predicate` holds after a ListAndWatch update or a refusal; TimeoutError after
        `within` s."""
        async with asyncio.timeout(within), self.changed:
            await self.changed.wait_for(predicate)

    # --- admission of a container, as the device manager does it
    async def admit(
        self, resource: str, count: int, numa_affinity: set[int] | None = None
    ) -> tuple[list[str], dp.ContainerAllocateResponse]:
        plugin = self.plugins[resource]
        available = [
            dev_id
            for dev_id, d in sorted(plugin.devices.items())
            if d.health == "Healthy"
            and (numa_affinity is None or not d.numa or set(d.numa) & numa_affinity)
        ]
        stub = self.stub(resource)
        ids = available[:count]
        if plugin.options and plugin.options.get_preferred_allocation_available:
            preferred = await stub.GetPreferredAllocation(
                dp.PreferredAllocationRequest(
                    container_requests=[
                        dp.ContainerPreferredAllocationRequest(
                            available_deviceIDs=available, allocation_size=count
                        )
                    ]
                ),
                timeout=5,
            )
            ids = list(preferred.container_responses[0].deviceIDs)
        allocated = await stub.Allocate(
            dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]),
            timeout=5,
        )
        return ids, allocated.container_responses[0]
