"""Workloads as people write them, one per kind rdmaplane reads pod templates from, each with
the JSON pointers of its pod templates as a reader must find them (written by hand from each
project's API, not from rdmaplane.core.workloads)."""

from __future__ import annotations

from typing import Any

import yaml

_POD = """
      metadata: {labels: {app: train}}
      spec:
        containers:
        - name: trainer
          image: ghcr.io/example/train:1
          resources: {limits: {nvidia.com/gpu: "8", memory: 64Gi}}
"""


def _with_pod(head: str, at: int) -> str:
    """`head` with the pod template appended at column `at`."""
    lines = _POD.strip("\n").splitlines()
    return head + "".join(" " * at + line[6:] + "\n" for line in lines)


MANIFESTS: dict[str, tuple[str, list[str]]] = {
    "Pod": (
        _with_pod("apiVersion: v1\nkind: Pod\n", 0).replace("{labels:", "{name: p, labels:"),
        [""],
    ),
    "PodTemplate": (
        _with_pod("apiVersion: v1\nkind: PodTemplate\nmetadata: {name: t}\ntemplate:\n", 2),
        ["/template"],
    ),
    "ReplicationController": (
        _with_pod(
            "apiVersion: v1\nkind: ReplicationController\nmetadata: {name: rc}\n"
            "spec:\n  replicas: 1\n  template:\n",
            4,
        ),
        ["/spec/template"],
    ),
    "apps/Deployment": (
        _with_pod(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"
            "spec:\n  selector: {matchLabels: {app: train}}\n  template:\n",
            4,
        ),
        ["/spec/template"],
    ),
    "apps/ReplicaSet": (
        _with_pod(
            "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: rs}\n"
            "spec:\n  selector: {matchLabels: {app: train}}\n  template:\n",
            4,
        ),
        ["/spec/template"],
    ),
    "apps/StatefulSet": (
        _with_pod(
            "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: s}\n"
            "spec:\n  serviceName: s\n  selector: {matchLabels: {app: train}}\n  template:\n",
            4,
        ),
        ["/spec/template"],
    ),
    "apps/DaemonSet": (
        _with_pod(
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: ds}\n"
            "spec:\n  selector: {matchLabels: {app: train}}\n  template:\n",
            4,
        ),
        ["/spec/template"],
    ),
    "batch/Job": (
        _with_pod("apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  template:\n", 4),
        ["/spec/template"],
    ),
    "batch/CronJob": (
        _with_pod(
            "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: c}\nspec:\n"
            "  schedule: '@daily'\n  jobTemplate:\n    spec:\n      template:\n",
            8,
        ),
        ["/spec/jobTemplate/spec/template"],
    ),
    "jobset.x-k8s.io/JobSet": (
        _with_pod(
            "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: js}\n"
            "spec:\n  replicatedJobs:\n  - name: driver\n    template:\n      spec:\n"
            "        template:\n",
            10,
        )
        + _with_pod(
            "  - name: workers\n    replicas: 2\n    template:\n      spec:\n        template:\n",
            10,
        ),
        [
            "/spec/replicatedJobs/0/template/spec/template",
            "/spec/replicatedJobs/1/template/spec/template",
        ],
    ),
    "leaderworkerset.x-k8s.io/LeaderWorkerSet": (
        _with_pod(
            "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\n"
            "metadata: {name: lws}\nspec:\n  leaderWorkerTemplate:\n    size: 4\n"
            "    leaderTemplate:\n",
            6,
        )
        + _with_pod("    workerTemplate:\n", 6),
        ["/spec/leaderWorkerTemplate/leaderTemplate", "/spec/leaderWorkerTemplate/workerTemplate"],
    ),
    "batch.volcano.sh/Job": (
        _with_pod(
            "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: vj}\n"
            "spec:\n  minAvailable: 2\n  tasks:\n  - name: master\n    replicas: 1\n"
            "    template:\n",
            6,
        )
        + _with_pod("  - name: worker\n    replicas: 1\n    template:\n", 6),
        ["/spec/tasks/0/template", "/spec/tasks/1/template"],
    ),
    "kubeflow.org/PyTorchJob": (
        _with_pod(
            "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: pt}\n"
            "spec:\n  pytorchReplicaSpecs:\n    Master:\n      replicas: 1\n"
            "      template:\n",
            8,
        )
        + _with_pod("    Worker:\n      replicas: 3\n      template:\n", 8),
        ["/spec/pytorchReplicaSpecs/Master/template", "/spec/pytorchReplicaSpecs/Worker/template"],
    ),
    "kubeflow.org/TFJob": (
        _with_pod(
            "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {name: tf}\n"
            "spec:\n  tfReplicaSpecs:\n    Worker:\n      template:\n",
            8,
        ),
        ["/spec/tfReplicaSpecs/Worker/template"],
    ),
    "kubeflow.org/MPIJob": (
        _with_pod(
            "apiVersion: kubeflow.org/v2beta1\nkind: MPIJob\nmetadata: {name: mpi}\n"
            "spec:\n  mpiReplicaSpecs:\n    Launcher:\n      template:\n",
            8,
        )
        + _with_pod("    Worker:\n      replicas: 2\n      template:\n", 8),
        ["/spec/mpiReplicaSpecs/Launcher/template", "/spec/mpiReplicaSpecs/Worker/template"],
    ),
    "kubeflow.org/XGBoostJob": (
        _with_pod(
            "apiVersion: kubeflow.org/v1\nkind: XGBoostJob\nmetadata: {name: xgb}\n"
            "spec:\n  xgbReplicaSpecs:\n    Master:\n      template:\n",
            8,
        ),
        ["/spec/xgbReplicaSpecs/Master/template"],
    ),
    "kubeflow.org/PaddleJob": (
        _with_pod(
            "apiVersion: kubeflow.org/v1\nkind: PaddleJob\nmetadata: {name: pd}\n"
            "spec:\n  paddleReplicaSpecs:\n    Worker:\n      template:\n",
            8,
        ),
        ["/spec/paddleReplicaSpecs/Worker/template"],
    ),
    "kubeflow.org/JAXJob": (
        _with_pod(
            "apiVersion: kubeflow.org/v1\nkind: JAXJob\nmetadata: {name: jax}\n"
            "spec:\n  jaxReplicaSpecs:\n    Worker:\n      template:\n",
            8,
        ),
        ["/spec/jaxReplicaSpecs/Worker/template"],
    ),
}


def manifest(kind: str) -> dict[str, Any]:
    doc = yaml.safe_load(MANIFESTS[kind][0])
    assert isinstance(doc, dict)
    return doc
