"""Client of the kubelet's PodResources API (`v1.PodResourcesLister` on a unix socket)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import grpc

from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2, api_pb2_grpc
from rdmaplane.core.allocation import Allocations, merge_containers
from rdmaplane.core.errors import RdmaplaneError


class PodResourcesError(RdmaplaneError):
    """The kubelet's PodResources socket did not answer; the message says which and why."""


class PodResourcesClient:
    """Asks the kubelet which devices exist and which pods hold them, restricted to the
    resources the agent publishes (other resources' device IDs are not its business)."""

    def __init__(self, socket: Path, resources: Iterable[str], timeout_s: float = 5.0) -> None:
        self.socket = socket
        self.resources = frozenset(resources)
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> api_pb2_grpc.PodResourcesListerStub:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket}")
        return api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def allocations(self) -> Allocations:
        """Both calls' answers; raises PodResourcesError when the kubelet cannot be reached."""
        if not self.socket.exists():  # no kubelet (yet): spare gRPC its reconnect attempts
            raise PodResourcesError(f"PodResources at {self.socket}: socket does not exist")
        stub = self._stub()
        try:
            listed = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
            allocatable = await stub.GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as e:
            raise PodResourcesError(
                f"PodResources at {self.socket}: {e.code().name}: {e.details()}"
            ) from e
        pods = []
        for pod in listed.pod_resources:
            devices = merge_containers(
                pod.namespace,
                pod.name,
                (
                    [(d.resource_name, d.device_ids) for d in c.devices if self._ours(d)]
                    for c in pod.containers
                ),
            )
            if devices.devices:
                pods.append(devices)
        ids: dict[str, set[str]] = {r: set() for r in self.resources}
        for d in allocatable.devices:
            if self._ours(d):
                ids[d.resource_name].update(d.device_ids)
        return Allocations(
            pods=tuple(sorted(pods, key=lambda p: p.key)),
            allocatable={r: frozenset(v) for r, v in ids.items()},
        )

    def _ours(self, d: api_pb2.ContainerDevices) -> bool:
        return d.resource_name in self.resources
