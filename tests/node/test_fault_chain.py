"""The fault chain end to end on the real node, the kubelet's own PodResources as the agent's view.

The rdmaplane agent (its device plugin embedded, registered with the real kubelet) runs on a
copy of the sample tree. A Job with the podFailurePolicy of examples/indexed-job.yaml runs the
documented training loop (examples/train/ddp.py, one rank on gloo; PyTorch from the host's
site-packages) with its checkpoints in a hostPath folder. A port under the pod goes down:

  the agent reads from the real PodResources which pod holds the HCA → annotates it → the real
  kubelet refreshes the downward-API file (a second container times when it shows the notice)
  → the training loop saves and exits 75 (on the notice, or on the eviction's SIGTERM) → the
  Job controller ignores the failure → the replacement gets healthy HCAs from the kubelet and
  resumes from the checkpoint at the step saved; the Job's `failed` stays 0.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import ApiError, AsyncClient, codecs
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod
from lightkube.types import CascadeType

from rdmaplane.core.settings.agent import FaultSettings, PublishSettings
from rdmaplane.core.settings.deviceplugin import PluginSettings
from tests.e2e.test_agent import install_rbac, running_agent
from tests.node import pods
from tests.node.conftest import NodeCluster
from tests.node.images import HOST_SITE
from tests.node.plugins import HCA, held, wait_allocatable
from tests.node.pods import until
from tests.node.realnode import PYTHON, RealNode
from tests.node.test_device_plugin import hcas_of, topology

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_JOB = REPO / "examples" / "indexed-job.yaml"
TRAIN = REPO / "examples" / "train"
NOTICE = "rdmaplane.io/fault"
# the notice first (the kubelet refreshes the file within a second), the eviction after
FAULT = FaultSettings(
    fatal_after_s=1.0, clear_after_s=60.0, grace_s=8.0, max_evictions_per_minute=4
)
# times the notice's arrival in the file; leaves at SIGTERM (as PID 1 it has no default action)
WATCH = (
    "trap 'exit 0' TERM;"
    f" until grep -q '{NOTICE}' /etc/podinfo/annotations 2>/dev/null; do sleep 0.05; done;"
    " echo notice seen; sleep 3600 & wait"
)


def example_failure_policy() -> dict[str, Any]:
    """The podFailurePolicy of examples/indexed-job.yaml, as users copy it."""
    job = next(d for d in yaml.safe_load_all(EXAMPLE_JOB.read_text()) if d["kind"] == "Job")
    policy: dict[str, Any] = job["spec"]["podFailurePolicy"]
    return policy


def training_job(name: str, node: RealNode, checkpoints: Path) -> dict[str, Any]:
    mount = {"readOnly": True}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 3,
            "podReplacementPolicy": "Failed",
            "podFailurePolicy": example_failure_policy(),
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 30,
                    "automountServiceAccountToken": False,
                    "nodeSelector": {"kubernetes.io/hostname": node.name},
                    "containers": [
                        {
                            "name": "trainer",
                            "image": PYTHON,
                            "imagePullPolicy": "Never",
                            "command": ["python", str(TRAIN / "ddp.py"), "--checkpoint-dir=/ckpt",
                                        "--steps=100000", "--every=5", "--step-time=0.05"],
                            "env": [
                                {"name": "RDMAPLANE_ANNOTATIONS_FILE",
                                 "value": "/etc/podinfo/annotations"},
                                {"name": "PYTHONPATH", "value": str(HOST_SITE)},  # torch
                                {"name": "MASTER_ADDR", "value": "127.0.0.1"},
                                {"name": "MASTER_PORT", "value": "29500"},
                                {"name": "RANK", "value": "0"},
                                {"name": "WORLD_SIZE", "value": "1"},
                            ],
                            "resources": {"limits": {HCA: "2"}},
                            "volumeMounts": [
                                {"name": "podinfo", "mountPath": "/etc/podinfo", **mount},
                                {"name": "ckpt", "mountPath": "/ckpt"},
                                {"name": "train", "mountPath": str(TRAIN), **mount},
                                {"name": "site", "mountPath": str(HOST_SITE), **mount},
                            ],
                        },
                        {
                            "name": "watch",
                            "image": PYTHON,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", WATCH],
                            "volumeMounts": [
                                {"name": "podinfo", "mountPath": "/etc/podinfo", **mount}
                            ],
                        },
                    ],
                    "volumes": [
                        {"name": "podinfo", "downwardAPI": {"items": [
                            {"path": "annotations",
                             "fieldRef": {"fieldPath": "metadata.annotations"}}]}},
                        {"name": "ckpt", "hostPath": {"path": str(checkpoints)}},
                        {"name": "train", "hostPath": {"path": str(TRAIN)}},
                        {"name": "site", "hostPath": {"path": str(HOST_SITE)}},
                    ],
                }
            },
        },
    }  # fmt: skip


async def job_pods(kube: AsyncClient, namespace: str, job: str) -> list[Pod]:
    selector = {"batch.kubernetes.io/job-name": job}
    found = [p async for p in kube.list(Pod, namespace=namespace, labels=selector)]
    return sorted(found, key=lambda p: p.metadata.creationTimestamp)  # type: ignore[union-attr,return-value]


def log_time(line: str) -> float:
    """The wall-clock time of a log line fetched with timestamps (RFC 3339, ns)."""
    stamp = line.split()[0]
    return dt.datetime.fromisoformat(stamp[:26] + "+00:00").timestamp()


@pytest.fixture
def agent_tree(node_sample: Path, tmp_path: Path) -> Path:
    """The agent's own copy of the node's sysfs: this test takes a port down in it."""
    return Path(shutil.copytree(node_sample, tmp_path / "sys", symlinks=True))


async def test_a_port_down_restarts_the_job_from_its_checkpoint_on_healthy_hcas(
    real_node: RealNode, node_cluster: NodeCluster, agent_tree: Path, kube: AsyncClient,
    node_namespace: str, node_nrt_crd: None, tmp_path: Path,
) -> None:  # fmt: skip
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    kubeconfig = install_rbac(node_cluster.cluster)
    publish = PublishSettings(backoff_initial_s=0.2, backoff_max_s=1.0)
    async with running_agent(
        kubeconfig, real_node.name, agent_tree, real_node.workdir,
        PluginSettings(), fault=FAULT, publish=publish,
    ):  # fmt: skip
        await wait_allocatable(kube, real_node, {HCA: 9})
        await kube.create(codecs.from_dict(training_job("train", real_node, checkpoints)),
                          namespace=node_namespace)  # fmt: skip
        (first,) = await until(lambda: job_pods(kube, node_namespace, "train"), "the first pod")
        name = first.metadata.name  # type: ignore[union-attr]
        await pods.wait_phase(kube, node_namespace, name, ("Running",))
        await until(lambda: _logged(kube, node_namespace, name, "starting at step 0"), "training")
        await until(lambda: any(checkpoints.iterdir()), "a first checkpoint")
        given = hcas_of(
            topology(agent_tree), (await held(real_node, node_namespace))[name].devices[HCA]
        )
        victim = given[0]

        (agent_tree / f"class/infiniband/{victim.name}/ports/1/state").write_text("1: DOWN\n")
        down = time.time()
        annotated = await until(lambda: _annotated(kube, node_namespace, name), "the notice")
        seen = await until(lambda: _logged(kube, node_namespace, name, "notice seen", "watch"),
                           "the notice in the downward-API file")  # fmt: skip
        refresh_s = log_time(seen) - annotated
        saved = await until(lambda: _logged(kube, node_namespace, name, "saved step"), "the save")
        step = int(re.search(r"saved step (\d+)", saved).group(1))  # type: ignore[union-attr]
        ended = await pods.wait_phase(kube, node_namespace, name, ("Failed",))
        trainer = next(c for c in ended.status.containerStatuses if c.name == "trainer")  # type: ignore[union-attr]
        assert trainer.state.terminated.exitCode == 75  # type: ignore[union-attr]

        second = await until(lambda: _other(kube, node_namespace, name), "the replacement")
        await pods.wait_phase(kube, node_namespace, second, ("Running",))
        resumed = await until(lambda: _logged(kube, node_namespace, second, "starting at step"),
                              "the replacement's start")  # fmt: skip
        replaced_at = time.time()
        again = hcas_of(topology(agent_tree),
                        (await held(real_node, node_namespace))[second].devices[HCA])  # fmt: skip
        job = await kube.get(Job, "train", namespace=node_namespace)
        await kube.delete(Job, "train", namespace=node_namespace, cascade=CascadeType.BACKGROUND)
    assert f"starting at step {step}" in resumed
    assert victim not in again and len(again) == 2
    assert job.status is not None and not job.status.failed
    print(
        f"\nfault chain on the real node: port down -> notice {annotated - down:.2f} s,"
        f" notice -> downward-API file in the container {refresh_s:.2f} s, saved step {step},"
        f" replacement resumed {replaced_at - down:.1f} s after the port went down"
    )


async def _logged(
    kube: AsyncClient, namespace: str, name: str, text: str, container: str = "trainer"
) -> str | None:
    """The first log line of `container` with `text` (timestamped), None while there is none."""
    try:
        log = await pods.log(kube, namespace, name, container=container, timestamps=True)
    except (ApiError, httpx.HTTPError):  # not started yet
        return None
    return next((line for line in log.splitlines() if text in line), None)


async def _annotated(kube: AsyncClient, namespace: str, name: str) -> float | None:
    pod = await kube.get(Pod, name, namespace=namespace)
    annotations = (pod.metadata.annotations if pod.metadata else None) or {}
    return time.time() if NOTICE in annotations else None


async def _other(kube: AsyncClient, namespace: str, first: str) -> str | None:
    """A pod of the Job other than `first` (which the eviction deletes once it failed)."""
    names = [p.metadata.name for p in await job_pods(kube, namespace, "train") if p.metadata]
    return next((n for n in names if n != first), None)
