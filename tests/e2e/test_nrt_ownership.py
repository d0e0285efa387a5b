"""The agent's NodeResourceTopology among other writers, against the real API server: it belongs
to its Node (an owner reference; kube-controller-manager's garbage collector deletes it with the
Node), and when another program writes the same object (NFD's topology-updater: same name,
same kind) the agent leaves it alone and says so, never a tug of war; once the other writer's
object is gone, the agent writes its own again."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node

from rdmaplane.adapters.kube import NodeResourceTopology, async_client
from rdmaplane.core import nrt
from rdmaplane.core.settings.agent import PublishSettings
from rdmaplane.services.agent.publisher import Publisher
from tests.e2e.controlplane import KubeCluster, launch_controller_manager
from tests.e2e.test_agent import eventually, install_rbac
from tests.e2e.test_publisher import _desired, _publishing
from tests.layouts import layout

NFD = "nfd-topology-updater"  # the field manager NFD's topology-updater writes as
NFD_ATTRIBUTE = {"name": "nodeTopologyPodsFingerprint", "value": "pfp0v0010123456789abcdef"}
RESYNC = PublishSettings(resync_interval_s=1.0, backoff_initial_s=0.2, backoff_max_s=1.0)


@pytest.fixture(scope="module")
def agent_kubeconfig(kube_cluster: KubeCluster, nrt_crd: object) -> Path:
    return install_rbac(kube_cluster)


@pytest.fixture
async def bare_node(kube: AsyncClient, nrt_crd: object) -> AsyncIterator[str]:
    """A Node (and, after the test, neither it nor its NRT)."""
    name = f"own-{uuid.uuid4().hex[:6]}"
    await kube.create(Node(metadata=ObjectMeta(name=name)))
    yield name
    for kind in (Node, NodeResourceTopology):
        with contextlib.suppress(ApiError):
            await kube.delete(kind, name)


async def _stored(kube: AsyncClient, node: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = (await kube.get(NodeResourceTopology, node)).to_dict()
    except ApiError as e:
        if e.status.code == 404:
            return None
        raise
    return found


async def _nfd_writes(cluster: KubeCluster, node: str) -> str:
    """What NFD's topology-updater does each period: create or update the node's NRT, as its
    own field manager, with content of its own (its pods fingerprint). The new resourceVersion."""
    body = nrt.to_object(layout("hgx", node, policy="best-effort", scope="pod"))
    body["attributes"] = [*body["attributes"], NFD_ATTRIBUTE]
    async with async_client(cluster.kubeconfig, field_manager=NFD) as nfd:
        try:
            current = await nfd.get(NodeResourceTopology, node)
        except ApiError:
            written = await nfd.create(NodeResourceTopology(body))
        else:
            assert current.metadata is not None
            body["metadata"]["resourceVersion"] = current.metadata.resourceVersion
            written = await nfd.replace(NodeResourceTopology(body))
    assert written.metadata is not None and written.metadata.resourceVersion is not None
    return written.metadata.resourceVersion


def _nfds(obj: dict[str, Any] | None) -> bool:
    return obj is not None and NFD_ATTRIBUTE in obj.get("attributes", [])


def _flag(publisher: Publisher) -> float | None:
    return publisher.metrics.registry.get_sample_value("rdmaplane_agent_nrt_written_by_others")


async def test_the_nrt_belongs_to_its_node_and_goes_with_it(
    kube: AsyncClient, kube_cluster: KubeCluster, bare_node: str, agent_kubeconfig: Path
) -> None:
    async with _publishing(agent_kubeconfig, bare_node, RESYNC, _desired(bare_node)) as publisher:
        await asyncio.wait_for(publisher.in_sync.wait(), 30)
    node = await kube.get(Node, bare_node)
    assert node.metadata is not None
    stored = await _stored(kube, bare_node)
    assert stored is not None and stored["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": bare_node, "uid": node.metadata.uid}
    ]
    collector = launch_controller_manager(kube_cluster, ("garbage-collector-controller",))
    try:
        await kube.delete(Node, bare_node)

        async def gone() -> bool:
            return await _stored(kube, bare_node) is None

        await eventually(gone, 120)
    finally:
        collector.stop()


async def test_another_writer_is_left_alone_until_its_object_is_gone(
    kube: AsyncClient, kube_cluster: KubeCluster, bare_node: str, agent_kubeconfig: Path
) -> None:
    node = bare_node
    version = await _nfd_writes(kube_cluster, node)  # NFD was there first
    async with _publishing(agent_kubeconfig, node, RESYNC, _desired(node)) as publisher:
        await asyncio.wait_for(publisher.in_sync.wait(), 30)
        await asyncio.sleep(3 * RESYNC.resync_interval_s)  # three read-backs: none writes it
        stored = await _stored(kube, node)
        assert stored is not None and stored["metadata"]["resourceVersion"] == version
        assert _flag(publisher) == 1
        events = kube.list(Event, namespace="default", fields={"involvedObject.name": node})
        warned = [e.message or "" async for e in events if e.reason == "NRTWrittenByOthers"]
        assert len(warned) == 1 and f"also written by {NFD}" in warned[0]

        await kube.delete(NodeResourceTopology, node)  # handed back: the agent writes its own

        async def agents() -> bool:
            stored = await _stored(kube, node)
            return stored is not None and not _nfds(stored)

        await eventually(agents, 30)
        assert _flag(publisher) == 0

        version = await _nfd_writes(kube_cluster, node)  # NFD comes back: the agent steps aside
        publisher.set_desired(_desired(node, free_gpus=2))  # and has something new to write

        async def stepped_aside() -> bool:
            return _flag(publisher) == 1

        await eventually(stepped_aside, 30)
        await asyncio.sleep(3 * RESYNC.resync_interval_s)
        stored = await _stored(kube, node)
        assert stored is not None and stored["metadata"]["resourceVersion"] == version
