"""The node agent's access as deployed: its RBAC and the DRA driver's, the own-node admission
policies of deploy/agent/own-node.yaml, and the credential its pod really gets: a token bound
to the DaemonSet's pod on the node, in which the API server names that node.

Shared by tests/e2e/test_own_node.py, the fault chain (tests/e2e/faultrig.py) and
bench/fault.py, so the agent there runs under the policy as it would in a cluster.
"""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Node, Pod

from tests.e2e.controlplane import KubeCluster, poll_until

REPO = Path(__file__).resolve().parents[2]
AGENT_RBAC = REPO / "deploy" / "agent" / "rbac.yaml"
DRA_RBAC = REPO / "deploy" / "dra" / "rbac.yaml"
OWN_NODE = REPO / "deploy" / "agent" / "own-node.yaml"
AGENT_DAEMONSET = REPO / "deploy" / "agent" / "daemonset.yaml"
DRA_DAEMONSET = REPO / "deploy" / "dra" / "daemonset.yaml"
AGENT_USER = "system:serviceaccount:rdmaplane:rdmaplane-agent"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POLICY_WAIT_S = 30.0


def install(
    cluster: KubeCluster, manifests: tuple[Path, ...] = (AGENT_RBAC, DRA_RBAC, OWN_NODE)
) -> None:
    """The agent's and the DRA driver's RBAC and the own-node policies, as deployed (or the
    `manifests` given, OWN_NODE among them); returns once the API server enforces the agent's
    policies."""
    with cluster.client() as client:
        for path in manifests:
            for obj in codecs.load_all_yaml(path.read_text()):
                client.apply(obj, field_manager="rdmaplane-e2e", force=True)
        _wait_in_effect(cluster, client)


def uninstall(cluster: KubeCluster) -> None:
    """Remove the agent's own-node policies (OWN_NODE; the RBAC stays); returns once the API
    server no longer enforces them, so agents with credentials that name no node work again."""
    with cluster.client() as client:
        for obj in codecs.load_all_yaml(OWN_NODE.read_text()):
            assert obj.metadata is not None and obj.metadata.name is not None
            client.delete(type(obj), obj.metadata.name)
        _wait_in_effect(cluster, client, enforced=False)


def _wait_in_effect(cluster: KubeCluster, client: Client, enforced: bool = True) -> None:
    """Policies take effect once the API server's informers have them (and, for evictions, its
    pod informer the probe pod): probe, as the agent's user with a token naming another node,
    a node patch and an eviction (both dry runs) until both are refused (`enforced`), or
    both are let through."""
    probe = f"policy-probe-{uuid.uuid4().hex[:6]}"
    client.create(Node.from_dict({"metadata": {"name": probe}}))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": probe, "namespace": "default"},
        "spec": {"nodeName": probe, "containers": [{"name": "c", "image": "registry.invalid/c"}]},
    }
    client.create(codecs.from_dict(pod))
    headers = {
        "Impersonate-User": AGENT_USER,
        f"Impersonate-Extra-{NODE_NAME_EXTRA.replace('/', '%2F')}": "elsewhere",
    }
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": probe, "namespace": "default"},
    }
    api = f"{cluster.server}/api/v1"
    try:
        with httpx.Client(verify=cluster.tls_context(), headers=headers) as http:

            def settled() -> bool:
                patched = http.patch(
                    f"{api}/nodes/{probe}?dryRun=All",
                    json={"metadata": {"labels": {"rdmaplane.io/probe": "x"}}},
                    headers={"Content-Type": "application/merge-patch+json"},
                )
                evicted = http.post(
                    f"{api}/namespaces/default/pods/{probe}/eviction?dryRun=All", json=eviction
                )
                if enforced:
                    return patched.status_code == evicted.status_code == 403
                return 403 not in (patched.status_code, evicted.status_code)

            state = "in effect" if enforced else "lifted"
            poll_until(settled, POLICY_WAIT_S, f"the own-node policies {state}")
    finally:
        client.delete(Pod, probe, namespace="default", grace_period=0)
        client.delete(Node, probe)


def workload_pod(manifest: Path, kind: str, node: str | None = None) -> dict[str, Any]:
    """The pod the controller of the `kind` (DaemonSet, Deployment) in `manifest` would make:
    its template's, in its namespace, bound to `node` when one is given (as the DaemonSet
    controller binds its pods)."""
    (workload,) = (d for d in yaml.safe_load_all(manifest.read_text()) if d["kind"] == kind)
    template = copy.deepcopy(workload["spec"]["template"])
    meta = workload["metadata"]
    spec = {**template["spec"], **({"nodeName": node} if node else {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **template["metadata"],
            "name": f"{meta['name']}-{node or 'pod'}",
            "namespace": meta["namespace"],
        },
        "spec": spec,
    }


def daemon_pod(daemonset: Path, node: str) -> dict[str, Any]:
    """The pod the DaemonSet controller would make for `node`."""
    return workload_pod(daemonset, "DaemonSet", node)


def kubeconfig_on(cluster: KubeCluster, node: str, daemonset: Path = AGENT_DAEMONSET) -> Path:
    """The credential `daemonset`'s pod on `node` gets: its ServiceAccount's token bound to
    that pod (created here; `remove_pod` ends it)."""
    return cluster.kubeconfig_for_pod(daemon_pod(daemonset, node))


def remove_pod(cluster: KubeCluster, node: str, daemonset: Path = AGENT_DAEMONSET) -> None:
    meta = daemon_pod(daemonset, node)["metadata"]
    with cluster.client() as client:
        client.delete(Pod, meta["name"], namespace=meta["namespace"], grace_period=0)
