"""One pool's gRPC face: the DevicePlugin service on a unix socket, and staying registered.

The kubelet talks to a device plugin in one of two ways, both served here:

* `kubelet` registration: the plugin serves on `<kubelet-dir>/device-plugins/<name>.sock` and
  calls `Registration.Register` on the kubelet's `device-plugins/kubelet.sock`. A starting
  kubelet deletes every socket in that folder, ours included, then listens on a new
  `kubelet.sock`. The rule here: our socket gone means the kubelet restarted, so serve again and
  register again, always; a new `kubelet.sock` means register, unless it is the one already
  registered with. Both are seen through inotify on the folder, at once. The kubelet then dials
  in and opens a new ListAndWatch, which starts with the full device list.

  Register exactly once per kubelet start: the v1.37.2 kubelet refuses a second Register from
  the same socket ("device plugin already connected") and, refusing it, forgets its live client
  for that socket while keeping the endpoint, so every later Register from that path is refused
  until it restarts. After a restart the new `kubelet.sock`'s creation is often still queued when
  our re-served socket has registered already; so a created `kubelet.sock` counts only when its
  inode is not the one registered with. (A new kubelet can reuse the old inode, but it has
  deleted our socket too, and that always registers.) A refusal as "already connected" is not
  retried: it cannot succeed until that kubelet restarts.
* `plugins-registry`: the plugin serves the DevicePlugin and the plugin watcher's
  `Registration` (`GetInfo`, `NotifyRegistrationStatus`) on `<kubelet-dir>/plugins_registry/
  <name>.sock`; the kubelet finds the socket itself (and again after its restarts); a socket
  that vanished is served again at once, and the kubelet's watcher finds the new one.

Sockets are served by renaming a hidden one into place, and folders watched by inotify
(`rdmaplane.adapters.kubelet.sockets`, shared with the DRA driver).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from weakref import WeakKeyDictionary

import grpc

from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from rdmaplane.adapters.kubelet.api.pluginregistration.v1 import api_pb2 as reg
from rdmaplane.adapters.kubelet.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from rdmaplane.adapters.kubelet.sockets import FolderEvents, ServeError, inode, serve
from rdmaplane.adapters.supervisor import Supervisor
from rdmaplane.core import paths
from rdmaplane.services.deviceplugin.manager import (
    AllocateError,
    ContainerAllocation,
    PluginDevice,
    ResourceManager,
)
from rdmaplane.services.deviceplugin.policy.alloc import AllocationRequestError

API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
KUBELET_SOCKET = paths.KUBELET_SOCKET
ALREADY_CONNECTED = "device plugin already connected"  # the kubelet's refusal of a second Register
log = logging.getLogger("rdmaplane.services.deviceplugin")

_STATUS = {
    "not_found": grpc.StatusCode.NOT_FOUND,
    "unhealthy": grpc.StatusCode.FAILED_PRECONDITION,
    "plan": grpc.StatusCode.FAILED_PRECONDITION,
}


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


def to_container_response(a: ContainerAllocation) -> dp.ContainerAllocateResponse:
    return dp.ContainerAllocateResponse(
        envs=a.envs,
        devices=[
            dp.DeviceSpec(container_path=p, host_path=p, permissions="rw") for p in a.device_nodes
        ],
        cdi_devices=[dp.CDIDevice(name=n) for n in a.cdi_devices],
    )


class _DevicePlugin(dp_grpc.DevicePluginServicer):
    def __init__(self, pool: PoolServer) -> None:
        self.pool = pool
        # each grant's answer, built once (a few dozen messages) and dropped with the grant
        self._answers: WeakKeyDictionary[ContainerAllocation, dp.ContainerAllocateResponse] = (
            WeakKeyDictionary()
        )

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
            answer = self._answers.get(a)
            if answer is None:
                answer = self._answers[a] = to_container_response(a)
            responses.append(answer)
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
        recheck_interval: float = 30.0,
        max_backoff: float = 5.0,
    ) -> None:
        self.manager = manager
        self.resource_name = manager.pool.resource_name
        self.watcher_mode = registration == "plugins-registry"
        self.kubelet_dir = Path(kubelet_dir)
        self.folder = self.kubelet_dir / (
            paths.PLUGINS_REGISTRY if self.watcher_mode else paths.DEVICE_PLUGINS
        )
        self.socket = self.folder / socket_name(self.resource_name)
        self.kubelet_socket = self.kubelet_dir / paths.DEVICE_PLUGINS / KUBELET_SOCKET
        self.resend_interval = resend_interval
        self.recheck_interval = recheck_interval  # a safety net: inotify tells first
        self.max_backoff = max_backoff
        self.changed = asyncio.Event()
        self.registrations = 0
        self._server: grpc.aio.Server | None = None
        self._served: tuple[int, int] | None = None  # inode of the socket we serve on
        self._supervisor: Supervisor | None = None
        self._waiting_logged = False
        self._registered_with: tuple[int, int] | None = None  # the kubelet.sock answered

    @property
    def task_name(self) -> str:
        return f"device-plugin {self.resource_name}"

    def notify(self) -> None:
        """Wake every ListAndWatch stream: the device list changed."""
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    async def start(self, supervisor: Supervisor) -> None:
        """Serve (a socket that cannot be created is a `ServeError` here, at start), then stay
        registered in a task of `supervisor`."""
        await self._serve()
        self._supervisor = supervisor
        supervisor.spawn(self.task_name, self.stay_registered)

    async def stop(self) -> None:
        """Stop staying registered, stop serving, remove our socket (only if still ours)."""
        if self._supervisor is not None:
            await self._supervisor.cancel(self.task_name)
            self._supervisor = None
        if self._server is not None:
            await self._server.stop(grace=0.2)
            self._server = None
        if self._still_served():
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()

    async def _serve(self) -> None:
        """A new server on our socket (`sockets.serve`); then the old server stops."""

        def add(server: grpc.aio.Server) -> None:
            dp_grpc.add_DevicePluginServicer_to_server(_DevicePlugin(self), server)  # type: ignore[no-untyped-call]
            if self.watcher_mode:
                reg_grpc.add_RegistrationServicer_to_server(_WatcherRegistration(self), server)  # type: ignore[no-untyped-call]

        server, served = await serve(self.socket, add, self.resource_name)
        old, self._server, self._served = self._server, server, served
        if old is not None:
            await old.stop(grace=None)  # its streams belong to a kubelet that is gone
        log.info("%s: serving on %s", self.resource_name, self.socket)

    def _still_served(self) -> bool:
        return self._served is not None and inode(self.socket) == self._served

    async def stay_registered(self) -> None:
        """Serve again whenever our socket vanished, register again whenever the kubelet
        restarted (our socket gone, or a new kubelet.sock); woken by inotify."""
        with FolderEvents(self.folder, self.kubelet_dir) as events:
            pending = not self.watcher_mode  # (again) when this task is restarted
            backoff: float | None = None
            while True:
                events.watch()
                if not self._still_served():
                    log.warning(
                        "%s: socket %s vanished (kubelet restarted?); serving again",
                        self.resource_name,
                        self.socket,
                    )
                    await self._serve_retrying()
                    pending = not self.watcher_mode
                if pending:
                    pending, backoff = await self._register_step(backoff)
                wait = backoff if pending and backoff else self.recheck_interval
                created = await events.created(wait)
                if (created is None or KUBELET_SOCKET in created) and self._new_kubelet():
                    pending = True  # a kubelet.sock not registered with (or events lost)

    def _new_kubelet(self) -> bool:
        """Whether `kubelet.sock` is not the one this pool registered with (see the module
        docstring: a second Register with the same kubelet is refused, and harms)."""
        return not self.watcher_mode and inode(self.kubelet_socket) != self._registered_with

    async def _register_step(self, backoff: float | None) -> tuple[bool, float | None]:
        """One try at registering: (still pending, the next retry delay or None to wait for a
        new kubelet.sock). Logged once per outage."""
        if not self.kubelet_socket.exists():
            self._log_waiting(f"waiting for {self.kubelet_socket}")
            return True, None
        problem = await self._register_once()
        if problem is None:
            self._waiting_logged = False
            return False, None
        self._log_waiting(
            f"cannot register at {self.kubelet_socket} ({problem}); retrying until it answers"
        )
        return True, min(backoff * 2, self.max_backoff) if backoff else 0.1

    def _log_waiting(self, message: str) -> None:
        if not self._waiting_logged:
            log.warning("%s: %s", self.resource_name, message)
            self._waiting_logged = True

    async def _serve_retrying(self) -> None:
        delay = 0.05
        while True:
            try:
                await self._serve()
                return
            except ServeError as e:
                log.warning("%s: %s; retrying in %g s", self.resource_name, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff)

    async def _register_once(self) -> str | None:
        """Register with the kubelet; None when it worked, else why not."""
        try:
            async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                kubelet = dp_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                await kubelet.Register(
                    dp.RegisterRequest(
                        version=API_VERSION,
                        endpoint=self.socket.name,
                        resource_name=self.resource_name,
                        options=dp.DevicePluginOptions(get_preferred_allocation_available=True),
                    ),
                    timeout=15.0,  # the kubelet dials us back within it (10 s)
                )
        except grpc.aio.AioRpcError as e:
            if ALREADY_CONNECTED not in (e.details() or ""):
                return f"{e.code().name}: {e.details()}"
            log.error(
                "%s: the kubelet refused a second Register from %s (%s); it refuses every"
                " later one too, until it restarts: not retrying",
                self.resource_name,
                self.socket,
                e.details(),
            )
        else:
            log.info("%s: registered with the kubelet", self.resource_name)
            self.registrations += 1
        self._registered_with = inode(self.kubelet_socket)
        return None
