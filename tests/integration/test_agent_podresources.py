"""The PodResources client against a stand-in kubelet served from the upstream-compatible stubs."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest

from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2 as pr
from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc
from rdmaplane.adapters.kubelet.podresources import PodResourcesClient, PodResourcesError

GPU, HCA = "nvidia.com/gpu", "rdmaplane.io/hca"


def devices(resource: str, ids: list[str], numa: int | None = None) -> pr.ContainerDevices:
    topology = pr.TopologyInfo(nodes=[pr.NUMANode(ID=numa)]) if numa is not None else None
    return pr.ContainerDevices(resource_name=resource, device_ids=ids, topology=topology)


class StandInLister(pr_grpc.PodResourcesListerServicer):
    """The kubelet's side of PodResources v1, answering from plain lists the test sets."""

    def __init__(self) -> None:
        self.pods: list[pr.PodResources] = []
        self.allocatable: list[pr.ContainerDevices] = []
        self.calls: list[str] = []

    async def List(self, request, context):
        self.calls.append("List")
        return pr.ListPodResourcesResponse(pod_resources=self.pods)

    async def GetAllocatableResources(self, request, context):
        self.calls.append("GetAllocatableResources")
        return pr.AllocatableResourcesResponse(devices=self.allocatable, cpu_ids=[0, 1])


@pytest.fixture
async def kubelet(tmp_path: Path):
    path = tmp_path / "pod-resources" / "kubelet.sock"
    path.parent.mkdir()
    lister = StandInLister()
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    yield path, lister
    await server.stop(None)


async def test_allocations_per_pod_and_allocatable_with_numa(kubelet):
    path, lister = kubelet
    lister.allocatable = [
        devices(GPU, ["GPU-a", "GPU-b"], 0),
        devices(GPU, ["GPU-c"], 1),
        devices(HCA, ["0000:19:00.0"], 0),
        devices("example.com/other", ["x"], 0),
    ]
    lister.pods = [
        pr.PodResources(
            name="train-0",
            namespace="team",
            containers=[
                pr.ContainerResources(name="main", devices=[devices(GPU, ["GPU-a"], 0)]),
                pr.ContainerResources(
                    name="side",
                    devices=[
                        devices(HCA, ["0000:19:00.0"], 0),
                        devices("example.com/other", ["x"]),
                    ],
                ),
            ],
        ),
        pr.PodResources(
            name="web",
            namespace="default",
            containers=[pr.ContainerResources(name="c", cpu_ids=[3])],
        ),
    ]
    client = PodResourcesClient(path, [GPU, HCA])
    try:
        got = await client.allocations()
    finally:
        await client.close()
    assert [p.key for p in got.pods] == ["team/train-0"]
    assert got.pods[0].devices == {GPU: frozenset({"GPU-a"}), HCA: frozenset({"0000:19:00.0"})}
    assert got.in_use(GPU) == {"GPU-a"}
    assert got.allocatable_ids(GPU) == {"GPU-a", "GPU-b", "GPU-c"}
    assert got.allocatable_ids("example.com/other") == frozenset()  # not ours: never asked for
    assert got.accounted_pods([GPU]) == ("team/train-0",)
    assert sorted(lister.calls) == ["GetAllocatableResources", "List"]


async def test_no_kubelet_is_a_clear_error(tmp_path: Path):
    client = PodResourcesClient(tmp_path / "missing.sock", [GPU], timeout_s=1.0)
    with pytest.raises(PodResourcesError, match=r"missing\.sock: socket does not exist"):
        await client.allocations()
    await client.close()


async def test_dead_kubelet_socket_is_a_clear_error(tmp_path: Path):
    """A socket file left behind by a kubelet that is gone: nobody listens."""
    path = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
    client = PodResourcesClient(path, [GPU], timeout_s=1.0)
    try:
        with pytest.raises(PodResourcesError, match=r"dead\.sock: UNAVAILABLE"):
            await client.allocations()
    finally:
        await client.close()
