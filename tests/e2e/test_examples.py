"""Every manifest under examples/ is accepted by the real kube-apiserver (server-side dry run).
JobSet, PyTorchJob and Volcano Job are checked against CRDs written from their published APIs
(tests/e2e/fixtures/crds/; their Go modules are not all served here): the fields the examples
use are typed with their enums, so a misspelt action or policy fails here. Beyond the schema,
each example must carry the fault notice volume and tolerate the rdmaplane taint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import codecs
from lightkube.generic_resource import load_in_cluster_generic_resources

from rdmaplane.core.workloads import is_workload, pod_templates
from tests.e2e.conftest import _wait_established
from tests.e2e.controlplane import KubeCluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
CRDS = sorted((Path(__file__).parent / "fixtures" / "crds").glob("*.yaml"))


@pytest.fixture(scope="module")
def example_crds(kube_cluster: KubeCluster) -> Iterator[None]:
    with kube_cluster.client() as client:
        for path in CRDS:
            crd = codecs.load_all_yaml(path.read_text())[0]
            client.apply(crd, field_manager="rdmaplane-e2e", force=True)
            _wait_established(client, crd.metadata.name)
        load_in_cluster_generic_resources(client)
    yield


def test_there_is_an_example_per_job_controller() -> None:
    kinds = {d["kind"] for p in EXAMPLES for d in yaml.safe_load_all(p.read_text())}
    assert {"Job", "JobSet", "PyTorchJob"} <= kinds and len(EXAMPLES) == 5
    # each is a workload someone runs, so the checks below see a pod template in every file
    assert all(any(is_workload(d) for d in yaml.safe_load_all(p.read_text())) for p in EXAMPLES)


def _pod_templates(doc: dict[str, Any]) -> list[Any]:
    """Every pod template in a workload, wherever its kind keeps it (the one table every
    reader of manifests uses)."""
    if not is_workload(doc):
        return []
    return [t.template for t in pod_templates(doc, "example")]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_carries_the_notice_volume_and_the_toleration(path: Path) -> None:
    templates = [t for d in yaml.safe_load_all(path.read_text()) for t in _pod_templates(d)]
    assert templates
    for template in templates:
        pod = template["spec"]
        annotations = [
            v
            for v in pod["volumes"]
            if any(
                i["fieldRef"]["fieldPath"] == "metadata.annotations"
                for i in v.get("downwardAPI", {}).get("items", [])
            )
        ]
        assert len(annotations) == 1
        mounted = {m["name"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
        assert annotations[0]["name"] in mounted
        assert any(
            t["key"] == "rdmaplane.io/rdma-unhealthy"
            and t["effect"] == "NoExecute"
            and t.get("tolerationSeconds", 0) > 0
            for t in pod["tolerations"]
        )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_accepted_by_the_api_server(
    path: Path, kube_cluster: KubeCluster, example_crds: None
) -> None:
    namespace = f"examples-{path.stem}"
    kube_cluster.create_namespace(namespace)
    with kube_cluster.client() as client:
        for obj in codecs.load_all_yaml(path.read_text()):
            obj.metadata.namespace = namespace
            client.create(obj, dry_run=True)


def test_a_misspelt_action_is_rejected(kube_cluster: KubeCluster, example_crds: None) -> None:
    """The CRDs are strict enough to catch what matters (else the dry runs prove little)."""
    doc = next(yaml.safe_load_all((REPO / "examples" / "jobset.yaml").read_text()))
    doc["spec"]["failurePolicy"]["rules"][0]["action"] = "RestartJobset"
    doc["metadata"]["namespace"] = "default"
    with kube_cluster.client() as client, pytest.raises(Exception, match="Unsupported value"):
        client.create(codecs.from_dict(doc), dry_run=True)
