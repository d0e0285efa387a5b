"""One pool's gRPC face: the DevicePlugin service on a unix socket, and staying registered.

The kubelet talks to a device plugin in one of two ways, both served here:

* `kubelet` registration: the plugin serves on `<kubelet-dir>/device-plugins/<name>.sock` and
  calls `Registration.Register` on the kubelet's `device-plugins/kubelet.sock`, exactly once
  per kubelet start (the v1.37.2 kubelet refuses a second Register from a connected socket and
  is then stuck until it restarts). A starting kubelet deletes every socket in that folder, ours
  included, then listens on a new `kubelet.sock`; the kubelet then dials in and opens a new
  ListAndWatch, which starts with the full device list.
* `plugins-registry`: the plugin serves the DevicePlugin and the plugin watcher's
  `Registration` (`GetInfo`, `NotifyRegistrationStatus`) on `<kubelet-dir>/plugins_registry/
  <name>.sock`; the kubelet finds the socket itself (and again after its restarts); a socket
  that vanished is served again at once, and the kubelet's watcher finds the new one.

When to serve and when to register is decided by one pure state machine
(`rdmaplane.core.registration`) on what the socket folder holds; its I/O half
(`rdmaplane.adapters.kubelet.registration.KeptSocket`, shared with the DRA driver) serves,
registers and watches the folder by inotify.
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
from rdmaplane.adapters.kubelet.registration import KUBELET_SOCKET, KeptSocket
from rdmaplane.adapters.supervisor import Supervisor
from rdmaplane.core import paths
from rdmaplane.core.registration import KUBELET, WATCHER
from rdmaplane.services.deviceplugin.manager import (
    AllocateError,
    ContainerAllocation,
    PluginDevice,
    ResourceManager,
)
from rdmaplane.services.deviceplugin.policy.alloc import AllocationRequestError

API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
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
            self.pool.watcher_registered()
        else:
            log.error(
                "%s: kubelet refused registration: %s", self.pool.resource_name, request.error
            )
        return reg.RegistrationStatusResponse()


class PoolServer:
    """Serves one `ResourceManager` to the kubelet and keeps it registered (`KeptSocket`)."""

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
        self.changed = asyncio.Event()
        self._watcher_registrations = 0
        self.kept = KeptSocket(
            self.socket,
            self._add_servicers,
            self.resource_name,
            log,
            mode=WATCHER if self.watcher_mode else KUBELET,
            kubelet_socket=None if self.watcher_mode else self.kubelet_socket,
            request=None if self.watcher_mode else self._register_request,
            recheck_s=recheck_interval,
            max_backoff_s=max_backoff,
        )
        self._supervisor: Supervisor | None = None

    @property
    def task_name(self) -> str:
        return f"device-plugin {self.resource_name}"

    @property
    def registrations(self) -> int:
        """Registrations that went through: Register calls answered, or the plugin watcher's
        reports."""
        return self.kept.registrations + self._watcher_registrations

    @property
    def recheck_interval(self) -> float:
        return self.kept.recheck_s

    @recheck_interval.setter
    def recheck_interval(self, value: float) -> None:
        self.kept.recheck_s = value

    def watcher_registered(self) -> None:
        self._watcher_registrations += 1

    def notify(self) -> None:
        """Wake every ListAndWatch stream: the device list changed."""
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    async def start(self, supervisor: Supervisor) -> None:
        """Serve (a socket that cannot be created is a `ServeError` here, at start), then stay
        registered in a task of `supervisor`."""
        await self.kept.serve()
        self._supervisor = supervisor
        supervisor.spawn(self.task_name, self.kept.run)

    async def stop(self) -> None:
        """Stop staying registered, stop serving, remove our socket (only if still ours)."""
        if self._supervisor is not None:
            await self._supervisor.cancel(self.task_name)
            self._supervisor = None
        await self.kept.close()

    def _add_servicers(self, server: grpc.aio.Server) -> None:
        dp_grpc.add_DevicePluginServicer_to_server(_DevicePlugin(self), server)  # type: ignore[no-untyped-call]
        if self.watcher_mode:
            reg_grpc.add_RegistrationServicer_to_server(_WatcherRegistration(self), server)  # type: ignore[no-untyped-call]

    def _register_request(self) -> dp.RegisterRequest:
        return dp.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket.name,
            resource_name=self.resource_name,
            options=dp.DevicePluginOptions(get_preferred_allocation_available=True),
        )
