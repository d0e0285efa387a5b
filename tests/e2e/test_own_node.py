"""deploy/agent/own-node.yaml on the real API server, with real pod-bound tokens: the token of
the agent's (or the DRA driver's) DaemonSet pod on node A, requested through the TokenRequest
API as the kubelet requests it, names A. With it, every write the agent makes succeeds on A and
A's pods, the same writes on node B and B's pods are refused, and so is anything on A the agent
does not own, a pod's labels included: rdmaplane reads its own (`rdmaplane.io/group` …) on
pods, so an agent may change none. The fault chain under the same policy: tests/e2e/test_faults.py.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod, ServiceAccountToken
from lightkube.types import PatchType

from rdmaplane.adapters.kube import NodeResourceTopology, async_client
from rdmaplane.core import faults, notice, nrt
from rdmaplane.core.fabric import DEFAULT_TIER_LABELS
from rdmaplane.core.repeat import QUARANTINE_TAINT_KEY
from rdmaplane.services.scheduler.policy.jobaware import (
    GROUP_LABEL,
    GROUP_LABELS,
    GROUP_SIZE,
    KV_PEERS,
)
from rdmaplane.services.webhook.policy.inject import OPT_IN_LABEL
from tests.e2e import nodeaccess
from tests.e2e.conftest import KwokCluster
from tests.e2e.controlplane import KubeCluster, add_ready_node, write_kubeconfig
from tests.layouts import layout

DAEMONSETS = [nodeaccess.AGENT_DAEMONSET, nodeaccess.DRA_DAEMONSET]
# Both policies' refusals name the caller's node: "... only its own node and the pods bound to
# it (A)", "... evict only pods bound to its own node (A)".
OWN = "its own node"
NOW = "2026-01-01T00:00:00Z"
# The workload pods' labels: one rdmaplane reads (the job it belongs to), one of the user's.
POD_LABELS = {GROUP_LABEL: "job-1", "app": "train"}


@pytest.fixture(scope="module")
def cluster(kwok_cluster: KwokCluster) -> KubeCluster:
    nodeaccess.install(kwok_cluster.cluster)
    return kwok_cluster.cluster


@dataclass(frozen=True)
class Scene:
    kube: AsyncClient  # the admin
    a: str
    b: str
    namespace: str
    pod_a: str  # a workload pod bound to A
    pod_b: str


@pytest.fixture
async def scene(cluster: KubeCluster) -> AsyncIterator[Scene]:
    suffix = uuid.uuid4().hex[:6]
    a, b, namespace = f"own-a-{suffix}", f"own-b-{suffix}", f"own-{suffix}"
    cluster.create_namespace(namespace)
    async with cluster.async_client() as kube:
        for node in (a, b):
            await add_ready_node(kube, node, {"keep": "me"}, {nrt.GPU: "8"})
            await kube.patch(
                Node,
                node,
                {"spec": {"taints": [{"key": "other", "value": "v", "effect": "NoSchedule"}]}},
                patch_type=PatchType.MERGE,
            )
            body = {
                "metadata": {"name": f"work-{node}", "namespace": namespace, "labels": POD_LABELS},
                "spec": {
                    "nodeName": node,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "c", "image": "registry.invalid/c"}],
                },
            }
            await kube.create(Pod.from_dict(body))
        try:
            yield Scene(kube, a, b, namespace, f"work-{a}", f"work-{b}")
        finally:
            await kube.deletecollection(Pod, namespace=namespace, grace_period=0)
            for node in (a, b):
                await kube.delete(Node, node)
                with contextlib.suppress(ApiError):
                    await kube.delete(NodeResourceTopology, node)


@pytest.fixture
def on_a(cluster: KubeCluster, scene: Scene, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The pod-bound kubeconfig of the DaemonSet's pod on A."""
    daemonset: Path = request.param
    yield nodeaccess.kubeconfig_on(cluster, scene.a, daemonset)
    nodeaccess.remove_pod(cluster, scene.a, daemonset)


async def outcome(call: Awaitable[Any]) -> str:
    """`ok`, or the HTTP code and message of the refusal."""
    try:
        await call
    except ApiError as e:
        return f"{e.status.code} {e.status.message}"
    return "ok"


Write = Callable[[AsyncClient, str, str], Awaitable[Any]]


def _merge(patch: dict[str, Any]) -> Write:
    async def write(client: AsyncClient, node: str, ns: str) -> Any:
        return await client.patch(Node, node, patch, patch_type=PatchType.MERGE)

    return write


def _node_status(
    patch: dict[str, Any],
    patch_type: PatchType = PatchType.STRATEGIC,
    metadata: dict[str, Any] | None = None,
) -> Write:
    """A patch through nodes/status (whose strategy keeps the spec, not the metadata)."""
    body = {"status": patch, **({"metadata": metadata} if metadata else {})}

    async def write(client: AsyncClient, node: str, ns: str) -> Any:
        return await client.patch(Node.Status, node, body, patch_type=patch_type)

    return write


def _pod(
    patch: dict[str, Any], status: bool = False, patch_type: PatchType = PatchType.STRATEGIC
) -> Write:
    async def write(client: AsyncClient, node: str, ns: str) -> Any:
        kind = Pod.Status if status else Pod
        return await client.patch(kind, f"work-{node}", patch, namespace=ns, patch_type=patch_type)

    return write


async def _own_taint(client: AsyncClient, node: str, ns: str) -> Any:
    """The agent's way (faultaction._reconcile_taints): read the taints, add ours (the fault
    taint and the repeat offenders' quarantine), keep the rest, under the read
    resourceVersion."""
    got = await client.get(Node, node)
    assert got.metadata is not None and got.spec is not None
    taints = [t.to_dict() for t in got.spec.taints or []]
    taints.append({"key": faults.TAINT_KEY, "value": "8-hcas", "effect": "NoExecute"})
    taints.append({"key": QUARANTINE_TAINT_KEY, "value": "1-ports", "effect": "NoSchedule"})
    version = got.metadata.resourceVersion
    patch = {"metadata": {"resourceVersion": version}, "spec": {"taints": taints}}
    return await client.patch(Node, node, patch, patch_type=PatchType.MERGE)


async def _nrt(client: AsyncClient, node: str, ns: str) -> Any:
    topology = nrt.to_object(layout("hgx", node, policy="best-effort", scope="pod"))
    return await client.create(NodeResourceTopology(topology))


async def _evict(client: AsyncClient, node: str, ns: str) -> Any:
    eviction = Pod.Eviction(metadata=ObjectMeta(name=f"work-{node}", namespace=ns))
    return await client.create(eviction, f"work-{node}", namespace=ns)


def _condition(type_: str, status: str = "True") -> dict[str, Any]:
    return {"conditions": [{"type": type_, "status": status, "reason": "Test", "message": "m",
                            "lastHeartbeatTime": NOW, "lastTransitionTime": NOW}]}  # fmt: skip


# What the agent writes (desired.py, publisher.py, faultaction.py), in the order of a fault:
# eviction last, as it removes the pod.
AGENT_WRITES: list[tuple[str, Write]] = [
    (
        "labels and annotation",
        _merge(
            {
                "metadata": {
                    "labels": {nrt.LABEL_RDMA: "true", DEFAULT_TIER_LABELS[0]: "leaf-1"},
                    "annotations": {"rdmaplane.io/topology": "{}"},
                }
            }
        ),
    ),
    ("RDMAReady", _node_status(_condition(nrt.CONDITION_RDMA_READY))),
    ("its taints", _own_taint),
    ("its NodeResourceTopology", _nrt),
    ("fault notice", _pod({"metadata": {"annotations": {notice.ANNOTATION: "{}"}}})),
    ("RDMAFault", _pod({"status": _condition(faults.CONDITION)}, status=True)),
    ("eviction", _evict),
]
# On its own node, what the agent does not own.
NOT_ITS_OWN: list[tuple[str, Write, str]] = [
    ("a label", _merge({"metadata": {"labels": {"team": "x"}}}), "own labels and annotations"),
    ("removing a label", _merge({"metadata": {"labels": {"keep": None}}}), "not keep"),
    (
        "an annotation",
        _merge({"metadata": {"annotations": {"example.com/x": "1"}}}),
        "not example.com/x",
    ),
    ("another taint", _merge({"spec": {"taints": []}}), "only its own taint"),
    ("cordon", _merge({"spec": {"unschedulable": True}}), "condition of a Node"),
    ("a finalizer", _merge({"metadata": {"finalizers": ["example.com/f"]}}), "finalizers"),
    ("Ready", _node_status(_condition("Ready", "False")), "only the RDMAReady condition"),
    (
        "capacity",
        _node_status({"capacity": {nrt.GPU: "16"}}, PatchType.MERGE),
        "condition of a Node",
    ),
    (
        "a label through nodes/status",
        _node_status({}, PatchType.MERGE, {"labels": {"team": "x"}}),
        "own labels and annotations",
    ),
    ("a pod's label", _pod({"metadata": {"labels": {"x": "y"}}}), "not x"),
    (
        "a pod's annotation",
        _pod({"metadata": {"annotations": {"example.com/x": "1"}}}),
        "not example.com/x",
    ),
    ("a pod's spec", _pod({"spec": {"activeDeadlineSeconds": 5}}), "condition of a pod"),
    (
        "a pod's Ready",
        _pod({"status": _condition("Ready", "False")}, status=True),
        "only the RDMAFault condition",
    ),
    ("a pod's phase", _pod({"status": {"phase": "Failed"}}, status=True), "condition of a pod"),
]
# Every label rdmaplane reads on pods: the extender's job grouping (its own rdmaplane.io/group
# first, then the job controllers'; the group's size; the KV peers), the webhook's opt-in (a
# namespace label; tried on the pod too) and the fault notice's key, each set by a merge patch as
# any client would. An agent may change none of them on its own node's pods; then the one the
# pod carries, changed and removed, and a label through pods/status.
READ_POD_LABELS = [*GROUP_LABELS, GROUP_SIZE, KV_PEERS, OPT_IN_LABEL, notice.ANNOTATION]
NOT_ITS_OWN += [
    (
        f"a pod's label {key}",
        _pod({"metadata": {"labels": {key: "64"}}}, patch_type=PatchType.MERGE),
        f"no label of a pod and only its own annotations, not {key}",
    )
    for key in READ_POD_LABELS
] + [
    (
        "removing a pod's rdmaplane.io/group",
        _pod({"metadata": {"labels": {GROUP_LABEL: None}}}, patch_type=PatchType.MERGE),
        f"not {GROUP_LABEL}",
    ),
    (
        "a pod's label through pods/status",
        _pod({"metadata": {"labels": {GROUP_LABEL: "job-2"}}}, True, PatchType.MERGE),
        f"not {GROUP_LABEL}",
    ),
]


@pytest.mark.parametrize("on_a", DAEMONSETS, ids=["agent", "dra-driver"], indirect=True)
async def test_an_agent_may_write_only_its_own_node_and_pods(scene: Scene, on_a: Path) -> None:
    async with async_client(on_a) as agent:
        for what, write in AGENT_WRITES:
            refused = await outcome(write(agent, scene.b, scene.namespace))
            assert refused.startswith("403 ") and OWN in refused and f"({scene.a})" in refused, (
                what,
                refused,
            )
        for what, write, why in NOT_ITS_OWN:
            refused = await outcome(write(agent, scene.a, scene.namespace))
            assert refused.startswith("403 ") and why in refused, (what, refused)
        for what, write in AGENT_WRITES:
            assert await outcome(write(agent, scene.a, scene.namespace)) == "ok", what

    node = await scene.kube.get(Node, scene.a)
    assert node.metadata is not None and node.spec is not None and node.status is not None
    assert node.metadata.labels == {
        "keep": "me", nrt.LABEL_RDMA: "true", DEFAULT_TIER_LABELS[0]: "leaf-1"
    }  # fmt: skip
    assert [(t.key, t.effect) for t in node.spec.taints or []] == [
        ("other", "NoSchedule"),
        (faults.TAINT_KEY, "NoExecute"),
        (QUARANTINE_TAINT_KEY, "NoSchedule"),
    ]
    assert {c.type: c.status for c in node.status.conditions or []} == {
        "Ready": "True",
        nrt.CONDITION_RDMA_READY: "True",
    }
    pods = [p.metadata async for p in scene.kube.list(Pod, namespace=scene.namespace)]
    going = {m.name: m.deletionTimestamp is not None for m in pods if m is not None}
    assert going == {scene.pod_a: True, scene.pod_b: False}  # A's pod evicted, B's untouched
    assert all(m is not None and m.labels == POD_LABELS for m in pods)  # no label changed


async def test_a_token_that_names_no_node_is_refused(cluster: KubeCluster, scene: Scene) -> None:
    """A token of the agent's ServiceAccount bound to no pod (as a legacy Secret token, or
    one made with `kubectl create token`) names no node: every write is refused."""
    with cluster.client() as client:
        token = client.create(
            ServiceAccountToken.from_dict(
                {"metadata": {}, "spec": {"audiences": [], "expirationSeconds": 600}}
            ),
            "rdmaplane-agent",
            namespace="rdmaplane",
        )
    assert token.status is not None
    kubeconfig = write_kubeconfig(
        cluster.workdir / f"nameless-{uuid.uuid4().hex[:6]}.kubeconfig",
        cluster.server,
        cluster.pki.ca_cert,
        token=token.status.token,
    )
    async with async_client(kubeconfig) as nameless:
        for what, write in AGENT_WRITES:
            refused = await outcome(write(nameless, scene.a, scene.namespace))
            assert refused.startswith("403 ") and "its token names no node" in refused, (
                what,
                refused,
            )
