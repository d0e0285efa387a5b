"""The one table of pod-template paths: every kind it names finds the templates a hand-written
manifest of that kind has, and nothing else; bad shapes are one line naming the path."""

from __future__ import annotations

from typing import Any

import pytest

from rdmaplane.core.untrusted import DocumentError
from rdmaplane.core.workloads import WORKLOADS, is_workload, kind_of, pod_of, pod_templates
from tests.workload_manifests import MANIFESTS, manifest


def test_every_kind_of_the_table_has_a_manifest_here() -> None:
    assert set(MANIFESTS) == set(WORKLOADS)


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_the_templates_of_each_kind(kind: str) -> None:
    obj = manifest(kind)
    assert kind_of(obj) == kind and is_workload(obj)
    found = pod_templates(obj, "f.yaml")
    assert [t.pointer for t in found] == MANIFESTS[kind][1]
    for t in found:
        assert t.template["spec"]["containers"][0]["name"] == "trainer"


def test_a_volcano_job_is_not_a_batch_job() -> None:
    volcano, batch = manifest("batch.volcano.sh/Job"), manifest("batch/Job")
    assert [t.pointer for t in pod_templates(volcano, "v")] != [
        t.pointer for t in pod_templates(batch, "b")
    ]


@pytest.mark.parametrize(
    ("obj", "said"),
    [
        ({"apiVersion": "v1", "kind": "Service"}, "f: 'Service' (apiVersion 'v1') is not a Pod"),
        ({"apiVersion": "v1"}, "f: no kind (apiVersion 'v1') is not a Pod"),
        ({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {}}, "/spec/template: missing"),
        (
            {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": {}}}},
            "/spec/template/spec/containers: expected a list of containers",
        ),
        (
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "spec": {"pytorchReplicaSpecs": 3},
            },
            "/spec/pytorchReplicaSpecs: expected a list or a map",
        ),
        (
            {"apiVersion": "v1", "kind": "Pod", "metadata": [], "spec": {"containers": []}},
            "the pod/metadata",
        ),
    ],
)
def test_shapes_no_reader_can_use_are_one_line(obj: dict[str, Any], said: str) -> None:
    with pytest.raises(DocumentError) as caught:
        pod_templates(obj, "f")
    assert said in str(caught.value) and "None" not in str(caught.value)


def test_a_template_becomes_the_pod_its_controller_makes() -> None:
    job = manifest("batch/Job")
    job["metadata"]["namespace"] = "team"
    (template,) = pod_templates(job, "f")
    pod = pod_of(job, template)
    assert pod["metadata"]["namespace"] == "team"
    assert pod["metadata"]["labels"] == {"app": "train", "batch.kubernetes.io/job-name": "j"}
    assert pod["spec"] is template.template["spec"]
    assert "labels" not in template.template["metadata"] or template.template["metadata"][
        "labels"
    ] == {"app": "train"}  # the manifest is not changed
