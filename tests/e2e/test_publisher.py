"""The agent's publisher against the real API server, on what keeps a fleet of agents from
acting in step (docs/agent.md): a change to the NRT alone held back (`nrtMinInterval`,
`writeJitter`) until a change that must not wait takes it along; API Priority and Fairness
turning the agent away with 429 (a FlowSchema of this test's own sending its user to a
priority level without seats that rejects): the same write retried, not counted as a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_global_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

from rdmaplane import nrt
from rdmaplane.agent.desired import Condition
from rdmaplane.agent.metrics import AgentMetrics, NodeView
from rdmaplane.agent.publisher import Desired, Publisher
from rdmaplane.config import PublishConfig
from rdmaplane.kube import NodeResourceTopology, async_client
from rdmaplane.scheduler.layouts import layout
from tests.e2e.controlplane import KubeCluster
from tests.e2e.test_agent import condition, eventually, install_rbac

THROTTLED_USER = "e2e-throttled-agent"
BUSY_REQUESTS = 8  # the user's requests in flight besides the publisher's
FlowSchema = create_global_resource(
    "flowcontrol.apiserver.k8s.io", "v1", "FlowSchema", "flowschemas"
)
PriorityLevel = create_global_resource(
    "flowcontrol.apiserver.k8s.io",
    "v1",
    "PriorityLevelConfiguration",
    "prioritylevelconfigurations",
)


def _desired(node: str, free_gpus: int = 4, ready: bool = True) -> Desired:
    obj = nrt.to_object(layout("hgx", node, policy="single-numa-node"))
    obj = copy.deepcopy(obj)
    for res in obj["zones"][0]["resources"]:
        if res["name"] == nrt.GPU:
            res["available"] = str(free_gpus)
    why = "AllDevicesHealthy" if ready else "PortDown"
    return Desired({}, {}, Condition(ready, why, "e2e"), obj)


async def _server_gpus(kube: AsyncClient, node: str) -> str:
    obj = (await kube.get(NodeResourceTopology, node)).to_dict()
    zone = obj["zones"][0]
    return next(r["available"] for r in zone["resources"] if r["name"] == nrt.GPU)


async def _server_ready(kube: AsyncClient, node: str) -> str | None:
    found = condition(await kube.get(Node, node))
    return found.status if found is not None else None


async def _condition_is(kube: AsyncClient, node: str, status: str) -> bool:
    return await _server_ready(kube, node) == status


@contextlib.asynccontextmanager
async def _publishing(
    kubeconfig: Path, node: str, config: PublishConfig, first: Desired
) -> AsyncIterator[Publisher]:
    """A publisher for `node`, running, its first state written."""
    metrics = AgentMetrics(lambda: NodeView("", None, {}, None))
    async with async_client(kubeconfig) as client:
        publisher = Publisher(client, node, config, metrics)
        publisher.set_desired(first)
        task = asyncio.create_task(publisher.run())
        try:
            yield publisher
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.fixture
async def node(kube: AsyncClient, nrt_crd: object) -> AsyncIterator[str]:
    name = f"pub-{uuid.uuid4().hex[:6]}"
    await kube.create(Node(metadata=ObjectMeta(name=name)))
    yield name
    await kube.delete(Node, name)
    with contextlib.suppress(ApiError):  # never written if the test failed early
        await kube.delete(NodeResourceTopology, name)


@pytest.fixture(scope="module")
def agent_kubeconfig(kube_cluster: KubeCluster, nrt_crd: object) -> Path:
    return install_rbac(kube_cluster)


@pytest.mark.parametrize(
    ("config", "holding"),
    [
        (PublishConfig(nrt_min_interval_s=3600.0, write_jitter_s=0.0), "NRT update held back"),
        (PublishConfig(nrt_min_interval_s=0.0, write_jitter_s=3600.0), "NRT-only change"),
    ],
    ids=["nrtMinInterval", "writeJitter"],
)
async def test_an_nrt_change_waits_until_the_condition_changes(
    kube: AsyncClient,
    node: str,
    agent_kubeconfig: Path,
    caplog: pytest.LogCaptureFixture,
    config: PublishConfig,
    holding: str,
) -> None:
    """A pod started (the NRT alone changes): held back for an hour, by the minimum interval
    since the last NRT update or by the write jitter; then the condition changes: it goes at
    once, and takes the NRT along."""
    caplog.set_level(logging.DEBUG, logger="rdmaplane.agent.publisher")
    async with _publishing(agent_kubeconfig, node, config, _desired(node)) as publisher:
        await asyncio.wait_for(publisher.in_sync.wait(), 30)
        publisher.set_desired(_desired(node, free_gpus=2))
        await eventually(lambda: _logged(caplog, holding))
        assert await _server_gpus(kube, node) == "4" and not publisher.in_sync.is_set()
        publisher.set_desired(_desired(node, free_gpus=2, ready=False))
        await asyncio.wait_for(publisher.in_sync.wait(), 30)
    assert (await _server_gpus(kube, node), await _server_ready(kube, node)) == ("2", "False")


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records)


@pytest.fixture
async def throttled_kubeconfig(
    kube_cluster: KubeCluster, kube: AsyncClient, agent_kubeconfig: Path
) -> AsyncIterator[Path]:
    """A user with the agent's ClusterRole that API Priority and Fairness rejects while
    `reject` (below) is in place."""
    binding = ClusterRoleBinding.from_dict(
        {
            "metadata": {"name": THROTTLED_USER},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "rdmaplane-agent",
            },
            "subjects": [
                {"kind": "User", "name": THROTTLED_USER, "apiGroup": "rbac.authorization.k8s.io"}
            ],
        }
    )
    await kube.create(binding)
    yield kube_cluster.kubeconfig_for(THROTTLED_USER)
    await kube.delete(ClusterRoleBinding, THROTTLED_USER)


@contextlib.asynccontextmanager
async def _rejecting(kube: AsyncClient, kubeconfig: Path) -> AsyncIterator[None]:
    """A priority level with no seats of its own that rejects, a FlowSchema sending the user
    there, and that user's requests keeping it busy: APF lets a request run there only while
    none does (upstream queueset.canAccommodateSeatsLocked), so the publisher's meet 429s.
    Returns once one was seen; lifts it all on the way out."""
    name = f"e2e-reject-{uuid.uuid4().hex[:5]}"
    await kube.create(
        PriorityLevel.from_dict(
            {
                "metadata": {"name": name},
                "spec": {
                    "type": "Limited",
                    "limited": {
                        "nominalConcurrencyShares": 0,
                        "lendablePercent": 0,
                        "borrowingLimitPercent": 0,
                        "limitResponse": {"type": "Reject"},
                    },
                },
            }
        )
    )
    rule = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True}
    await kube.create(
        FlowSchema.from_dict(
            {
                "metadata": {"name": name},
                "spec": {
                    "priorityLevelConfiguration": {"name": name},
                    "matchingPrecedence": 100,
                    "rules": [
                        {
                            "subjects": [{"kind": "User", "user": {"name": THROTTLED_USER}}],
                            "resourceRules": [{**rule, "namespaces": ["*"]}],
                        }
                    ],
                },
            }
        )
    )

    rejections = 0
    client = async_client(kubeconfig)

    async def busy() -> None:
        nonlocal rejections
        while True:
            try:
                await _list_nodes(client)
            except httpx2.HTTPStatusError as e:
                rejections += e.response is not None and e.response.status_code == 429

    load = [asyncio.create_task(busy()) for _ in range(BUSY_REQUESTS)]
    try:
        await eventually(lambda: _true(rejections > 0), 60)
        yield
    finally:
        for task in load:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)
        await client.close()
        await kube.delete(FlowSchema, name)
        await kube.delete(PriorityLevel, name)


async def test_a_429_is_retried_with_the_same_state_and_is_no_failure(
    kube: AsyncClient,
    node: str,
    throttled_kubeconfig: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rdmaplane.agent.publisher")

    def throttles() -> int:
        return sum("asked to slow down (429" in r.getMessage() for r in caplog.records)

    config = PublishConfig(backoff_initial_s=0.2, backoff_max_s=1.0, write_jitter_s=0.0)
    ready = True
    async with _publishing(throttled_kubeconfig, node, config, _desired(node)) as publisher:
        await asyncio.wait_for(publisher.in_sync.wait(), 30)
        async with _rejecting(kube, throttled_kubeconfig):
            deadline = asyncio.get_running_loop().time() + 60
            while throttles() < 3:  # a write meets a 429 when another request holds the seat
                assert asyncio.get_running_loop().time() < deadline, "no 429 within 60 s"
                ready = not ready
                publisher.set_desired(_desired(node, ready=ready))
                await asyncio.wait_for(publisher.in_sync.wait(), 60)
                assert publisher.failures == 0
        ready = not ready
        publisher.set_desired(_desired(node, ready=ready))
        await asyncio.wait_for(publisher.in_sync.wait(), 60)
    assert await _server_ready(kube, node) == str(ready)
    messages = [r.getMessage() for r in caplog.records]
    assert not any("publishing to the API server failed" in m for m in messages)


async def _true(value: bool) -> bool:
    return value


async def _list_nodes(client: AsyncClient) -> None:
    async for _ in client.list(Node):
        pass
