"""The agent's publisher against the real API server, on what keeps a fleet of agents from
acting in step (docs/agent.md): a change to the NRT alone held back (`nrtMinInterval`,
`writeJitter`) until a change that must not wait takes it along; API Priority and Fairness
turning the agent away with 429 (a FlowSchema of this test's own sending its user to a
priority level without seats that rejects): the same write retried, not counted as a failure.
And, judged by the real kube-scheduler with the extender, an NRT write that frees devices
stamps the Node, so a pod refused meanwhile is looked at again at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
import yaml
from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_global_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.resources.core_v1 import Pod as PodResource
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

from rdmaplane.adapters.kube import NodeResourceTopology, async_client
from rdmaplane.core import nrt
from rdmaplane.core.settings.agent import PublishSettings
from rdmaplane.services.agent.metrics import AgentMetrics, NodeView
from rdmaplane.services.agent.policy.desired import Condition
from rdmaplane.services.agent.publisher import FREED_ANNOTATION, Desired, Publisher
from tests.e2e.controlplane import KubeCluster, Process, add_ready_node
from tests.e2e.test_agent import condition, eventually, install_rbac
from tests.e2e.test_scheduler_extender import (
    _bound,
    _failed_scheduling,
    _scheduler_config,
    in_process_extender,
)
from tests.layouts import layout
from tests.scheduler_helpers import pod

THROTTLED_USER = "e2e-throttled-agent"
# The Retry-After APF sends while drops stay few: it doubles (up to 32 s) once a priority level
# drops 3 x Retry-After requests in Retry-After seconds (upstream dropped_requests_tracker.go).
# Every client here waits that long after a 429 and two run, so at most 2 drop per second: it
# stays 1 s, and the publisher's waits follow from the settings the test gives it.
RETRY_AFTER_S = 1.0
SCHEMA_HEADER = "X-Kubernetes-PF-FlowSchema-UID"  # which FlowSchema classified a request
HOLD_S = 0.5  # how long each of the load's requests holds the level's one seat
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
    kubeconfig: Path, node: str, config: PublishSettings, first: Desired
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
        (PublishSettings(nrt_min_interval_s=3600.0, write_jitter_s=0.0), "NRT update held back"),
        (PublishSettings(nrt_min_interval_s=0.0, write_jitter_s=3600.0), "NRT-only change"),
    ],
    ids=["nrtMinInterval", "writeJitter"],
)
async def test_an_nrt_change_waits_until_the_condition_changes(
    kube: AsyncClient,
    node: str,
    agent_kubeconfig: Path,
    caplog: pytest.LogCaptureFixture,
    config: PublishSettings,
    holding: str,
) -> None:
    """A pod started (the NRT alone changes): held back for an hour, by the minimum interval
    since the last NRT update or by the write jitter; then the condition changes: it goes at
    once, and takes the NRT along."""
    caplog.set_level(logging.DEBUG, logger="rdmaplane.services.agent.publisher")
    async with _publishing(agent_kubeconfig, node, config, _desired(node)) as publisher:
        await asyncio.wait_for(publisher.in_sync.wait(), 30)
        publisher.set_desired(_desired(node, free_gpus=2))
        await eventually(lambda: _logged(caplog, holding))
        assert await _server_gpus(kube, node) == "4" and not publisher.in_sync.is_set()
        publisher.set_desired(_desired(node, free_gpus=2, ready=False))
        await asyncio.wait_for(publisher.in_sync.wait(), 30)
    assert (await _server_gpus(kube, node), await _server_ready(kube, node)) == ("2", "False")


async def test_a_pod_refused_while_an_ended_pods_devices_were_published_binds_once_freed(
    kube: AsyncClient,
    namespace: str,
    kube_cluster: KubeCluster,
    agent_kubeconfig: Path,
    start_scheduler: Callable[..., Process],
) -> None:
    """The node's NRT still counts an ended pod's devices, so the extender refuses the next
    pod; the agent then writes the NRT that frees them. kube-scheduler looks again at a pod the
    extender refused only on a Pod or Node event (an NRT's is neither), so without the Node's
    stamp it would wait for its 5-minute flush: bound within 30 s, on the stamp."""
    name = f"freed-{uuid.uuid4().hex[:6]}"
    await add_ready_node(kube, name, {}, {nrt.GPU: "8", nrt.HCA: "8"})
    free = nrt.to_object(layout("hgx", name, policy="single-numa-node"))
    held = copy.deepcopy(free)
    for zone in held["zones"]:
        for res in zone["resources"]:
            res["available"] = "0"
    healthy = Condition(True, "AllDevicesHealthy", "e2e")
    config = PublishSettings(nrt_min_interval_s=0.0, write_jitter_s=0.0)
    with in_process_extender(kube_cluster) as url:
        first = Desired({}, {}, healthy, held)
        async with _publishing(agent_kubeconfig, name, config, first) as publisher:
            await asyncio.wait_for(publisher.in_sync.wait(), 30)
            start_scheduler(_scheduler_config(url))
            body = pod("next", 4, 4, ns=namespace)
            del body["status"]
            await kube.create(PodResource.from_dict(body))
            assert "rdmaplane:" in await _failed_scheduling(kube, namespace, "next")
            assert FREED_ANNOTATION not in await _annotations(kube, name)
            publisher.set_desired(Desired({}, {}, healthy, free))
            assert await _bound(kube, namespace, "next") == name
    assert FREED_ANNOTATION in await _annotations(kube, name)


async def _annotations(kube: AsyncClient, node: str) -> dict[str, str]:
    meta = (await kube.get(Node, node)).metadata
    return dict(meta.annotations or {}) if meta else {}


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
    there, and one slow request of that user's after another keeping it busy: APF lets a
    request run there only while none does (upstream queueset.canAccommodateSeatsLocked), so
    the publisher's meet 429s. Returns once the API server sends the user's requests there (its
    answers name the FlowSchema); lifts it all on the way out."""
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
    schema = await kube.create(
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

    classified = ""  # the FlowSchema the API server last sent the user's request to
    busy_node = f"{name}-load"
    await kube.create(Node(metadata=ObjectMeta(name=busy_node)))
    client = _https_client(kubeconfig)
    url = f"{_server(kubeconfig)}/api/v1/nodes/{busy_node}"

    async def slow_patch() -> AsyncIterator[bytes]:
        """A merge patch whose body arrives over HOLD_S: the API server holds the level's seat
        while it reads a request it admitted."""
        yield b'{"metadata": {"labels": {"e2e-load": "x"}}'
        for _ in range(10):
            await asyncio.sleep(HOLD_S / 10)
            yield b" "
        yield b"}"

    async def busy() -> None:
        """One such request of the user's after another: the seat is taken nearly all the
        time, so the publisher's requests meet 429s; after a 429 it waits the Retry-After, as
        a good client does."""
        nonlocal classified
        headers = {"Content-Type": "application/merge-patch+json"}
        while True:
            reply = await client.patch(url, content=slow_patch(), headers=headers)
            classified = reply.headers.get(SCHEMA_HEADER, classified)
            if reply.status_code == 429:
                await asyncio.sleep(float(reply.headers.get("Retry-After") or 1))
            elif reply.status_code != 200:
                raise AssertionError(f"the load's patch: HTTP {reply.status_code}: {reply.text}")

    load = asyncio.create_task(busy())
    try:
        uid = schema.metadata.uid
        await eventually(lambda: _true(classified == uid or load.done()), 60)
        if load.done():
            load.result()  # the load itself failed: say how
        yield
    finally:
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
        await client.aclose()
        await kube.delete(Node, busy_node)
        await kube.delete(FlowSchema, name)
        await kube.delete(PriorityLevel, name)


async def test_a_429_is_retried_with_the_same_state_and_is_no_failure(
    kube: AsyncClient,
    node: str,
    throttled_kubeconfig: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rdmaplane.services.agent.publisher")

    def throttles() -> int:
        return sum("asked to slow down (429" in r.getMessage() for r in caplog.records)

    config = PublishSettings(backoff_initial_s=0.2, backoff_max_s=1.0, write_jitter_s=0.0)
    longest = max(config.backoff_max_s, RETRY_AFTER_S)  # any wait of the publisher's
    ready = True
    async with _publishing(throttled_kubeconfig, node, config, _desired(node)) as publisher:
        await asyncio.wait_for(publisher.in_sync.wait(), 30)
        async with _rejecting(kube, throttled_kubeconfig):
            deadline = asyncio.get_running_loop().time() + 60
            while throttles() < 3:  # a write meets a 429 while the user's request holds the seat
                assert asyncio.get_running_loop().time() < deadline, "no 3 429s within 60 s"
                if publisher.in_sync.is_set():  # got through: something new to write
                    ready = not ready
                    publisher.set_desired(_desired(node, ready=ready))
                await asyncio.sleep(0.05)
            ready = not ready  # a change while being turned away: the latest state is written
            publisher.set_desired(_desired(node, ready=ready))
            assert publisher.failures == 0
        # the rejection lifted: in sync within the publisher's next wait and its writes
        await asyncio.wait_for(publisher.in_sync.wait(), 2 * longest + 10)
    assert await _server_ready(kube, node) == str(ready)
    waits = [r.retry_in_s for r in caplog.records if hasattr(r, "retry_in_s")]
    assert waits and max(waits) <= longest, waits  # the settings' waits, the server's 1 s
    messages = [r.getMessage() for r in caplog.records]
    assert not any("publishing to the API server failed" in m for m in messages)


def _https_client(kubeconfig: Path) -> httpx.AsyncClient:
    """Plain HTTPS as the kubeconfig's user (its client certificate), for a request lightkube
    does not make: one whose body trickles in."""
    user = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
    context = ssl.create_default_context(cafile=_cluster(kubeconfig)["certificate-authority"])
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    return httpx.AsyncClient(verify=context, timeout=30)


def _cluster(kubeconfig: Path) -> dict[str, str]:
    cluster: dict[str, str] = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
    return cluster


def _server(kubeconfig: Path) -> str:
    return _cluster(kubeconfig)["server"]


async def _true(value: bool) -> bool:
    return value
