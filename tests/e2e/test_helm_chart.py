"""The Helm chart deploy/helm/rdmaplane: `helm lint --strict` clean, its default render the
same objects as the kustomize base, and every render (default, non-default values, cert-manager
mode) accepted by the real kube-apiserver in a server-side dry run.

Helm is built from its Go module by scripts/build-k8s.sh (`--helm-bin-dir`), like the control
plane; a missing binary fails these tests, it never skips them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client, codecs
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

from rdmaplane import IMAGE
from rdmaplane.adapters.config import Kind, parse
from rdmaplane.adapters.config.agent import AGENT_CONFIG
from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG
from rdmaplane.adapters.config.extender import SCHEDULER_EXTENDER_CONFIG
from rdmaplane.adapters.config.webhook import WEBHOOK_CONFIG
from tests.e2e.controlplane import KubeCluster, poll_until

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "rdmaplane"
CUSTOM = CHART / "ci" / "custom-values.yaml"
CERT_MANAGER_CRDS = Path(__file__).parent / "fixtures" / "cert-manager-crds.yaml"
PROMETHEUS_CRDS = Path(__file__).parent / "fixtures" / "prometheus-operator-crds.yaml"
OWN_TOLERATION = {"key": "rdmaplane.io/rdma-unhealthy", "operator": "Exists"}
# Every optional part on (all off by default).
EVERYTHING = (
    "--set", "metrics.podMonitor.enabled=true",
    "--set", "extender.tls.secretName=extender-tls",
    "--set", "extender.networkPolicy.enabled=true",
    "--set", "extender.debugRemote=true",
    "--set", "agent.fixNetnsMode=true",
    "--set", "agent.cdi.enabled=true",
    "--set", "schedulerConfig.configMap=true",
    "--set", "schedulerConfig.tlsCaFile=/etc/kubernetes/pki/ca.crt",
)  # fmt: skip
# Labels and annotations only the chart adds (Helm's conventions; a config checksum that rolls
# pods when their config changes). Selectors carry none of them.
CHART_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/part-of",
}
CHART_ANNOTATIONS = {"checksum/config"}
# So lightkube can load the chart's cert-manager and Prometheus Operator objects.
for _kind, _plural in (("Certificate", "certificates"), ("Issuer", "issuers")):
    create_namespaced_resource("cert-manager.io", "v1", _kind, _plural)
create_namespaced_resource("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors")


# ConfigMap keys that hold rdmaplane configs: compared as the components load them.
CONFIG_KINDS: dict[str, Kind[Any]] = {
    "agent.yaml": AGENT_CONFIG,
    "device-plugin.yaml": DEVICE_PLUGIN_CONFIG,
    "config.yaml": SCHEDULER_EXTENDER_CONFIG,
    "webhook.yaml": WEBHOOK_CONFIG,
}


def loaded(key: str, text: str) -> Any:
    return parse(yaml.safe_load(text), CONFIG_KINDS[key], key)


@pytest.fixture(scope="module")
def helm() -> Path:
    configured = os.environ.get("RDMAPLANE_HELM_BIN")
    if configured:
        bin_dir = Path(configured)
    else:
        script = REPO / "scripts" / "build-k8s.sh"
        found = subprocess.run([str(script), "--helm-bin-dir"], capture_output=True, text=True)
        bin_dir = Path(found.stdout.strip())
    if not (bin_dir / "helm").is_file():
        pytest.fail(
            f"no helm in {bin_dir}: run `make k8s-bins` (scripts/build-k8s.sh)", pytrace=False
        )
    return bin_dir / "helm"


def helm_run(helm: Path, *args: str) -> str:
    done = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def render(helm: Path, *args: str) -> list[dict[str, Any]]:
    text = helm_run(
        helm, "template", "rdmaplane", str(CHART), "-n", "rdmaplane", "--include-crds", *args
    )
    return [d for d in yaml.safe_load_all(text) if d]


def kustomize_base(folder: Path = REPO / "deploy") -> list[dict[str, Any]]:
    """`kubectl kustomize FOLDER` for a kustomization that lists resources and nothing else
    (checked here: with patches, generators or transformers this reading would be wrong)."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert set(kustomization) == {"apiVersion", "kind", "resources"}, "update kustomize_base()"
    return [
        d
        for r in kustomization["resources"]
        for d in yaml.safe_load_all((folder / r).read_text())
        if d
    ]


def normalised(obj: dict[str, Any]) -> dict[str, Any]:
    obj = yaml.safe_load(yaml.safe_dump(obj))
    for meta in (
        obj.get("metadata", {}),
        obj.get("spec", {}).get("template", {}).get("metadata", {}),
    ):
        for key, drop in (("labels", CHART_LABELS), ("annotations", CHART_ANNOTATIONS)):
            kept = {k: v for k, v in (meta.get(key) or {}).items() if k not in drop}
            meta.pop(key, None)
            if kept:
                meta[key] = kept
    if obj.get("kind") == "ConfigMap":
        obj["data"] = {
            k: loaded(k, v) if k in CONFIG_KINDS else yaml.safe_load(v)
            for k, v in obj.get("data", {}).items()
        }
    return obj


def by_identity(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], Any]:
    out = {}
    for o in objects:
        key = (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
        assert key not in out, f"{key} twice"
        out[key] = normalised(o)
    return out


def test_lint_is_clean(helm: Path) -> None:
    helm_run(helm, "lint", "--strict", str(CHART))
    helm_run(helm, "lint", "--strict", str(CHART), "-f", str(CUSTOM))


def test_default_render_is_the_kustomize_base(helm: Path) -> None:
    """Same objects, same content, configs equal as the components load them. The one
    difference by design: Helm makes the Namespace (`--create-namespace`), the base lists it."""
    base = by_identity(kustomize_base())
    chart = by_identity(render(helm))
    namespace = base.pop(("Namespace", "", "rdmaplane"))
    assert sorted(chart) == sorted(base)
    for key in base:
        assert chart[key] == base[key], key
    with_namespace = by_identity(render(helm, "--set", "createNamespace=true"))
    assert with_namespace[("Namespace", "", "rdmaplane")] == namespace  # its Pod Security labels


def images_of(objects: list[dict[str, Any]]) -> set[str]:
    """Every container's image, and the webhook's doctor init container's (its config's)."""
    found = set()
    for obj in objects:
        spec = obj.get("spec", {})
        pod = spec.get("jobTemplate", {}).get("spec", spec).get("template", {}).get("spec", {})
        for container in (*pod.get("initContainers", []), *pod.get("containers", [])):
            found.add(container["image"])
        if obj["kind"] == "ConfigMap" and "webhook.yaml" in obj.get("data", {}):
            found.add(loaded("webhook.yaml", obj["data"]["webhook.yaml"]).doctor.image)  # type: ignore[attr-defined]
    return found


def test_every_component_runs_the_one_image(helm: Path) -> None:
    """The manifests, the doctor example, the chart and the webhook's doctor init container
    name rdmaplane.IMAGE (what `make image` and the Dockerfile build); the chart's `image` moves
    them all, the doctor's too."""
    deploy = REPO / "deploy"
    sets = {
        "deploy/": kustomize_base(),
        "deploy/dra/": kustomize_base(deploy / "dra"),
        "deploy/device-plugin/": objects_of(deploy / "device-plugin" / "daemonset.yaml"),
        "deploy/doctor/": objects_of(deploy / "doctor" / "example-3-nodes.yaml"),
        "the chart": render(helm),
    }
    for name, objects in sets.items():
        assert images_of(objects) == {IMAGE}, name
    mirrored = render(helm, "--set", "image.repository=mirror.example/rdmaplane",
                      "--set", "image.tag=9.9")  # fmt: skip
    assert images_of(mirrored) == {"mirror.example/rdmaplane:9.9"}
    own = render(helm, "--set", "webhook.config.doctor.image=mirror.example/doctor:1")
    assert images_of(own) == {IMAGE, "mirror.example/doctor:1"}


def objects_of(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_scheduler_config_snippet_is_the_shipped_file(helm: Path) -> None:
    objects = render(helm, "--set", "schedulerConfig.configMap=true")
    (cm,) = [o for o in objects if o["metadata"]["name"] == "rdmaplane-kube-scheduler-config"]
    shipped = yaml.safe_load((REPO / "deploy/scheduler/kube-scheduler-config.yaml").read_text())
    assert yaml.safe_load(cm["data"]["kube-scheduler-config.yaml"]) == shipped


def test_values_reach_the_components(helm: Path) -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(helm, "-f", str(CUSTOM))}
    agent_cm = objects["ConfigMap", "rdmaplane-agent"]["data"]
    agent = loaded("agent.yaml", agent_cm["agent.yaml"])
    assert (agent.fault.action, agent.fault.max_evictions_per_minute) == ("notify", 1)
    assert agent.fabric.tier_labels == (
        "network.topology.example/leaf",
        "network.topology.example/spine",
    )
    plugin = loaded("device-plugin.yaml", agent_cm["device-plugin.yaml"])
    gids = [p.nccl.gid_policy for p in plugin.pools]
    assert (gids[0].cidr, gids[1].family) == ("10.20.0.0/16", 6)
    extender_ns = objects["Deployment", "rdmaplane-scheduler-extender"]["metadata"]["namespace"]
    assert extender_ns == "rdmaplane-scheduling"
    extender = loaded(
        "config.yaml", objects["ConfigMap", "rdmaplane-scheduler-extender"]["data"]["config.yaml"]
    )
    assert extender.fabric.tier_labels == (
        ("network.topology.example/leaf", "network.topology.example/spine"),
    )
    hook = loaded("webhook.yaml", objects["ConfigMap", "rdmaplane-webhook"]["data"]["webhook.yaml"])
    assert hook.mode == "shared" and hook.hca == "rdma.example/hca"
    mwc = objects["MutatingWebhookConfiguration", "rdmaplane-webhook"]
    assert {w["failurePolicy"] for w in mwc["webhooks"]} == {"Ignore"}
    daemonset = objects["DaemonSet", "rdmaplane-agent"]["spec"]["template"]["spec"]
    assert daemonset["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        OWN_TOLERATION,  # kept whatever agent.tolerations says
    ]
    assert daemonset["containers"][0]["image"] == "registry.example/rdmaplane:0.1.0-rc1"


def test_cert_manager_mode(helm: Path) -> None:
    auto = {
        (o["kind"], o["metadata"]["name"]): o
        for o in render(
            helm,
            "--set",
            "webhook.certManager.enabled=auto",
            "--api-versions",
            "cert-manager.io/v1",
        )
    }
    assert ("Certificate", "rdmaplane-webhook") in auto and (
        "Role",
        "rdmaplane-webhook",
    ) not in auto
    annotations = auto["MutatingWebhookConfiguration", "rdmaplane-webhook"]["metadata"][
        "annotations"
    ]
    assert annotations == {"cert-manager.io/inject-ca-from": "rdmaplane/rdmaplane-webhook"}
    hook = loaded("webhook.yaml", auto["ConfigMap", "rdmaplane-webhook"]["data"]["webhook.yaml"])
    assert hook.tls.from_files  # type: ignore[attr-defined]
    without = {
        (o["kind"], o["metadata"]["name"])
        for o in render(helm, "--set", "webhook.certManager.enabled=auto")
    }
    assert ("Certificate", "rdmaplane-webhook") not in without and (
        "Role",
        "rdmaplane-webhook",
    ) in without


def _install_crds(client: Client, objects: list[Any]) -> None:
    for crd in objects:
        client.apply(crd, field_manager="rdmaplane-e2e", force=True)

    def established() -> bool:
        for crd in objects:
            status = client.get(CustomResourceDefinition, crd.metadata.name).status
            if not any(
                c.type == "Established" and c.status == "True"
                for c in (status.conditions or [])
                if status
            ):
                return False
        return True

    poll_until(established, 30, "CRDs Established")


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("-f", str(CUSTOM)),
        ("--set", "webhook.certManager.enabled=true", "--set", "schedulerConfig.configMap=true"),
        EVERYTHING,
        (
            "--set",
            "webhook.certManager.enabled=true",
            "--set-json",
            'webhook.certManager.issuerRef={"name":"corp-ca","kind":"ClusterIssuer","group":"cert-manager.io"}',
        ),
    ],
    ids=["default", "custom-values", "cert-manager", "everything", "cert-manager-own-issuer"],
)
def test_render_passes_a_server_side_dry_run(
    helm: Path, kube_cluster: KubeCluster, args: tuple[str, ...]
) -> None:
    objects = list(codecs.load_all_yaml(yaml.safe_dump_all(render(helm, *args))))
    with kube_cluster.client() as client:
        _install_crds(client, [o for o in objects if o.kind == "CustomResourceDefinition"])
        for fixture in (CERT_MANAGER_CRDS, PROMETHEUS_CRDS):
            _install_crds(client, list(codecs.load_all_yaml(fixture.read_text())))
        namespaces = {o.metadata.namespace for o in objects if o.metadata.namespace} | {"rdmaplane"}
        for name in namespaces:
            client.apply(
                codecs.from_dict(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
                ),
                field_manager="rdmaplane-e2e",
                force=True,
            )
        for obj in objects:
            if obj.kind in ("CustomResourceDefinition", "Namespace"):
                continue
            client.apply(obj, field_manager="rdmaplane-e2e", force=True, dry_run=True)


def helm_refuses(helm: Path, *args: str) -> str:
    """What `helm lint --strict` and `helm template` say when both refuse the values."""
    out = []
    for command in (["lint", "--strict", str(CHART)], ["template", "r", str(CHART)]):
        done = subprocess.run(
            [str(helm), *command, *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode != 0, f"helm {' '.join(command)} {' '.join(args)} accepted them"
        out.append(done.stdout + done.stderr)
    return "\n".join(out)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--set", "webhook.failurePolicy=Sometimes"), "/webhook/failurePolicy"),
        (("--set", "webhook.timeoutSeconds=60"), "/webhook/timeoutSeconds"),
        (("--set", "webhook.port=99999"), "/webhook/port"),
        (("--set", "agent.metricsPort=0"), "/agent/metricsPort"),
        (("--set", "fault.action=nuke"), "/fault/action"),
        (("--set", "fault.graceSeconds=soon"), "/fault/graceSeconds"),
        (("--set", "agent.tolerationz[0].operator=Exists"), "'tolerationz' not allowed"),
        (("--set", "webhok.replicas=2"), "'webhok' not allowed"),
        (("--set", "extender.replicas=0"), "/extender/replicas"),
        (("--set", "extender.namespace=Kube_System"), "/extender/namespace"),
        (("--set", "webhook.certManager.enabled=maybe"), "/webhook/certManager/enabled"),
        (("--set", "agent.tolerations[0].effect=NoWay"), "/agent/tolerations/0/effect"),
    ],
    ids=lambda a: a[1] if isinstance(a, tuple) else None,
)
def test_the_schema_refuses_bad_values(helm: Path, args: tuple[str, ...], said: str) -> None:
    assert said in helm_refuses(helm, *args)


def _agent(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [
        o
        for o in objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "rdmaplane-agent"
    ]
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize(
    ("tolerations", "rendered"),
    [
        ([{"operator": "Exists"}], [{"operator": "Exists"}]),  # the default: every taint
        ([], [OWN_TOLERATION]),
        ([OWN_TOLERATION], [OWN_TOLERATION]),
        (
            [{"key": "rdmaplane.io/rdma-unhealthy", "operator": "Exists", "effect": "NoExecute"}],
            [
                {"key": "rdmaplane.io/rdma-unhealthy", "operator": "Exists", "effect": "NoExecute"},
                OWN_TOLERATION,  # the degraded taint is NoSchedule: NoExecute alone is not enough
            ],
        ),
        (
            [{"key": "a", "operator": "Exists"}],
            [{"key": "a", "operator": "Exists"}, OWN_TOLERATION],
        ),
    ],
)
def test_the_agent_always_tolerates_its_own_taint(
    helm: Path, tolerations: list[dict[str, str]], rendered: list[dict[str, str]]
) -> None:
    objects = render(helm, "--set-json", f"agent.tolerations={json.dumps(tolerations)}")
    assert _agent(objects).get("tolerations", []) == rendered


def test_optional_parts_render_as_said(helm: Path) -> None:
    objects = render(helm, *EVERYTHING, "-f", str(CUSTOM))
    by_key = {
        (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", "")): o for o in objects
    }
    agent = _agent(objects)
    container = agent["containers"][0]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    configs = by_key["ConfigMap", "rdmaplane-agent", "rdmaplane"]["data"]
    assert loaded("agent.yaml", configs["agent.yaml"]).fix_netns_mode  # type: ignore[attr-defined]
    plugin = loaded("device-plugin.yaml", configs["device-plugin.yaml"])
    assert str(plugin.cdi.spec_dir) == "/var/run/cdi" and plugin.cdi.enabled  # type: ignore[attr-defined]
    assert {"name": "cdi", "mountPath": "/var/run/cdi"} in container["volumeMounts"]
    ns = "rdmaplane-scheduling"
    extender = by_key["Deployment", "rdmaplane-scheduler-extender", ns]["spec"]["template"]["spec"]
    args = extender["containers"][0]["args"]
    assert "--tls-cert-file=/etc/rdmaplane/tls/tls.crt" in args and "--debug-remote" in args
    assert extender["containers"][0]["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    scheduler = yaml.safe_load(
        by_key["ConfigMap", "rdmaplane-kube-scheduler-config", ns]["data"][
            "kube-scheduler-config.yaml"
        ]
    )["extenders"][0]
    assert scheduler["urlPrefix"] == f"https://rdmaplane-scheduler-extender.{ns}.svc:9999"
    assert scheduler["enableHTTPS"] and scheduler["tlsConfig"] == {
        "caFile": "/etc/kubernetes/pki/ca.crt"
    }
    assert ("NetworkPolicy", "rdmaplane-scheduler-extender", ns) in by_key
    monitors = {(k[1], k[2]) for k in by_key if k[0] == "PodMonitor"}
    assert monitors == {
        ("rdmaplane-agent", "rdmaplane"),
        ("rdmaplane-scheduler-extender", ns),
        ("rdmaplane-webhook", "rdmaplane"),
    }
    quotas = {k[2] for k in by_key if k[0] == "ResourceQuota"}
    assert quotas == {"rdmaplane", ns}  # the extender's own namespace too, as it is not kube-system
