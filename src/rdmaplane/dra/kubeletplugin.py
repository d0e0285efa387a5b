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
if the batch cannot be looked at at all. A socket that disappears (someone cleaned the folder)
is served again on a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
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


class ServeError(RuntimeError):
    """A socket cannot be created (folder not writable, path too long for a unix socket, …)."""


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


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


class _Socket:
    """One gRPC server on one unix socket, served again when the file goes away."""

    def __init__(self, path: Path, add: list[object]) -> None:
        self.path = path
        self.add = add
        self.server: grpc.aio.Server | None = None
        self.identity: tuple[int, int] | None = None

    async def serve(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # a stale socket from an earlier run
        except OSError as e:
            raise ServeError(f"cannot serve on {self.path}: {e.strerror or e}") from e
        server = grpc.aio.server()
        for add in self.add:
            add(server)  # type: ignore[operator]
        try:
            server.add_insecure_port(f"unix://{self.path}")
        except RuntimeError as e:  # grpc: "Failed to bind to address ..."
            raise ServeError(f"cannot serve on {self.path}: {e}") from e
        await server.start()
        self.server, self.identity = server, _identity(self.path)

    async def close(self, remove: bool) -> None:
        if self.server is not None:
            await self.server.stop(grace=0.2)
            self.server = None
        if remove and _identity(self.path) == self.identity:
            with contextlib.suppress(OSError):
                self.path.unlink()

    async def keep(self) -> None:
        if _identity(self.path) != self.identity:
            log.warning("socket %s vanished; serving again", self.path)
            await self.close(remove=False)
            await self.serve()


class KubeletPlugin:
    """Serves a `ClaimHandler` to the kubelet and stays findable."""

    def __init__(
        self,
        driver: str,
        handler: ClaimHandler,
        *,
        plugin_dir: Path,
        registry_dir: Path,
        watch_interval: float = 1.0,
    ) -> None:
        self.driver = driver
        self.socket = plugin_dir / "dra.sock"
        self.registration_socket = registry_dir / f"{driver}-reg.sock"
        self.watch_interval = watch_interval
        self.registrations = 0
        self._sockets = [
            _Socket(
                self.socket,
                [
                    lambda s: v1_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
                        _servicer(v1, v1_grpc, handler), s
                    ),
                    lambda s: v1beta1_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
                        _servicer(v1beta1, v1beta1_grpc, handler), s
                    ),
                ],
            ),
            _Socket(
                self.registration_socket,
                [lambda s: reg_grpc.add_RegistrationServicer_to_server(_Registration(self), s)],  # type: ignore[no-untyped-call]
            ),
        ]
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve the DRA API first: the kubelet dials it as soon as it sees the registration."""
        for sock in self._sockets:
            await sock.serve()
        log.info(
            "%s: serving %s, registration at %s", self.driver, self.socket, self.registration_socket
        )
        self._task = asyncio.create_task(self._watch(), name=f"dra:{self.driver}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for sock in reversed(self._sockets):  # unregister first
            await sock.close(remove=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.watch_interval)
            for sock in self._sockets:
                try:
                    await sock.keep()
                except ServeError as e:
                    log.error("%s", e)
