"""One pool's gRPC face: the DevicePlugin service on a unix socket, and staying registered.

The kubelet talks to a device plugin in one of two ways, both served here:

* `kubelet` registration: the plugin serves on `<kubelet-dir>/device-plugins/<name>.sock` and
  calls `Registration.Register` on the kubelet's `device-plugins/kubelet.sock`. A restarting
  kubelet deletes every socket in that folder and creates a new `kubelet.sock`; the plugin polls
  both files' identity (inode, mtime) and, when its own socket vanished, serves again on a fresh
  one, and re-registers whenever the kubelet socket changed. The kubelet then dials in and
  opens a new ListAndWatch, which starts with the full device list.
* `plugins-registry`: the plugin serves the DevicePlugin and the plugin watcher's
  `Registration` (`GetInfo`, `NotifyRegistrationStatus`) on `<kubelet-dir>/plugins_registry/
  <name>.sock`; the kubelet finds the socket itself (and again after its restarts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from rdmaplane.deviceplugin.alloc import AllocationRequestError
from rdmaplane.deviceplugin.resources import AllocateError, PluginDevice, ResourceManager
from rdmaplane.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from rdmaplane.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from rdmaplane.kubelet.api.pluginregistration.v1 import api_pb2 as reg
from rdmaplane.kubelet.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc

API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
log = logging.getLogger("rdmaplane.deviceplugin")

_STATUS = {
    "not_found": grpc.StatusCode.NOT_FOUND,
    "unhealthy": grpc.StatusCode.FAILED_PRECONDITION,
    "plan": grpc.StatusCode.FAILED_PRECONDITION,
}


class ServeError(RuntimeError):
    """The plugin's socket cannot be created (kubelet folder missing, not writable, …)."""


def socket_name(resource_name: str) -> str:
    return "rdmaplane-" + re.sub(r"[^A-Za-z0-9_.-]", "_", resource_name) + ".sock"


def to_proto(device: PluginDevice) -> dp.Device:
    topology = (
        dp.TopologyInfo(nodes=[dp.NUMANode(ID=n) for n in device.numa_nodes])
        if device.numa_nodes
        else None
    )
    return dp.Device(
        ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY, topology=topology
    )


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


class _DevicePlugin(dp_grpc.DevicePluginServicer):
    def __init__(self, pool: PoolServer) -> None:
        self.pool = pool

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: object
    ) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: dp.Empty, context: object
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        while True:
            changed = self.pool.changed
            yield dp.ListAndWatchResponse(devices=[to_proto(d) for d in self.pool.manager.devices])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self.pool.resend_interval)

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> dp.PreferredAllocationResponse:
        responses = []
        for r in request.container_requests:
            try:
                ids = self.pool.manager.preferred(
                    list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size
                )
            except AllocationRequestError as e:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{self.pool.resource_name}: {e}"
                )
            responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return dp.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(
        self, request: dp.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> dp.AllocateResponse:
        responses = []
        for r in request.container_requests:
            try:
                a = self.pool.manager.allocate(list(r.devices_ids))
            except AllocateError as e:
                log.warning("refused Allocate(%s): %s", ",".join(r.devices_ids), e)
                await context.abort(_STATUS[e.kind], str(e))
            responses.append(
                dp.ContainerAllocateResponse(
                    envs=a.envs,
                    devices=[
                        dp.DeviceSpec(container_path=p, host_path=p, permissions="rw")
                        for p in a.device_nodes
                    ],
                    cdi_devices=[dp.CDIDevice(name=n) for n in a.cdi_devices],
                )
            )
        return dp.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: object
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()


class _WatcherRegistration(reg_grpc.RegistrationServicer):
    """The plugin watcher's side: the kubelet asks who we are and tells how it went."""

    def __init__(self, pool: PoolServer) -> None:
        self.pool = pool

    async def GetInfo(self, request: reg.InfoRequest, context: object) -> reg.PluginInfo:
        return reg.PluginInfo(
            type="DevicePlugin",
            name=self.pool.resource_name,
            endpoint=str(self.pool.socket),
            supported_versions=[API_VERSION],
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: object
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("%s: registered through the plugin watcher", self.pool.resource_name)
            self.pool.registrations += 1
        else:
            log.error(
                "%s: kubelet refused registration: %s", self.pool.resource_name, request.error
            )
        return reg.RegistrationStatusResponse()


class PoolServer:
    """Serves one `ResourceManager` to the kubelet and keeps it registered."""

    def __init__(
        self,
        manager: ResourceManager,
        *,
        kubelet_dir: str | Path,
        registration: str = "kubelet",
        resend_interval: float = 60.0,
        watch_interval: float = 1.0,
        max_backoff: float = 5.0,
    ) -> None:
        self.manager = manager
        self.resource_name = manager.pool.resource_name
        self.watcher_mode = registration == "plugins-registry"
        folder = "plugins_registry" if self.watcher_mode else "device-plugins"
        self.socket = Path(kubelet_dir) / folder / socket_name(self.resource_name)
        self.kubelet_socket = Path(kubelet_dir) / "device-plugins" / "kubelet.sock"
        self.resend_interval = resend_interval
        self.watch_interval = watch_interval
        self.max_backoff = max_backoff
        self.changed = asyncio.Event()
        self.registrations = 0
        self._server: grpc.aio.Server | None = None
        self._served: tuple[int, int] | None = None  # identity of the socket we serve on
        self._task: asyncio.Task[None] | None = None

    def notify(self) -> None:
        """Wake every ListAndWatch stream: the device list changed."""
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    async def start(self) -> None:
        await self._serve()
        self._task = asyncio.create_task(self._stay_registered(), name=f"dp:{self.resource_name}")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._unserve()
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            self.socket.unlink()

    async def _serve(self) -> None:
        folder = self.socket.parent
        try:
            if not folder.is_dir():  # the kubelet makes it at its start; its root must exist
                folder.mkdir()
                log.info("%s: created %s", self.resource_name, folder)
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()  # a stale socket from an earlier run
        except OSError as e:
            raise ServeError(f"cannot serve on {self.socket}: {e.strerror or e}") from e
        server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(_DevicePlugin(self), server)  # type: ignore[no-untyped-call]
        if self.watcher_mode:
            reg_grpc.add_RegistrationServicer_to_server(_WatcherRegistration(self), server)  # type: ignore[no-untyped-call]
        try:
            server.add_insecure_port(f"unix://{self.socket}")
        except RuntimeError as e:  # grpc: "Failed to bind to address ..."
            raise ServeError(f"cannot serve on {self.socket}: {e}") from e
        await server.start()
        self._server = server
        self._served = _identity(self.socket)
        log.info("%s: serving on %s", self.resource_name, self.socket)

    async def _unserve(self) -> None:
        if self._server:
            await self._server.stop(grace=0.2)
            self._server = None

    async def _stay_registered(self) -> None:
        """Register, then watch; again whenever the kubelet restarted."""
        while True:
            kubelet = await self._register() if not self.watcher_mode else None
            while True:
                await asyncio.sleep(self.watch_interval)
                if await self._serving_again():
                    break
                if not self.watcher_mode and _identity(self.kubelet_socket) != kubelet:
                    log.warning("%s: kubelet restarted; registering again", self.resource_name)
                    break

    async def _serving_again(self) -> bool:
        """Serve on a fresh socket when ours vanished (the kubelet wipes its folder)."""
        if _identity(self.socket) == self._served:
            return False
        log.warning("%s: socket %s vanished; serving again", self.resource_name, self.socket)
        await self._unserve()
        await self._serve()
        return True

    async def _register(self) -> tuple[int, int] | None:
        """Register with the kubelet, retrying with backoff (and at once when its socket
        appears); returns the identity of the kubelet socket it registered with."""
        delay, waiting_logged = self.watch_interval, False
        while True:
            await self._serving_again()  # never point the kubelet at a missing socket
            kubelet = _identity(self.kubelet_socket)
            try:
                await self._register_once()
            except grpc.aio.AioRpcError as e:
                if not waiting_logged:
                    log.warning(
                        "%s: cannot register at %s (%s); retrying until the kubelet is there",
                        self.resource_name,
                        self.kubelet_socket,
                        e.code().name,
                    )
                    waiting_logged = True
            else:
                log.info("%s: registered with the kubelet", self.resource_name)
                self.registrations += 1
                return kubelet
            loop = asyncio.get_running_loop()
            deadline = loop.time() + delay
            while loop.time() < deadline:
                await asyncio.sleep(self.watch_interval)
                if _identity(self.kubelet_socket) not in (None, kubelet):
                    break
            delay = min(delay * 2, self.max_backoff)

    async def _register_once(self) -> None:
        async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            kubelet = dp_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await kubelet.Register(
                dp.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket.name,
                    resource_name=self.resource_name,
                    options=dp.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=5.0,
            )
