"""The driver's kubelet-facing side: the DRA plugin API on a unix socket, and registration.

Two sockets, as the kubelet's plugin manager expects of a DRA driver:

* `<kubelet>/plugins_registry/<driver>-reg.sock`: the plugin watcher's `Registration`
  service. The kubelet finds the socket itself, asks `GetInfo` (type `DRAPlugin`, the driver's
  name, the endpoint below, and the gRPC services offered: `v1.DRAPlugin` and
  `v1beta1.DRAPlugin`, newest first; the kubelet takes the newest it knows) and reports back
  with `NotifyRegistrationStatus`.
* `<kubelet>/plugins/<driver>/dra.sock`: `NodePrepareResources` and `NodeUnprepareResources`,
  in both API versions, answered by one `ClaimHandler`.

Every claim of a batch gets its own entry in the answer, error or not; the RPC itself fails only
if the batch cannot be looked at at all. Sockets are renamed into place and watched by inotify
(`rdmaplane.kubelet.sockets`): one that disappears (someone cleaned the folder) is served again
at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import grpc

from rdmaplane.dra.claims import ClaimRef, PreparedDevice
from rdmaplane.kubelet.api.dra.v1 import api_pb2 as v1
from rdmaplane.kubelet.api.dra.v1 import api_pb2_grpc as v1_grpc
from rdmaplane.kubelet.api.dra.v1beta1 import api_pb2 as v1beta1
from rdmaplane.kubelet.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from rdmaplane.kubelet.api.pluginregistration.v1 import api_pb2 as reg
from rdmaplane.kubelet.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from rdmaplane.kubelet.sockets import FolderEvents, ServeError, inode, serve
from rdmaplane.supervisor import Supervisor

log = logging.getLogger("rdmaplane.dra")
PLUGIN_TYPE = "DRAPlugin"
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # newest first


@dataclass(frozen=True)
class Outcome:
    """One claim's answer: its devices, or why it failed."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimHandler(Protocol):
    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Outcome]: ...
    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]: ...


def _refs(claims: Sequence[Any]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


def _servicer(api: ModuleType, api_grpc: ModuleType, handler: ClaimHandler) -> object:
    """The DRAPlugin service of one API version: v1 and v1beta1 have the same messages (v1
    adds `Device.share_id`, which exclusive devices leave unset)."""

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
            supported_versions=list(SERVICES),
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


class _Socket:
    """One gRPC server on one unix socket, served again at once when the file goes away."""

    def __init__(self, path: Path, add: Callable[[grpc.aio.Server], None], owner: str) -> None:
        self.path = path
        self.add = add
        self.owner = owner
        self.server: grpc.aio.Server | None = None
        self.served: tuple[int, int] | None = None

    async def serve(self) -> None:
        server, self.served = await serve(self.path, self.add, self.owner)
        old, self.server = self.server, server
        if old is not None:
            await old.stop(grace=None)

    async def close(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=0.2)
            self.server = None
        if self.served is not None and inode(self.path) == self.served:  # still ours
            with contextlib.suppress(OSError):
                self.path.unlink()

    async def stay_served(self, recheck_s: float) -> None:
        """Serve again whenever the socket vanished; woken by inotify on its folder."""
        with FolderEvents(self.path.parent, self.path.parent.parent) as events:
            while True:
                events.watch()
                if inode(self.path) != self.served:
                    log.warning("%s: socket %s vanished; serving again", self.owner, self.path)
                    await self._serve_retrying(recheck_s)
                await events.created(recheck_s)

    async def _serve_retrying(self, max_delay: float) -> None:
        delay = 0.05
        while True:
            try:
                await self.serve()
                return
            except ServeError as e:
                log.warning("%s; retrying in %g s", e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, max_delay)


class KubeletPlugin:
    """Serves a `ClaimHandler` to the kubelet and stays findable."""

    def __init__(
        self,
        driver: str,
        handler: ClaimHandler,
        *,
        plugin_dir: Path,
        registry_dir: Path,
        recheck_s: float = 30.0,
    ) -> None:
        self.driver = driver
        self.socket = plugin_dir / "dra.sock"
        self.registration_socket = registry_dir / f"{driver}-reg.sock"
        self.recheck_s = recheck_s  # a safety net: inotify tells first
        self.registrations = 0

        def add_dra(server: grpc.aio.Server) -> None:
            v1_grpc.add_DRAPluginServicer_to_server(_servicer(v1, v1_grpc, handler), server)  # type: ignore[no-untyped-call]
            v1beta1_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
                _servicer(v1beta1, v1beta1_grpc, handler), server
            )

        def add_registration(server: grpc.aio.Server) -> None:
            reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server)  # type: ignore[no-untyped-call]

        self._sockets = [
            _Socket(self.socket, add_dra, driver),
            _Socket(self.registration_socket, add_registration, driver),
        ]
        self._supervisor: Supervisor | None = None

    def _task(self, sock: _Socket) -> str:
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
            supervisor.spawn(self._task(sock), functools.partial(sock.stay_served, self.recheck_s))

    async def stop(self) -> None:
        """Stop watching, stop serving (registration first), remove the sockets still ours."""
        if self._supervisor is not None:
            for sock in self._sockets:
                await self._supervisor.cancel(self._task(sock))
            self._supervisor = None
        for sock in reversed(self._sockets):
            await sock.close()
