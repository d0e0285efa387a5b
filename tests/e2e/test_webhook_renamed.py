"""The admission webhook on the real kube-apiserver with renamed resources: two GPU vendors
(`nvidia.com/gpu` and `amd.com/gpu`), the exclusive pool `example.com/ib` and the network
operator's shared pool `rdma/hca_shared_devices_a` (tests/resource_names.py). It is deployed as
tests/e2e/test_webhook.py deploys it, its `asks-for-gpus` conditions naming both GPUs as
docs/webhook.md tells users of other names; pods are created through the API server and
checked as stored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rdmaplane.core.resources import Vocabulary
from rdmaplane.core.settings.webhook import InjectPolicy
from rdmaplane.services.webhook.policy import inject
from tests import resource_names as names
from tests.e2e.controlplane import KubeCluster
from tests.webhook_pods import (
    GPU,
    HCA,
    SHARED,
    assert_left_alone,
    assert_rdma_ready,
    gpu_pod,
)
from tests.webhook_server import create, deployed_webhook, webhook_namespaces

RESOURCES = {"gpu": [GPU, names.GPU], "hca": [names.HCA], "hcaShared": [names.SHARED]}


@pytest.fixture(scope="module")
def namespaces(kube_cluster: KubeCluster) -> Iterator[tuple[str, str]]:
    """(opted in, plain) with the renamed webhook deployed."""
    with (
        deployed_webhook(kube_cluster, {"resources": RESOURCES}),
        webhook_namespaces(kube_cluster) as both,
    ):
        yield both


def _asking(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> Any:
    """`gpu_pod`'s pod, its container's limits `limits` (memory 64Gi besides)."""
    pod = gpu_pod(name, annotations=annotations)
    pod["spec"]["containers"][0]["resources"] = {"limits": {**limits, "memory": "64Gi"}}
    return pod


@pytest.mark.parametrize("gpu", [GPU, names.GPU])
def test_either_vendors_gpu_pod_gets_the_renamed_exclusive_pool(
    kube_cluster: KubeCluster, namespaces: tuple[str, str], gpu: str
) -> None:
    opted_in, _ = namespaces
    with kube_cluster.client() as client:
        pod = create(client, opted_in, _asking(f"trainer-{gpu.split('.')[0]}", {gpu: "8"}))
    assert_rdma_ready(pod, names.HCA, "8")
    assert set(pod["spec"]["containers"][0]["resources"]["limits"]) == {gpu, names.HCA, "memory"}


def test_elsewhere_an_annotated_pod_gets_the_renamed_shared_pool(
    kube_cluster: KubeCluster, namespaces: tuple[str, str]
) -> None:
    _, plain = namespaces
    with kube_cluster.client() as client:
        shared = create(
            client, plain, _asking("shared", {names.GPU: "2"}, {"rdmaplane.io/rdma": "shared"})
        )
        unasked = create(client, plain, _asking("unasked", {names.GPU: "2"}))
    assert_rdma_ready(shared, names.SHARED, "1")
    assert set(shared["spec"]["containers"][0]["resources"]["limits"]) == {
        names.GPU,
        names.SHARED,
        "memory",
    }
    assert_left_alone(unasked)


def test_a_renamed_pool_the_user_named_stays_as_written(
    kube_cluster: KubeCluster, namespaces: tuple[str, str]
) -> None:
    opted_in, _ = namespaces
    limits = {names.GPU: "8", names.HCA: "2"}
    with kube_cluster.client() as client:
        pod = create(client, opted_in, _asking("own-pool", limits))
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"] == {**limits, "memory": "64Gi"}
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


@pytest.mark.parametrize(
    "limits",
    [{"example.com/fpga": "1"}, {HCA: "2"}, {SHARED: "1"}],
    ids=["another-device", "the-default-exclusive-name", "the-default-shared-name"],
)
def test_a_pod_asking_for_no_configured_gpu_is_left_alone(
    kube_cluster: KubeCluster, namespaces: tuple[str, str], limits: dict[str, str]
) -> None:
    """Not one of the GPU names (a default pool name is just another resource here): the API
    server does not send it (`inject.not_sent` agrees) and stores it as written."""
    opted_in, _ = namespaces
    obj = _asking("other", limits)
    policy = InjectPolicy(resources=Vocabulary((GPU, names.GPU), (names.HCA,), (names.SHARED,)))
    assert inject.not_sent(obj, opted_in, True, policy) is not None
    with kube_cluster.client() as client:
        pod = create(client, opted_in, obj, dry_run=True)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {**limits, "memory": "64Gi"}
    assert_left_alone(pod)
