"""The DRA driver with the real kubelet v1.37.2: `rdmaplane dra-driver` (its own process, as its
ServiceAccount, with a token bound to a pod on this node) publishes the node's HCA ports, the
real kube-scheduler allocates a claim and binds the pod once the driver set the NICs' binding
condition, the kubelet's own DRA manager calls NodePrepareResources, containerd applies the
driver's CDI spec, and the container sees its NICs; the kubelet watches the driver's device
health stream and shows it in the pod's status: Healthy, then Unhealthy with the driver's
message while a port is down, then Healthy again. The pod is admitted as the webhook (and
`rdmaplane inject`) would admit it, opted in: the container's own view has its NICs, the NCCL
environment of exactly them, IPC_LOCK in its effective capabilities and a memory-backed
/dev/shm of its own."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from rdmaplane.adapters.discovery import read_node
from rdmaplane.core.settings.webhook import InjectPolicy
from rdmaplane.services.dra.policy.claims import spec_name
from rdmaplane.services.dra.policy.readiness import READY
from rdmaplane.services.webhook.policy import inject
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
from tests.node.test_device_plugin import VIEW, parse_view

CAP_IPC_LOCK = 14  # linux/capability.h
# the container's capabilities and /dev/shm, then the device plugin tests' view
VIEW_RDMA = "grep CapEff /proc/self/status; grep ' /dev/shm ' /proc/mounts; echo +++; " + VIEW

TOKEN_POD = "rdmaplane-dra-driver-token"


@pytest.fixture
async def driver_kubeconfig(
    real_node: RealNode, node_cluster: NodeCluster, node_nrt_crd: None, kube: AsyncClient
) -> AsyncIterator[Path]:
    """The credential the driver's DaemonSet pod gets on this node: its ServiceAccount's token
    bound to a pod on the node (here a busybox pod that sleeps; bound by name, so the API
    server names the node in the token), which the driver's associated-node:patch needs."""
    install_driver_rbac(node_cluster.cluster)
    body = pods.pod_body(
        TOKEN_POD, ["sleep", "3600"], serviceAccountName="rdmaplane-dra-driver",
        nodeName=real_node.name,
    )  # fmt: skip
    body["spec"].pop("nodeSelector")
    body["metadata"]["namespace"] = "rdmaplane"
    yield node_cluster.cluster.kubeconfig_for_pod(body)
    await kube.delete(Pod, TOKEN_POD, namespace="rdmaplane", grace_period=1)
    await pods.gone(kube, "rdmaplane", TOKEN_POD)


@dataclass
class Driver:
    process: subprocess.Popen[bytes]
    tree: Path  # the sysfs tree it reads

    def set_port(self, hca: str, up: bool) -> None:
        port = self.tree / "class/infiniband" / hca / "ports/1"
        (port / "state").write_text("4: ACTIVE\n" if up else "1: DOWN\n")
        (port / "phys_state").write_text("5: LinkUp\n" if up else "3: Disabled\n")


@pytest.fixture
def driver(
    real_node: RealNode, node_sample: Path, driver_kubeconfig: Path, tmp_path: Path
) -> Iterator[Driver]:
    tree = Path(shutil.copytree(node_sample, tmp_path / "sys", symlinks=True))
    command = driver_command(
        real_node.workdir, tree, real_node.name, driver_kubeconfig, "200ms", health_resend="5s"
    )
    with (real_node.workdir / "logs" / "dra-driver.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    yield Driver(process, tree)
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


async def rdma_view(
    kube: AsyncClient, namespace: str, name: str
) -> tuple[int, str, set[str], dict[str, str]]:
    """Once the pod printed `VIEW_RDMA`: its effective capabilities, its /dev/shm mount line,
    devices and environment."""
    await pods.wait_phase(kube, namespace, name, ("Running",))
    deadline = time.monotonic() + pods.WAIT_S
    while "END" not in (text := await pods.log(kube, namespace, name)):
        assert time.monotonic() < deadline, text
        await asyncio.sleep(0.2)
    head, rest = text.split("+++", 1)
    caps, shm = [*head.strip().splitlines(), "", ""][:2]
    devices, env, _ = parse_view(rest)
    return int(caps.split()[-1], 16), shm, devices, env


async def health_of(kube: AsyncClient, namespace: str, pod: str) -> dict[str, tuple[str, str]]:
    """What the kubelet shows in the pod's status for its claim: resource ID → health, message."""
    stored = await kube.get(Pod, pod, namespace=namespace)
    (container,) = (stored.status.containerStatuses if stored.status else None) or []
    statuses = container.allocatedResourcesStatus or []
    return {r.resourceID: (r.health or "", r.message or "") for s in statuses for r in s.resources}


async def test_the_kubelets_dra_manager_prepares_the_claim_and_the_pod_sees_its_nics(
    driver: Driver, real_node: RealNode, node_sample: Path, kube: AsyncClient,
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
        "dra",
        ["sh", "-c", VIEW_RDMA],
        resourceClaims=[{"name": "nics", "resourceClaimName": "nics"}],
    )
    body["metadata"]["annotations"] = {inject.MODE_ANNOTATION: "auto"}
    body["spec"]["containers"][0]["resources"] = {"claims": [{"name": "nics"}]}
    admitted = inject.mutate(body, InjectPolicy(), node_namespace)  # as the webhook would
    assert not admitted.warnings, admitted.warnings
    name = await pods.create(kube, node_namespace, admitted.pod)
    results = await allocation(kube, node_namespace, "nics")
    caps, shm, seen_devices, env = await rdma_view(kube, node_namespace, name)
    assert caps & (1 << CAP_IPC_LOCK), f"CapEff {caps:x}"
    # the webhook's memory emptyDir, not the runtime's 64 MiB shm
    assert shm.split()[:3] == ["tmpfs", "/dev/shm", "tmpfs"], shm
    assert "size=65536k" not in shm, shm
    assert env["RDMAPLANE_ANNOTATIONS_FILE"] == "/etc/podinfo/annotations"
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
    # bound once the driver said both NICs are ready
    said = {d["device"]: d["conditions"] for d in stored["status"]["devices"]}
    assert set(said) == {r["device"] for r in results if r["driver"] == DRIVER}
    assert all(
        any(c["type"] == READY and c["status"] == "True" for c in conditions)
        for conditions in said.values()
    )
    # the kubelet reports the prepared CDI devices in the pod's status (ResourceHealthStatus),
    # with the health the driver streams to it (DRAResourceHealth)
    spec = json.loads(
        (real_node.cdi_dir / f"{spec_name(DRIVER, stored['metadata']['uid'])}.json").read_text()
    )
    (container,) = (pod.status.containerStatuses if pod.status else None) or []
    (status,) = container.allocatedResourcesStatus or []
    assert status.name == "claim:nics"
    cdi_ids = {f"{spec['kind']}={d['name']}": d["name"] for d in spec["devices"]}
    assert {r.resourceID for r in status.resources} == set(cdi_ids)

    async def healthy() -> bool:
        return {h for h, _ in (await health_of(kube, node_namespace, name)).values()} == {"Healthy"}

    await until(healthy, "both NICs Healthy in the pod's status", 60)

    # one of its ports goes down: the kubelet shows that NIC Unhealthy, with the driver's word
    down = hcas[0]
    assert down is not None
    driver.set_port(down.name, up=False)
    down_id = next(i for i, n in cdi_ids.items() if n.endswith(devices_of(ours, down.name)))

    async def unhealthy() -> dict[str, tuple[str, str]] | None:
        found = await health_of(kube, node_namespace, name)
        return found if found[down_id][0] == "Unhealthy" else None

    shown = await until(unhealthy, f"{down.name} Unhealthy in the pod's status", 60)
    assert shown[down_id][1].startswith(f"PortDown: {down.name}: no port ACTIVE and LinkUp")
    assert {h for i, (h, _) in shown.items() if i != down_id} == {"Healthy"}
    driver.set_port(down.name, up=True)
    await until(healthy, f"{down.name} Healthy again", 60)


def devices_of(devices: list[dict[str, Any]], hca: str) -> str:
    """The name of the device (of `devices`) that is port 1 of `hca`."""
    return next(d["name"] for d in devices if d["attributes"]["rdmaDevice"]["string"] == hca)
