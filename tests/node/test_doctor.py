"""`rdmaplane doctor` inside real containers: the webhook's additions applied by the real API
server, realised by the kubelet, containerd and runc, judged from inside the pod.

The webhook runs as deploy/webhook/ installs it, with its default doctor image: rdmaplane's own
(`make image`'s archive, imported into the node's containerd under its release name). A training
pod's container (the node's Python image standing in for a user's) runs the doctor with the
node's sysfs shown at /sys (the sample tree: this machine has no RDMA), everything else as the
node made it: device nodes, environment, capabilities, memlock limit, /dev/shm. In an opted-in
namespace (IPC_LOCK, a memory /dev/shm) it passes; the same pod elsewhere fails on exactly
memlock and /dev/shm. The doctor init container the webhook adds on request sees this machine's
real /sys, which has no HCA, and stops the pod before its containers start, as promised; it runs
as root, with IPC_LOCK in effect, though the image's own user is not root. And the validation
Job `rdmaplane doctor job` prints runs from that image as printed: its shell line, read-only
root, IPC_LOCK as root.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import AsyncClient
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.types import CascadeType

from rdmaplane import IMAGE
from tests.node import pods
from tests.node.conftest import NodeCluster
from tests.node.plugins import GPU, HCA, device_plugin, gpu_plugin, held, wait_allocatable
from tests.node.realnode import PYTHON, RealNode
from tests.node.test_device_plugin import hcas_of, topology
from tests.webhook_server import WebhookProcess, deployed_webhook

DOCTOR = ["rdmaplane", "doctor", "-o", "json"]
# No NCCL_SOCKET_IFNAME: the doctor checks it against /sys/class/net, here the sample's netdevs.
PLUGIN = {"pools": [{"resourceName": HCA}]}
# What this machine cannot pass: it has no GPU driver (no peer-memory module, no
# /proc/driver/nvidia to place the pod's GPUs): warnings, never failures.
NO_GPU_DRIVER = {"gpu-nic", "gpudirect-rdma"}
MEMLOCK_MIN = 1 << 30  # the doctor's limit for a process without IPC_LOCK


@pytest.fixture(scope="module")
def webhook(node_cluster: NodeCluster, real_node: RealNode) -> Iterator[WebhookProcess]:
    config = {"doctor": {"args": ["doctor", "-o", "json"]}}  # the default image: IMAGE
    with deployed_webhook(node_cluster.cluster, config) as (process, _):
        yield process


@pytest.fixture
async def plugins(real_node: RealNode, node_sample: Path, kube: AsyncClient) -> AsyncIterator[None]:
    with device_plugin(real_node, node_sample, PLUGIN):
        async with gpu_plugin(real_node, node_sample):
            await wait_allocatable(kube, real_node, {HCA: 9, GPU: 8})
            yield


async def opt_in(kube: AsyncClient, namespace: str) -> None:
    await kube.patch(
        Namespace, namespace, {"metadata": {"labels": {"rdmaplane.io/inject": "enabled"}}}
    )


def training_pod(name: str, node_sample: Path, hcas: int | None = None) -> dict[str, Any]:
    """A pod with 2 GPUs (and `hcas` HCAs) whose container runs the doctor, the node's sysfs
    (the sample) at /sys."""
    body = pods.pod_body(
        name,
        DOCTOR,
        image=PYTHON,
        limits={GPU: 2, **({HCA: hcas} if hcas else {})},
        volumes=[{"name": "sys", "hostPath": {"path": str(node_sample), "type": "Directory"}}],
    )
    body["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "sys", "mountPath": "/sys", "readOnly": True}
    ]
    return body


def verdict(text: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(text)
    assert report["schema"] == "rdmaplane.io/doctor/v1", report
    return report


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {f["name"]: f["status"] for f in report["findings"]}


def node_memlock(node: RealNode) -> int | None:
    """containerd's memlock limit, which containers without IPC_LOCK inherit (None: none)."""
    assert node.containerd is not None
    limits = Path(f"/proc/{node.containerd.popen.pid}/limits").read_text()
    soft = next(line.split()[3] for line in limits.splitlines() if "locked memory" in line)
    return None if soft == "unlimited" else int(soft)


async def test_in_an_opted_in_namespace_the_doctor_passes_on_what_the_node_gave(
    webhook: WebhookProcess, plugins: None, real_node: RealNode, node_sample: Path,
    kube: AsyncClient, node_namespace: str,
) -> None:  # fmt: skip
    await opt_in(kube, node_namespace)
    body = training_pod("train", node_sample)  # the webhook adds rdmaplane.io/hca: 2
    body["spec"]["containers"][0]["command"] = ["sh", "-c", " ".join(DOCTOR) + "; sleep 3600"]
    name = await pods.create(kube, node_namespace, body)
    admitted = await pods.wait_phase(kube, node_namespace, name, ("Running",))
    given = (await held(real_node, node_namespace))[name]
    report = await _report(kube, node_namespace, name)
    container = admitted.spec.containers[0] if admitted.spec else None
    assert container is not None and container.resources is not None
    assert (container.resources.limits or {})[HCA] == "2"  # the webhook's, through the API server
    hcas = hcas_of(topology(node_sample), given.devices[HCA])
    assert sorted(report["usable_hcas"]) == sorted(h.name for h in hcas)
    passed = {n for n, s in statuses(report).items() if s == "PASS"}
    assert passed == set(statuses(report)) - NO_GPU_DRIVER, json.dumps(report["findings"])
    assert {"memlock", "dev-shm"} <= passed  # IPC_LOCK as runc applied it, the memory emptyDir
    assert report["status"] == "WARN"  # the doctor's exit 0


async def test_elsewhere_the_same_pod_fails_on_memlock_and_dev_shm_alone(
    plugins: None, real_node: RealNode, node_sample: Path, kube: AsyncClient, node_namespace: str
) -> None:
    name = await pods.create(kube, node_namespace, training_pod("plain", node_sample, hcas=2))
    pod = await pods.wait_phase(kube, node_namespace, name, ("Failed",))
    report = verdict(await pods.log(kube, node_namespace, name))
    failed = {n for n, s in statuses(report).items() if s == "FAIL"}
    memlock = node_memlock(real_node)
    expected = {"dev-shm"} | (
        {"memlock"} if memlock is not None and memlock < MEMLOCK_MIN else set()
    )
    assert failed == expected, report
    assert len(report["usable_hcas"]) == 2
    terminated = pod.status.containerStatuses[0].state.terminated  # type: ignore[index,union-attr]
    assert terminated is not None and terminated.exitCode == 1


async def test_the_webhooks_doctor_init_container_stops_a_pod_rdma_would_fail(
    webhook: WebhookProcess, plugins: None, kube: AsyncClient, node_namespace: str
) -> None:
    """Asked for with `rdmaplane.io/doctor: "true"`, the doctor runs first, with the pod's
    devices but this machine's real /sys: device nodes whose HCA sysfs does not show. It says
    so and exits 1, and the kubelet never starts the training container."""
    await opt_in(kube, node_namespace)
    body = pods.pod_body("checked", ["sleep", "3600"], image=PYTHON, limits={GPU: 1})
    body["metadata"]["annotations"] = {"rdmaplane.io/doctor": "true"}
    name = await pods.create(kube, node_namespace, body)
    pod = await pods.wait_phase(kube, node_namespace, name, ("Failed",))
    assert pod.status is not None
    (init,) = pod.status.initContainerStatuses or []
    assert init.name == "rdmaplane-doctor" and init.state.terminated is not None  # type: ignore[union-attr]
    assert init.state.terminated.exitCode == 1  # type: ignore[union-attr]
    assert init.image == IMAGE, init.image  # rdmaplane's own image, as the kubelet ran it
    report = verdict(await pods.log(kube, node_namespace, name, container="rdmaplane-doctor"))
    assert statuses(report)["rdma-devices"] == "FAIL", report
    assert ipc_lock_in_effect(report), report  # root, though the image's user is 65532
    main = (pod.status.containerStatuses or [])[0]
    assert main.state is not None and main.state.running is None and not main.started


def ipc_lock_in_effect(report: dict[str, Any]) -> bool:
    (memlock,) = (f for f in report["findings"] if f["name"] == "memlock")
    return memlock["status"] == "PASS" and "IPC_LOCK in the effective" in memlock["detail"]


async def test_the_doctor_job_runs_from_rdmaplanes_image_as_printed(
    plugins: None, real_node: RealNode, kube: AsyncClient, node_namespace: str
) -> None:
    """`rdmaplane doctor job` (default image) for this node and one more: the Job on this node
    runs its shell line (dash, the image's /bin/sh) under the printed securityContext; its
    checks say what this machine lacks (RDMA), with IPC_LOCK in effect."""
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rdmaplane", "doctor", "job", real_node.name, "zz-other-node",
        "--namespace", node_namespace, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    printed, _ = await cli.communicate()
    assert cli.returncode == 0
    (job,) = (
        d
        for d in yaml.safe_load_all(printed)
        if d["kind"] == "Job"
        and d["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"]
        == real_node.name
    )
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1
    await kube.create(Job.from_dict(job))
    try:
        selector = {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
        (pod,) = await pods.until(
            lambda: _job_pods(kube, node_namespace, selector), "the Job's pod"
        )
        name = pod.metadata.name
        await pods.wait_phase(kube, node_namespace, name, ("Running", "Succeeded", "Failed"))
        text = await pods.until(
            lambda: _first_document(kube, node_namespace, name, "doctor"), "the checks' report"
        )
        report = verdict(text)
        assert statuses(report)["rdma-devices"] == "FAIL", report  # this machine's real /sys
        assert ipc_lock_in_effect(report), report
    finally:
        await kube.delete(
            Job, job["metadata"]["name"], namespace=node_namespace,
            cascade=CascadeType.FOREGROUND,
        )  # fmt: skip


async def _job_pods(kube: AsyncClient, namespace: str, selector: dict[str, str]) -> list[Pod]:
    return [p async for p in kube.list(Pod, namespace=namespace, labels=selector)]


async def _first_document(kube: AsyncClient, namespace: str, name: str, container: str) -> str:
    """The first JSON document of a log (the doctor's `-o json` is indented: it ends at the
    first line that is a lone `}`), or "" while it is not all there."""
    text = await pods.log(kube, namespace, name, container=container)
    lines = text.splitlines()
    end = next((i for i, line in enumerate(lines) if line == "}"), None)
    return "" if end is None else "\n".join(lines[: end + 1])


async def _report(kube: AsyncClient, namespace: str, name: str) -> dict[str, Any]:
    """The doctor's JSON from a container that sleeps after it."""
    deadline = time.monotonic() + pods.WAIT_S
    while True:
        text = await pods.log(kube, namespace, name)
        if text.rstrip().endswith("}"):
            return verdict(text)
        assert time.monotonic() < deadline, text
        await asyncio.sleep(0.2)
