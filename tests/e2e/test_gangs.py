"""Gangs by kube-scheduler's own Workload API, on rdmaplane's fabric labels.

A control plane of its own with the v1.37 gates on (`GenericWorkload`, the gang plugin;
`TopologyAwareWorkloadScheduling`, a PodGroup's `schedulingConstraints.topology`) and the
`scheduling.k8s.io/v1beta1` API served. 16 nodes under 4 leaves (2 spines), labelled as the agent
labels them; each PodGroup names the leaf label (`fabric.topograph.run/tier-0`) as its topology
key. Some nodes are half used, so only leaf 1 has room for 8 four-GPU pods:

- an 8-pod gang lands under leaf 1, all 8 bound together, with the extender scoring;
- a 10-pod gang (room for it in the cluster, under no leaf) binds no pod, while the same 10 pods
  without a PodGroup bind pod by pod across leaves;
- a gang with the extender `ignorable` and down lands under leaf 1 by the labels alone;
- examples/gangs/ (an Indexed Job and a JobSet with their Workload and PodGroup) pass a
  server-side dry run here, each PodGroup keeping a topology key that is one of the agent's tier
  labels (a server without the gate drops the field).

No Job controller runs: the tests create the Workload, the PodGroup and the pods (naming the
PodGroup in `spec.schedulingGroup`) as a controller would.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, codecs
from lightkube.generic_resource import create_namespaced_resource, load_in_cluster_generic_resources
from lightkube.resources.core_v1 import Node, Pod

from rdmaplane.adapters.kube import NodeResourceTopology
from rdmaplane.core import fabric as fab
from rdmaplane.core import nrt
from tests.e2e.conftest import _wait_established, install_nrt_crd
from tests.e2e.controlplane import (
    KubeCluster,
    Process,
    add_ready_node,
    control_plane,
    free_port,
    launch_scheduler,
)
from tests.e2e.scalerig import metric
from tests.e2e.test_scheduler_extender import _scheduler_config, in_process_extender
from tests.layouts import layout
from tests.scheduler_helpers import pod

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples" / "gangs").glob("*.yaml"))
JOBSET_CRD = Path(__file__).parent / "fixtures" / "crds" / "jobset.yaml"
GATES = "--feature-gates=GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
APISERVER_FLAGS = (GATES, "--runtime-config=scheduling.k8s.io/v1beta1=true")
LEAF = fab.DEFAULT_TIER_LABELS[0]  # "one leaf": the agent's tier-0 label
Workload = create_namespaced_resource("scheduling.k8s.io", "v1beta1", "Workload", "workloads")
PodGroup = create_namespaced_resource("scheduling.k8s.io", "v1beta1", "PodGroup", "podgroups")


@pytest.fixture(scope="module")
def gang_cluster(k8s_bin_dir: Path) -> Iterator[KubeCluster]:
    with control_plane(k8s_bin_dir, lambda _: APISERVER_FLAGS) as cluster:
        install_nrt_crd(cluster)
        yield cluster


@pytest.fixture
async def gkube(gang_cluster: KubeCluster) -> AsyncIterator[AsyncClient]:
    async with gang_cluster.async_client() as client:
        yield client


@pytest.fixture
def gang_namespace(gang_cluster: KubeCluster) -> str:
    name = f"gang-{uuid.uuid4().hex[:6]}"
    gang_cluster.create_namespace(name)
    return name


@pytest.fixture
def gang_scheduler(gang_cluster: KubeCluster) -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start(config: dict[str, Any] | None = None) -> Process:
        started.append(launch_scheduler(gang_cluster, config, [GATES]))
        return started[-1]

    yield start
    for process in started:
        process.stop()


@dataclass(frozen=True)
class Fabric:
    nodes: list[str]
    leaf: dict[str, str]  # node → its leaf's label value


@pytest.fixture
async def fabric(gkube: AsyncClient, gang_namespace: str) -> AsyncIterator[Fabric]:
    """16 nodes under 4 leaves; room for 4-GPU pods: leaf 0 → 5, leaf 1 → 8, leaf 2 → 6,
    leaf 3 → 4 (23 in all). The half-used nodes pack best node-locally; none is under leaf 1."""
    run = uuid.uuid4().hex[:6]
    nodes = [f"g-{run}-{k:02d}" for k in range(16)]
    leaf = {n: f"leaf-{run}-{k // 4}" for k, n in enumerate(nodes)}
    try:
        for k, name in enumerate(nodes):
            location = fab.Location((leaf[name], f"spine-{run}-{k // 8}"))
            labels = fab.tier_labels(location, fab.DEFAULT_TIER_LABELS)
            await add_ready_node(gkube, name, labels, {nrt.GPU: "8", nrt.HCA: "8"})
            await gkube.create(NodeResourceTopology(nrt.to_object(layout("hgx", name))))
        for k, count in {0: 2, 1: 1, 8: 1, 9: 1, 12: 2, 13: 2}.items():
            for i in range(count):
                body = pod(f"other-{k}-{i}", 4, 4, node=nodes[k], ns=gang_namespace)
                del body["status"]
                await gkube.create(Pod.from_dict(body))
        yield Fabric(nodes, leaf)
    finally:
        await gkube.deletecollection(Pod, namespace=gang_namespace, grace_period=0)
        for name in nodes:
            with contextlib.suppress(ApiError):
                await gkube.delete(Node, name)
            with contextlib.suppress(ApiError):
                await gkube.delete(NodeResourceTopology, name)


def gang_objects(namespace: str, name: str, size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Workload with one gang template (minCount `size`, all under one leaf) and its PodGroup
    `<name>-workers`, as a Job controller would make them."""
    policy = {"gang": {"minCount": size}}
    constraints = {"topology": [{"key": LEAF}]}
    template = {"name": "workers", "schedulingPolicy": policy, "schedulingConstraints": constraints}
    workload = {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"podGroupTemplates": [template]},
    }
    group = {
        "metadata": {"name": f"{name}-workers", "namespace": namespace},
        "spec": {
            "workloadRef": {"workloadName": name, "templateName": "workers"},
            "schedulingPolicy": policy,
            "schedulingConstraints": constraints,
        },
    }
    return workload, group


async def _create_gang(kube: AsyncClient, namespace: str, name: str, size: int) -> list[str]:
    """The gang's Workload and PodGroup, and `size` 4-GPU pods naming the PodGroup."""
    workload, group = gang_objects(namespace, name, size)
    await kube.create(Workload.from_dict(workload))
    await kube.create(PodGroup.from_dict(group))
    return await _create_pods(kube, namespace, name, size, f"{name}-workers")


async def _create_pods(
    kube: AsyncClient, namespace: str, job: str, size: int, group: str | None
) -> list[str]:
    names = []
    for i in range(size):
        body = pod(f"{job}-{i}", 4, 4, ns=namespace)
        del body["status"]
        body["metadata"]["labels"] = {
            "batch.kubernetes.io/job-name": job,
            "batch.kubernetes.io/job-completion-index": str(i),
        }
        if group is not None:
            body["spec"]["schedulingGroup"] = {"podGroupName": group}
        await kube.create(Pod.from_dict(body))
        names.append(body["metadata"]["name"])
    return names


async def _nodes_of(kube: AsyncClient, namespace: str, names: list[str]) -> dict[str, str]:
    found = {}
    for name in names:
        got = await kube.get(Pod, name, namespace=namespace)
        if got.spec and got.spec.nodeName:
            found[name] = got.spec.nodeName
    return found


async def _bound(kube: AsyncClient, namespace: str, names: list[str]) -> dict[str, str]:
    for _ in range(480):  # up to 120 s: a loaded CI machine
        found = await _nodes_of(kube, namespace, names)
        if len(found) == len(names):
            return found
        await asyncio.sleep(0.25)
    raise AssertionError(f"bound within 120 s: {found}")


async def _judged_unschedulable(kube: AsyncClient, namespace: str, names: list[str]) -> None:
    """Wait until kube-scheduler has tried every pod and marked it `PodScheduled=False`."""
    for _ in range(480):
        judged = 0
        for name in names:
            got = await kube.get(Pod, name, namespace=namespace)
            conditions = (got.status.conditions if got.status else None) or []
            judged += any(c.type == "PodScheduled" and c.status == "False" for c in conditions)
        if judged == len(names):
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"kube-scheduler judged {judged} of {len(names)} pods within 120 s")


async def _group_condition(kube: AsyncClient, namespace: str, name: str) -> dict[str, Any]:
    """The PodGroup's `PodGroupInitiallyScheduled` condition, as kube-scheduler set it."""
    for _ in range(480):
        group = await kube.get(PodGroup, name, namespace=namespace)
        for condition in (group.get("status") or {}).get("conditions") or []:
            if condition["type"] == "PodGroupInitiallyScheduled":
                return dict(condition)
        await asyncio.sleep(0.25)
    raise AssertionError(f"PodGroup {name} was never judged within 120 s")


async def test_an_8_pod_gang_lands_under_the_one_leaf_that_holds_it(
    gang_cluster: KubeCluster,
    gkube: AsyncClient,
    gang_namespace: str,
    fabric: Fabric,
    gang_scheduler: Callable[..., Process],
) -> None:
    with in_process_extender(gang_cluster) as url:
        names = await _create_gang(gkube, gang_namespace, "train", 8)
        gang_scheduler(_scheduler_config(url))
        placed = await _bound(gkube, gang_namespace, names)
        scored = await metric(url, "rdmaplane_extender_requests_total", verb="prioritize")
    assert {fabric.leaf[n] for n in placed.values()} == {fabric.leaf[fabric.nodes[4]]}, placed
    assert len(set(placed.values())) == 4  # two 4-GPU pods on each node of leaf 1
    assert scored >= 8  # kube-scheduler asked the extender about every pod of the gang
    assert (await _group_condition(gkube, gang_namespace, "train-workers"))["status"] == "True"


async def test_a_gang_that_fits_under_no_leaf_binds_no_pod(
    gkube: AsyncClient,
    gang_namespace: str,
    fabric: Fabric,
    gang_scheduler: Callable[..., Process],
) -> None:
    gang_scheduler(None)
    names = await _create_gang(gkube, gang_namespace, "big", 10)  # 23 free slots, ≤ 8 per leaf
    await _judged_unschedulable(gkube, gang_namespace, names)
    assert await _nodes_of(gkube, gang_namespace, names) == {}
    judged = await _group_condition(gkube, gang_namespace, "big-workers")
    assert (judged["status"], judged["reason"]) == ("False", "Unschedulable"), judged
    # The same job pod by pod (no PodGroup) binds: all 10 across more than one leaf.
    loose = await _create_pods(gkube, gang_namespace, "loose", 10, None)
    placed = await _bound(gkube, gang_namespace, loose)
    assert len({fabric.leaf[n] for n in placed.values()}) > 1, placed
    assert await _nodes_of(gkube, gang_namespace, names) == {}  # the gang still holds nothing


async def test_a_gang_lands_by_labels_alone_with_the_extender_down(
    gkube: AsyncClient,
    gang_namespace: str,
    fabric: Fabric,
    gang_scheduler: Callable[..., Process],
) -> None:
    config = _scheduler_config(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    assert config["extenders"][0]["ignorable"] is True
    scheduler = gang_scheduler(config)
    names = await _create_gang(gkube, gang_namespace, "train", 8)
    placed = await _bound(gkube, gang_namespace, names)
    assert {fabric.leaf[n] for n in placed.values()} == {fabric.leaf[fabric.nodes[4]]}, placed
    log = scheduler.log_path.read_text(errors="replace")
    assert "Skipping extender" in log  # it was asked, and passed over as ignorable


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_gang_example_is_accepted_with_its_topology_key(
    gang_cluster: KubeCluster, gang_namespace: str, path: Path
) -> None:
    with gang_cluster.client() as client:
        crd = codecs.load_all_yaml(JOBSET_CRD.read_text())[0]
        client.apply(crd, field_manager="rdmaplane-e2e", force=True)
        _wait_established(client, crd.metadata.name)
        load_in_cluster_generic_resources(client)
        kinds = []
        for doc in codecs.load_all_yaml(path.read_text()):
            doc.metadata.namespace = gang_namespace
            got = client.apply(doc, field_manager="rdmaplane-e2e", dry_run=True)
            kinds.append(doc.kind)
            if doc.kind == "PodGroup":
                topology = got["spec"]["schedulingConstraints"]["topology"]
                assert next(t["key"] for t in topology) in fab.DEFAULT_TIER_LABELS
    assert kinds[:2] == ["Workload", "PodGroup"] and kinds[2] in ("Job", "JobSet")
    assert len(EXAMPLES) == 2
