"""Every Kubernetes manifest under deploy/ is accepted by the real kube-apiserver: a server-side
dry run (schema validation, defaulting, admission), so a typo in a DaemonSet fails here, not on
a customer's cluster. Namespaces are created for real: the objects in them need one."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightkube import codecs

from tests.e2e.controlplane import KubeCluster

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# Component configuration and kustomize's file, not API objects: checked by the loaders' tests
# and tests/integration/test_deploy_configs.py instead.
CONFIG_FILES = {
    "kustomization.yaml",
    "dra/kustomization.yaml",
    "dra/kube-scheduler-config.yaml",
    "device-plugin/config-exclusive.yaml",
    "device-plugin/config-shared.yaml",
    "scheduler/extender-config.yaml",
    "scheduler/kube-scheduler-config.yaml",
}
# The Helm chart's templates are not manifests until rendered: tests/e2e/test_helm_chart.py.
MANIFESTS = sorted(
    p
    for p in DEPLOY.rglob("*.yaml")
    if str(p.relative_to(DEPLOY)) not in CONFIG_FILES and "helm" not in p.relative_to(DEPLOY).parts
)


def test_the_manifest_list_is_not_empty() -> None:
    names = {str(p.relative_to(DEPLOY)) for p in MANIFESTS}
    assert {"agent/daemonset.yaml", "agent/rbac.yaml", "scheduler/extender.yaml"} <= names
    assert {"webhook/webhook.yaml", "webhook/rbac.yaml", "webhook/deployment.yaml"} <= names


@pytest.fixture(scope="module")
def deploy_namespaces(kube_cluster: KubeCluster) -> None:
    """Every Namespace deploy/ defines, created for real: a manifest may use one another
    manifest defines (the agent's DaemonSet lives in the namespace of its RBAC file)."""
    with kube_cluster.client() as client:
        for path in MANIFESTS:
            for obj in codecs.load_all_yaml(path.read_text()):
                if obj.kind == "Namespace":
                    client.apply(obj, field_manager="rdmaplane-e2e", force=True)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_manifest_is_accepted_by_the_api_server(
    path: Path, kube_cluster: KubeCluster, nrt_crd: object, deploy_namespaces: None
) -> None:
    objects = list(codecs.load_all_yaml(path.read_text()))
    assert objects, f"{path} holds no Kubernetes object"
    with kube_cluster.client() as client:
        for obj in objects:
            real = obj.kind in ("Namespace", "CustomResourceDefinition")  # already there
            client.apply(obj, field_manager="rdmaplane-e2e", force=True, dry_run=not real)
