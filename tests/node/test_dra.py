"""The DRA driver with the real kubelet v1.37.2: `rdmaplane dra-driver` (its own process, as its
ServiceAccount) publishes the node's HCA ports, the real kube-scheduler allocates a claim, the
kubelet's own DRA manager calls NodePrepareResources, containerd applies the driver's CDI spec,
and the container sees its NICs; the pod's status names the prepared devices."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from rdmaplane.discovery import read_node
from rdmaplane.dra.claims import spec_name
from tests.e2e.dra import (
    DRIVER,
    allocation,
    driver_command,
    ensure_device_classes,
    install_driver_rbac,
    nics,
)
from tests.node import pods
from tests.node.conftest import NodeCluster
from tests.node.pods import until
from tests.node.realnode import RealNode
from tests.node.test_device_plugin import VIEW, view


@pytest.fixture
def driver(
    real_node: RealNode, node_cluster: NodeCluster, node_sample: Path, node_nrt_crd: None,
    tmp_path: Path,
) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    kubeconfig = install_driver_rbac(node_cluster.cluster)
    tree = Path(shutil.copytree(node_sample, tmp_path / "sys", symlinks=True))
    command = driver_command(real_node.workdir, tree, real_node.name, kubeconfig, "200ms")
    with (real_node.workdir / "logs" / "dra-driver.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    yield process
    process.terminate()
    process.wait(15)


def driver_log(node: RealNode) -> str:
    return (node.workdir / "logs" / "dra-driver.log").read_text()


async def our_slice_devices(kube: AsyncClient, node: str) -> dict[str, dict[str, Any]]:
    found = {}
    async for s in kube.list(ResourceSlice, fields={"spec.nodeName": node, "spec.driver": DRIVER}):
        for d in s.to_dict()["spec"].get("devices", []):
            found[d["name"]] = d
    return found


async def test_the_kubelets_dra_manager_prepares_the_claim_and_the_pod_sees_its_nics(
    driver: subprocess.Popen[bytes], real_node: RealNode, node_sample: Path, kube: AsyncClient,
    node_namespace: str,
) -> None:  # fmt: skip
    await ensure_device_classes(kube)
    devices = await until(lambda: our_slice_devices(kube, real_node.name), "the driver's slice", 60)
    # the slice is out before the kubelet's plugin watcher has registered the driver; a pod
    # bound in between fails its first sync and waits the kubelet's backoff (~70 s seen here)
    await until(lambda: "registered with the kubelet" in driver_log(real_node), "registration")
    claim = {"metadata": {"name": "nics"}, "spec": nics(2)}
    await kube.create(ResourceClaim.from_dict(claim), namespace=node_namespace)  # type: ignore[arg-type]
    body = pods.pod_body(
        "dra", ["sh", "-c", VIEW], resourceClaims=[{"name": "nics", "resourceClaimName": "nics"}]
    )
    body["spec"]["containers"][0]["resources"] = {"claims": [{"name": "nics"}]}
    name = await pods.create(kube, node_namespace, body)
    results = await allocation(kube, node_namespace, "nics")
    seen_devices, env, _ = await view(kube, node_namespace, name)
    pod = await kube.get(Pod, name, namespace=node_namespace)
    stored = (await kube.get(ResourceClaim, "nics", namespace=node_namespace)).to_dict()
    topo = read_node(str(node_sample))
    ours = [devices[r["device"]] for r in results if r["driver"] == DRIVER]
    hcas = [topo.hca(d["attributes"]["rdmaDevice"]["string"]) for d in ours]
    assert len(hcas) == 2 and all(hcas)
    want = {h.uverbs for h in hcas if h} | {p.umad for h in hcas if h for p in h.ports if p.umad}
    assert seen_devices == want | {"rdma_cm"}
    assert set(env["NCCL_IB_HCA"].removeprefix("=").split(",")) == {
        f"{h.name}:1" for h in hcas if h
    }
    assert stored["status"]["reservedFor"][0]["name"] == name
    # the kubelet reports the prepared CDI devices in the pod's status (ResourceHealthStatus);
    # their health stays Unknown while the driver serves no dra-health stream
    spec = json.loads(
        (real_node.cdi_dir / f"{spec_name(DRIVER, stored['metadata']['uid'])}.json").read_text()
    )
    (container,) = (pod.status.containerStatuses if pod.status else None) or []
    (status,) = container.allocatedResourcesStatus or []
    assert status.name == "claim:nics"
    assert {r.resourceID for r in status.resources} == {
        f"{spec['kind']}={d['name']}" for d in spec["devices"]
    }
    assert {r.health for r in status.resources} <= {"Healthy", "Unknown"}
