"""A kubelet stand-in for DRA drivers, speaking the plugin watcher's and the DRA plugin API's
protocols from the generated stubs (wire-checked against k8s.io/kubelet v0.37.2 by
`scripts/gen-protos.sh --compare-upstream`).

It does what the kubelet's plugin manager and DRA manager do with a driver, no more: find the
registration socket in `plugins_registry/`, ask `GetInfo`, refuse what the kubelet refuses
(another plugin type, a name other than the driver's, no gRPC service it knows), pick the
service as the kubelet does (the first in the plugin's list that the kubelet supports), report
`NotifyRegistrationStatus`, dial the endpoint and call `NodePrepareResources` /
`NodeUnprepareResources` with claims named by namespace, name and UID. The optional device
health service is picked as kubelet v1.37 picks it (`pickHealthService`: the first of its own
list, v1 then v1alpha1, that the plugin advertises) and watched with `NodeWatchResources`,
the stream the kubelet's DRA manager keeps open.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

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

# What kubelet v1.37 supports, newest first (pkg/kubelet/cm/dra/plugin: servicesSupportedByKubelet).
KUBELET_SERVICES = {"v1.DRAPlugin": (v1, v1_grpc), "v1beta1.DRAPlugin": (v1beta1, v1beta1_grpc)}
# pkg/kubelet/cm/dra/plugin: healthServicesSupportedByKubelet, newest first.
KUBELET_HEALTH_SERVICES = {
    "v1.DRAResourceHealth": (health_v1, health_v1_grpc),
    "v1alpha1.DRAResourceHealth": (health_v1alpha1, health_v1alpha1_grpc),
}


CALL_TIMEOUT_S = 45.0  # the kubelet's timeout for a DRA plugin call


class Refused(Exception):
    """The kubelet would refuse this plugin; the message is why."""


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Health:
    """One device in one NodeWatchResources message."""

    pool: str
    device: str
    health: str  # HEALTHY, UNHEALTHY, UNKNOWN
    message: str
    timeout_s: int
    updated: int  # Unix seconds


@dataclass(frozen=True)
class Prepared:
    devices: tuple[
        tuple[tuple[str, ...], str, str, tuple[str, ...]], ...
    ]  # requests, pool, device, cdi
    error: str
    shares: tuple[str, ...] = ()  # v1: the share IDs of its devices held as shares


class DraKubelet:
    def __init__(self, kubelet_dir: Path, driver: str) -> None:
        self.registry = Path(kubelet_dir) / "plugins_registry"
        self.driver = driver
        self.info: reg.PluginInfo | None = None
        self.service = ""
        self.health_service = ""  # "" : the plugin serves no health stream
        self._channel: grpc.aio.Channel | None = None  # one, as the kubelet keeps one

    async def register(self, within_s: float = 30.0) -> reg.PluginInfo:
        """Register the driver as the kubelet does, once its registration socket answers (a
        socket a killed driver left behind refuses connections until the next one serves)."""
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            try:
                return await self._register_once()
            except (FileNotFoundError, grpc.aio.AioRpcError) as e:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"no driver registered in {within_s} s: {e}") from e
                await asyncio.sleep(0.1)

    async def _register_once(self) -> reg.PluginInfo:
        # As the kubelet's plugin watcher: a name starting with "." is not a plugin (it is where a
        # driver binds its socket before renaming it into place).
        found = self.registry.glob("*.sock") if self.registry.is_dir() else []
        sockets = sorted(s for s in found if not s.name.startswith("."))
        if not sockets:
            raise FileNotFoundError(f"no registration socket in {self.registry}")
        (socket,) = sockets
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            watcher = reg_grpc.RegistrationStub(channel)
            info = await watcher.GetInfo(reg.InfoRequest(), timeout=5)
            try:
                self.service = self._validate(info)
                self.health_service = next(
                    (s for s in KUBELET_HEALTH_SERVICES if s in info.supported_versions), ""
                )
            except Refused as e:
                await watcher.NotifyRegistrationStatus(
                    reg.RegistrationStatus(plugin_registered=False, error=str(e)), timeout=5
                )
                raise
            await watcher.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=True), timeout=5
            )
        self.info = info
        if self._channel is not None:
            await self._channel.close()
        self._channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
        return info

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def _validate(self, info: reg.PluginInfo) -> str:
        if info.type != "DRAPlugin":
            raise Refused(f"plugin type {info.type!r}")
        if info.name != self.driver:
            raise Refused(f"registered as {info.name!r}, not as the driver {self.driver!r}")
        chosen = next((s for s in info.supported_versions if s in KUBELET_SERVICES), None)
        if chosen is None:
            raise Refused(f"none of {list(info.supported_versions)} is supported")
        return chosen

    def _api(self, service: str | None) -> tuple[ModuleType, ModuleType]:
        return KUBELET_SERVICES[service or self.service]

    async def prepare(
        self, claims: Sequence[Claim], service: str | None = None
    ) -> dict[str, Prepared]:
        """One NodePrepareResources call (within the kubelet's own 45 s)."""
        api, api_grpc = self._api(service)
        request = api.NodePrepareResourcesRequest(claims=[_claim(api, c) for c in claims])
        response = await api_grpc.DRAPluginStub(self._dialled()).NodePrepareResources(
            request, timeout=CALL_TIMEOUT_S
        )
        return {
            uid: Prepared(
                tuple(
                    (tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids))
                    for d in r.devices
                ),
                r.error,
                tuple(d.share_id for d in r.devices if d.share_id) if api is v1 else (),
            )
            for uid, r in response.claims.items()
        }

    async def unprepare(
        self, claims: Sequence[Claim], service: str | None = None
    ) -> dict[str, str]:
        api, api_grpc = self._api(service)
        request = api.NodeUnprepareResourcesRequest(claims=[_claim(api, c) for c in claims])
        response = await api_grpc.DRAPluginStub(self._dialled()).NodeUnprepareResources(
            request, timeout=CALL_TIMEOUT_S
        )
        return {uid: r.error for uid, r in response.claims.items()}

    async def watch_health(self, service: str | None = None) -> AsyncGenerator[list[Health], None]:
        """The NodeWatchResources stream of the chosen (or the given) health service."""
        name = service or self.health_service
        assert name, "the plugin advertises no health service"
        api, api_grpc = KUBELET_HEALTH_SERVICES[name]
        stream = api_grpc.DRAResourceHealthStub(self._dialled()).NodeWatchResources(
            api.NodeWatchResourcesRequest()
        )
        try:
            async for response in stream:
                yield [
                    Health(
                        d.device.pool_name,
                        d.device.device_name,
                        api.HealthStatus.Name(d.health),
                        d.message,
                        d.health_check_timeout_seconds,
                        d.last_updated_time,
                    )
                    for d in response.devices
                ]
        finally:
            stream.cancel()

    def _dialled(self) -> grpc.aio.Channel:
        assert self._channel is not None, "register first"
        return self._channel


def _claim(api: ModuleType, c: Claim) -> object:
    return api.Claim(namespace=c.namespace, name=c.name, uid=c.uid)
