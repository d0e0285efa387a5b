"""deploy/agent/critical-pods-quota.yaml on an API server that limits the critical priority
classes to namespaces with a quota naming them (ResourceQuota admission's limitedResources, as
GKE configures it), with kube-controller-manager's quota controller: without the quota the
agent's and the webhook's pods are refused in rdmaplane's namespace; with it they are
admitted (server-side dry runs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import ResourceQuota

from tests.e2e import nodeaccess
from tests.e2e.controlplane import (
    KubeCluster,
    control_plane,
    launch_controller_manager,
    poll_until,
)

REPO = Path(__file__).resolve().parents[2]
QUOTA = REPO / "deploy" / "agent" / "critical-pods-quota.yaml"
WEBHOOK = REPO / "deploy" / "webhook" / "deployment.yaml"
CRITICAL = ["system-node-critical", "system-cluster-critical"]


def _limited(workdir: Path) -> list[str]:
    config = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {
                "name": "ResourceQuota",
                "configuration": {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "ResourceQuotaConfiguration",
                    "limitedResources": [
                        {
                            "resource": "pods",
                            "matchScopes": [
                                {"scopeName": "PriorityClass", "operator": "In", "values": CRITICAL}
                            ],
                        }
                    ],
                },
            }
        ],
    }
    path = workdir / "admission.yaml"
    path.write_text(yaml.safe_dump(config))
    return [f"--admission-control-config-file={path}"]


@pytest.fixture(scope="module")
def limited_cluster(k8s_bin_dir: Path) -> Iterator[KubeCluster]:
    with control_plane(k8s_bin_dir, _limited) as cluster:
        kcm = launch_controller_manager(cluster, ("resourcequota",))
        try:
            with cluster.client() as client:
                for obj in codecs.load_all_yaml(nodeaccess.AGENT_RBAC.read_text()):
                    client.apply(obj, field_manager="rdmaplane-e2e", force=True)
                for obj in codecs.load_all_yaml((REPO / "deploy/webhook/rbac.yaml").read_text()):
                    if obj.kind == "ServiceAccount":
                        client.apply(obj, field_manager="rdmaplane-e2e", force=True)
            yield cluster
        finally:
            kcm.stop()


def _outcome(client: Client, pod: dict[str, Any]) -> str:
    try:
        client.create(codecs.from_dict(pod), dry_run=True)
    except ApiError as e:
        return e.status.message or str(e)
    return "ok"


def test_the_shipped_quota_admits_the_critical_pods(limited_cluster: KubeCluster) -> None:
    pods = [
        nodeaccess.daemon_pod(nodeaccess.AGENT_DAEMONSET, "gpu-1"),
        nodeaccess.workload_pod(WEBHOOK, "Deployment"),
    ]
    with limited_cluster.client() as client:
        for pod in pods:
            refused = _outcome(client, pod)
            assert "insufficient quota to match these scopes" in refused, refused
        (quota,) = codecs.load_all_yaml(QUOTA.read_text())
        client.create(quota)

        def counted() -> bool:  # the quota controller has computed its usage
            status = client.get(ResourceQuota, "rdmaplane-critical-pods", namespace="rdmaplane")
            return bool(status.status and status.status.used is not None)

        poll_until(counted, 60, "the quota's usage computed")
        for pod in pods:
            assert _outcome(client, pod) == "ok", pod["metadata"]["name"]
