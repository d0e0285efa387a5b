"""A GPU device plugin stand-in: `nvidia.com/gpu` as NVIDIA's plugin announces it.

A real peer of the device plugin protocol, built from the same generated v1beta1 stubs as our own
plugin: it serves `DevicePlugin` on `<plugin-dir>/<name>.sock` and registers at the kubelet's
`kubelet.sock`. One device per GPU, its ID the GPU's UUID (the PCI address when NVML gave none,
as `agent.inventory.gpu_ids` assumes), its topology the GPU's NUMA node (none when unknown), as
NVIDIA's plugin reports them.

Which GPUs it prefers when the kubelet asks (`GetPreferredAllocation`) is a choice, because the
harness tests show what the kubelet does with a preference, not what NVIDIA's allocator would
pick on a machine we cannot run:

- `index`: the must-include GPUs, then the lowest GPU indices (PCI bus order) offered;
- `reverse`: the must-include GPUs, then the highest indices (a plugin that prefers other GPUs
  than the NICs' plugin does);
- `none`: it does not implement GetPreferredAllocation, so the kubelet picks on its own.

Every GetPreferredAllocation and Allocate it answers is recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

RESOURCE = "nvidia.com/gpu"
PREFERENCES = ("index", "reverse", "none")


@dataclass(frozen=True, slots=True)
class Gpu:
    id: str
    numa: int | None


@dataclass(frozen=True, slots=True)
class PreferredCall:
    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int
    answer: tuple[str, ...]


@dataclass
class GpuPluginStandIn(dp_grpc.DevicePluginServicer):
    gpus: Sequence[Gpu]  # in index order
    plugin_dir: Path
    preference: str = "index"
    resource: str = RESOURCE
    preferred_calls: list[PreferredCall] = field(default_factory=list)
    allocated: list[tuple[str, ...]] = field(default_factory=list)
    _server: grpc.aio.Server | None = None

    def __post_init__(self) -> None:
        if self.preference not in PREFERENCES:
            raise ValueError(f"preference {self.preference!r}: one of {', '.join(PREFERENCES)}")

    @property
    def socket(self) -> Path:
        return self.plugin_dir / "nvidia-gpu.sock"

    async def start(self) -> None:
        """Serve, then register (the kubelet dials back at once, so serving comes first)."""
        server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server
        async with grpc.aio.insecure_channel(f"unix://{self.plugin_dir / 'kubelet.sock'}") as ch:
            await dp_grpc.RegistrationStub(ch).Register(
                dp.RegisterRequest(
                    version="v1beta1",
                    endpoint=self.socket.name,
                    resource_name=self.resource,
                    options=self._options(),
                ),
                timeout=30,
            )

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    def _options(self) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(get_preferred_allocation_available=self.preference != "none")

    # --- the DevicePlugin service
    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: object
    ) -> dp.DevicePluginOptions:
        return self._options()

    async def ListAndWatch(
        self, request: dp.Empty, context: object
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        yield dp.ListAndWatchResponse(devices=[_device(g) for g in self.gpus])
        await asyncio.Event().wait()  # the list never changes; the stream stays open

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: object
    ) -> dp.PreferredAllocationResponse:
        rank = {g.id: i for i, g in enumerate(self.gpus)}
        responses = []
        for r in request.container_requests:
            must = list(dict.fromkeys(r.must_include_deviceIDs))
            rest = sorted(
                (i for i in r.available_deviceIDs if i not in must),
                key=lambda i: rank.get(i, len(rank)),
                reverse=self.preference == "reverse",
            )
            answer = (must + rest)[: r.allocation_size]
            self.preferred_calls.append(
                PreferredCall(
                    tuple(sorted(r.available_deviceIDs)),
                    tuple(sorted(must)),
                    r.allocation_size,
                    tuple(sorted(answer)),
                )
            )
            responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=answer))
        return dp.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: dp.AllocateRequest, context: object) -> dp.AllocateResponse:
        responses = []
        for r in request.container_requests:
            self.allocated.append(tuple(sorted(r.devices_ids)))
            responses.append(
                dp.ContainerAllocateResponse(
                    envs={"NVIDIA_VISIBLE_DEVICES": ",".join(r.devices_ids)}
                )
            )
        return dp.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: object
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()


def _device(gpu: Gpu) -> dp.Device:
    topology = dp.TopologyInfo(nodes=[dp.NUMANode(ID=gpu.numa)]) if gpu.numa is not None else None
    return dp.Device(ID=gpu.id, health="Healthy", topology=topology)
