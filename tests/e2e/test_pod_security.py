"""Every pod rdmaplane ships, from every manifest set and chart render, judged by the real API
server's PodSecurity admission: each component meets the Pod Security level docs/security.md
gives it (a server-side dry run of its pod in a namespace enforcing that level), and no less
strict level would do for those that need privileged (a namespace enforcing baseline refuses
them, for the reason said). Its namespace's enforced level admits it. Every container, whatever
its level, carries the same hardening: no privilege escalation, every capability dropped but
what it names, the runtime's seccomp profile, a read-only root filesystem, requests and a
memory limit, a pinned image tag (never `latest`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, ServiceAccount

from tests.e2e.controlplane import KubeCluster
from tests.e2e.test_helm_chart import (  # noqa: F401  (helm: the fixture)
    CUSTOM,
    EVERYTHING,
    helm,
    kustomize_base,
    render,
)

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
LEVELS = ("privileged", "baseline", "restricted")  # least strict first
# The level each component meets (docs/security.md) and, for those that need privileged, what
# baseline refuses them for (PodSecurity's words).
COMPONENTS: dict[str, tuple[str, str]] = {
    "rdmaplane-agent": ("privileged", "host namespaces (hostNetwork=true)"),
    "rdmaplane-dra-driver": ("privileged", "host namespaces (hostNetwork=true)"),
    "rdmaplane-device-plugin": ("privileged", "hostPath volumes"),
    "rdmaplane-doctor": ("privileged", 'non-default capabilities (container "doctor"'),
    "rdmaplane-scheduler-extender": ("restricted", ""),
    "rdmaplane-webhook": ("restricted", ""),
}
WORKLOADS = ("DaemonSet", "Deployment", "Job")


def _sets(helm_bin: Path) -> dict[str, list[dict[str, Any]]]:
    """Every manifest set users apply: the default set, deploy/dra/, the standalone device
    plugin, the doctor example, and the chart's default and non-default renders."""

    def objects(path: Path) -> list[dict[str, Any]]:
        return [d for d in yaml.safe_load_all(path.read_text()) if d]

    return {
        "deploy/": kustomize_base(),
        "deploy/dra/": kustomize_base(DEPLOY / "dra"),
        "deploy/device-plugin/": objects(DEPLOY / "device-plugin" / "daemonset.yaml"),
        "deploy/doctor/": objects(DEPLOY / "doctor" / "example-3-nodes.yaml"),
        "chart": render(helm_bin, "--set", "createNamespace=true"),
        "chart -f ci/custom-values.yaml": render(helm_bin, "-f", str(CUSTOM)),
        "chart, every optional part": render(helm_bin, *EVERYTHING),
    }


def _component(workload: dict[str, Any]) -> str:
    name = str(workload["metadata"]["name"])
    return next(c for c in sorted(COMPONENTS, key=len, reverse=True) if name.startswith(c))


def _pods(helm_bin: Path) -> Iterator[tuple[str, str, dict[str, Any], str | None]]:
    """(set, component, pod template spec, the enforce level of its namespace in that set)."""
    for where, objects in _sets(helm_bin).items():
        levels = {
            o["metadata"]["name"]: (o["metadata"].get("labels") or {}).get(
                "pod-security.kubernetes.io/enforce"
            )
            for o in objects
            if o["kind"] == "Namespace"
        }
        for o in objects:
            if o["kind"] in WORKLOADS:
                spec = o["spec"]["template"]["spec"]
                yield where, _component(o), spec, levels.get(o["metadata"].get("namespace"))


@pytest.fixture(scope="module")
def enforcing(kube_cluster: KubeCluster) -> dict[str, str]:
    """A namespace per level, enforcing it (latest version), with the ServiceAccounts the pods
    name (the ServiceAccount admission plugin wants them)."""
    suffix = uuid.uuid4().hex[:6]
    names = {level: f"psa-{level}-{suffix}" for level in LEVELS}
    with kube_cluster.client() as client:
        for level, name in names.items():
            labels = {
                "pod-security.kubernetes.io/enforce": level,
                "pod-security.kubernetes.io/enforce-version": "latest",
            }
            client.create(Namespace(metadata=ObjectMeta(name=name, labels=labels)))
            for account in ("default", *(f"{c}" for c in COMPONENTS)):
                client.create(ServiceAccount(metadata=ObjectMeta(name=account, namespace=name)))
    return names


def _admitted(kube_cluster: KubeCluster, namespace: str, spec: dict[str, Any]) -> str:
    """`ok`, or PodSecurity's refusal, for a dry run of a pod with `spec` in `namespace`."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"psa-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "spec": {**spec, "serviceAccountName": spec.get("serviceAccountName", "default")},
    }
    with kube_cluster.client() as client:
        try:
            client.create(codecs.from_dict(pod), dry_run=True)
        except ApiError as e:
            return e.status.message or str(e)
    return "ok"


def test_every_component_meets_its_level_and_needs_no_more(
    helm: Path,  # noqa: F811
    kube_cluster: KubeCluster,
    enforcing: dict[str, str],
) -> None:
    seen = set()
    for where, component, spec, namespace_level in _pods(helm):
        level, why_not_baseline = COMPONENTS[component]
        seen.add(component)
        assert _admitted(kube_cluster, enforcing[level], spec) == "ok", (where, component)
        if level == "privileged":
            refused = _admitted(kube_cluster, enforcing["baseline"], spec)
            assert "violates PodSecurity" in refused and why_not_baseline in refused, (
                where,
                component,
                refused,
            )
        if namespace_level is not None:  # a namespace the set makes: its level admits it
            assert LEVELS.index(namespace_level) <= LEVELS.index(level), (where, component)
    assert seen == set(COMPONENTS)


def test_every_container_is_hardened_whatever_its_level(helm: Path) -> None:  # noqa: F811
    for where, component, spec, _ in _pods(helm):
        pod_seccomp = (spec.get("securityContext") or {}).get("seccompProfile")
        for c in spec.get("initContainers", []) + spec["containers"]:
            context = c.get("securityContext") or {}
            what = (where, component, c["name"])
            assert context.get("allowPrivilegeEscalation") is False, what
            assert context.get("privileged", False) is False, what
            assert context.get("readOnlyRootFilesystem") is True, what
            assert context.get("capabilities", {}).get("drop") == ["ALL"], what
            seccomp = context.get("seccompProfile") or pod_seccomp
            assert seccomp == {"type": "RuntimeDefault"}, what
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], what
            image = str(c["image"])
            assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), what
