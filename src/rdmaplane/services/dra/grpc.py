"""The driver's kubelet-facing side: the DRA plugin API on a unix socket, and registration.

Two sockets, as the kubelet's plugin manager expects of a DRA driver:

* `<kubelet>/plugins_registry/<driver>-reg.sock`: the plugin watcher's `Registration`
  service. The kubelet finds the socket itself, asks `GetInfo` (type `DRAPlugin`, the driver's
  name, the endpoint below, and the gRPC services offered: `v1.DRAPlugin` and
  `v1beta1.DRAPlugin`, newest first; the kubelet takes the newest it knows) and reports back
  with `NotifyRegistrationStatus`.
* `<kubelet>/plugins/<driver>/dra.sock`: `NodePrepareResources` and `NodeUnprepareResources`,
  in both API versions, answered by one `ClaimHandler`; and, given a `HealthFeed`, the device
  health stream `DRAResourceHealth.NodeWatchResources` (v1, and v1alpha1 for 1.36 kubelets):
  every device's health when the kubelet connects, again on every change and every
  `resend_s` (the kubelet turns a device it has heard nothing of for its timeout Unknown).

Every claim of a batch gets its own entry in the answer, error or not; the RPC itself fails only
if the batch cannot be looked at at all. Each socket is kept served by the one registration
piece the device plugin uses too (`rdmaplane.adapters.kubelet.registration.KeptSocket`, in
`watcher` mode: the kubelet's plugin watcher finds the registration socket itself, at its start
and by inotify): renamed into place, its folder watched by inotify, served again at once when the
file is not ours any more (someone cleaned the folder).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import grpc

from rdmaplane.adapters.kubelet.api.dra.v1 import api_pb2 as v1
from rdmaplane.adapters.kubelet.api.dra.v1 import api_pb2_grpc as v1_grpc
from rdmaplane.adapters.kubelet.api.dra.v1beta1 import api_pb2 as v1beta1
from rdmaplane.adapters.kubelet.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from rdmaplane.adapters.kubelet.api.dra_health.v1 import api_pb2 as health_v1
from rdmaplane.adapters.kubelet.api.dra_health.v1 import api_pb2_grpc as health_v1_grpc
from rdmaplane.adapters.kubelet.api.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from rdmaplane.adapters.kubelet.api.dra_health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from rdmaplane.adapters.kubelet.api.pluginregistration.v1 import api_pb2 as reg
from rdmaplane.adapters.kubelet.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from rdmaplane.adapters.kubelet.registration import KeptSocket
from rdmaplane.adapters.supervisor import Supervisor
from rdmaplane.services.dra.policy.claims import ClaimRef, PreparedDevice

log = logging.getLogger("rdmaplane.services.dra")
PLUGIN_TYPE = "DRAPlugin"
MAX_HEALTH_MESSAGE = 1024  # the kubelet cuts longer messages
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # newest first
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


@dataclass(frozen=True)
class Outcome:
    """One claim's answer: its devices, or why it failed."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class DeviceHealth:
    device: str
    healthy: bool
    message: str = ""


class HealthFeed:
    """The latest health of every device of the pool, and a wake-up for every change."""

    def __init__(self, pool: str, timeout_s: float, resend_s: float) -> None:
        self.pool = pool
        self.timeout_s = timeout_s
        self.resend_s = resend_s
        self.devices: tuple[DeviceHealth, ...] = ()
        self.streams = 0  # open NodeWatchResources streams
        self._changed = asyncio.Event()

    def publish(self, devices: Sequence[DeviceHealth]) -> None:
        if tuple(devices) == self.devices:
            return
        self.devices = tuple(devices)
        self._changed.set()
        self._changed = asyncio.Event()  # the waiters hold the one just set

    async def reports(self) -> AsyncIterator[tuple[DeviceHealth, ...]]:
        """The devices now, then after every change, and every `resend_s` in between."""
        while True:
            changed = self._changed
            yield self.devices
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self.resend_s)


def _health_servicer(api: ModuleType, api_grpc: ModuleType, feed: HealthFeed) -> object:
    """DRAResourceHealth of one API version (v1 and v1alpha1 have the same messages)."""

    class Servicer(api_grpc.DRAResourceHealthServicer):  # type: ignore[name-defined,misc]
        async def NodeWatchResources(self, request: Any, context: object) -> AsyncIterator[Any]:
            feed.streams += 1
            log.info("the kubelet watches device health (%s)", api.DESCRIPTOR.package)
            try:
                async for devices in feed.reports():
                    now = int(time.time())
                    yield api.NodeWatchResourcesResponse(
                        devices=[
                            api.DeviceHealth(
                                device=api.DeviceIdentifier(
                                    pool_name=feed.pool, device_name=d.device
                                ),
                                health=api.HEALTHY if d.healthy else api.UNHEALTHY,
                                last_updated_time=now,
                                health_check_timeout_seconds=int(feed.timeout_s),
                                message=d.message[:MAX_HEALTH_MESSAGE],
                            )
                            for d in devices
                        ]
                    )
            finally:
                feed.streams -= 1

    return Servicer()


class ClaimHandler(Protocol):
    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Outcome]: ...
    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]: ...


def _refs(claims: Sequence[Any]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


def _servicer(api: ModuleType, api_grpc: ModuleType, handler: ClaimHandler) -> object:
    """The DRAPlugin service of one API version: v1 and v1beta1 have the same messages (v1
    adds `Device.share_id`, which exclusive devices leave unset)."""
    shares = "share_id" in api.Device.DESCRIPTOR.fields_by_name

    class Servicer(api_grpc.DRAPluginServicer):  # type: ignore[name-defined,misc]
        async def NodePrepareResources(self, request: Any, context: object) -> Any:
            outcomes = await handler.prepare(_refs(request.claims))
            return api.NodePrepareResourcesResponse(
                claims={
                    uid: api.NodePrepareResourceResponse(
                        devices=[
                            api.Device(
                                request_names=d.requests,
                                pool_name=d.pool,
                                device_name=d.device,
                                cdi_device_ids=d.cdi_ids,
                                **({"share_id": d.share_id} if d.share_id and shares else {}),
                            )
                            for d in o.devices
                        ],
                        error=o.error,
                    )
                    for uid, o in outcomes.items()
                }
            )

        async def NodeUnprepareResources(self, request: Any, context: object) -> Any:
            errors = await handler.unprepare(_refs(request.claims))
            return api.NodeUnprepareResourcesResponse(
                claims={
                    uid: api.NodeUnprepareResourceResponse(error=e) for uid, e in errors.items()
                }
            )

    return Servicer()


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: KubeletPlugin) -> None:
        self.plugin = plugin

    async def GetInfo(self, request: reg.InfoRequest, context: object) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.plugin.driver,
            endpoint=str(self.plugin.socket),
            supported_versions=list(self.plugin.services),
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: object
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("%s: registered with the kubelet", self.plugin.driver)
            self.plugin.registrations += 1
        else:
            log.error("%s: the kubelet refused registration: %s", self.plugin.driver, request.error)
        return reg.RegistrationStatusResponse()


class KubeletPlugin:
    """Serves a `ClaimHandler` to the kubelet and stays findable."""

    def __init__(
        self,
        driver: str,
        handler: ClaimHandler,
        *,
        plugin_dir: Path,
        registry_dir: Path,
        health: HealthFeed | None = None,
        recheck_s: float = 30.0,
    ) -> None:
        self.driver = driver
        self.services = SERVICES + (HEALTH_SERVICES if health is not None else ())
        self.socket = plugin_dir / "dra.sock"
        self.registration_socket = registry_dir / f"{driver}-reg.sock"
        self.recheck_s = recheck_s  # a safety net: inotify tells first
        self.registrations = 0

        def add_dra(server: grpc.aio.Server) -> None:
            v1_grpc.add_DRAPluginServicer_to_server(_servicer(v1, v1_grpc, handler), server)  # type: ignore[no-untyped-call]
            v1beta1_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
                _servicer(v1beta1, v1beta1_grpc, handler), server
            )
            if health is not None:
                health_v1_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
                    _health_servicer(health_v1, health_v1_grpc, health), server
                )
                health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
                    _health_servicer(health_v1alpha1, health_v1alpha1_grpc, health), server
                )

        def add_registration(server: grpc.aio.Server) -> None:
            reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server)  # type: ignore[no-untyped-call]

        self._sockets = [
            KeptSocket(self.socket, add_dra, driver, log, recheck_s=recheck_s),
            KeptSocket(
                self.registration_socket, add_registration, driver, log, recheck_s=recheck_s
            ),
        ]
        self._supervisor: Supervisor | None = None

    def _task(self, sock: KeptSocket) -> str:
        return f"dra {sock.path.name}"

    async def start(self, supervisor: Supervisor) -> None:
        """Serve the DRA API first (the kubelet dials it as soon as it sees the registration),
        then the registration; keep both served in tasks of `supervisor`. A socket that cannot
        be created is a `ServeError` here, at start."""
        for sock in self._sockets:
            await sock.serve()
        log.info(
            "%s: serving %s, registration at %s", self.driver, self.socket, self.registration_socket
        )
        self._supervisor = supervisor
        for sock in self._sockets:
            supervisor.spawn(self._task(sock), sock.run)

    async def stop(self) -> None:
        """Stop watching, stop serving (registration first), remove the sockets still ours."""
        if self._supervisor is not None:
            for sock in self._sockets:
                await self._supervisor.cancel(self._task(sock))
            self._supervisor = None
        for sock in reversed(self._sockets):
            await sock.close()
