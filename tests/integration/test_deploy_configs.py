"""The rdmaplane configs that deploy/ ships, inside ConfigMaps or as files, load with rdmaplane's
own loader, as the containers will load them; the kustomization names the default install."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from rdmaplane.adapters.config import Kind, load
from rdmaplane.adapters.config.agent import AGENT_CONFIG
from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG
from rdmaplane.adapters.config.extender import SCHEDULER_EXTENDER_CONFIG
from rdmaplane.adapters.config.webhook import WEBHOOK_CONFIG
from rdmaplane.core.settings.scheduler import ExtenderSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
EMBEDDED: dict[tuple[str, str], Kind[Any]] = {
    ("agent/daemonset.yaml", "agent.yaml"): AGENT_CONFIG,
    ("agent/daemonset.yaml", "device-plugin.yaml"): DEVICE_PLUGIN_CONFIG,
    ("device-plugin/daemonset.yaml", "config.yaml"): DEVICE_PLUGIN_CONFIG,
    ("dra/daemonset.yaml", "agent.yaml"): AGENT_CONFIG,
    ("dra/daemonset.yaml", "device-plugin.yaml"): DEVICE_PLUGIN_CONFIG,
    ("scheduler/extender.yaml", "config.yaml"): SCHEDULER_EXTENDER_CONFIG,
    ("webhook/deployment.yaml", "webhook.yaml"): WEBHOOK_CONFIG,
}
FILES: dict[str, Kind[Any]] = {
    "device-plugin/config-exclusive.yaml": DEVICE_PLUGIN_CONFIG,
    "device-plugin/config-shared.yaml": DEVICE_PLUGIN_CONFIG,
    "device-plugin/config-from-shared-rdma-plugin.json": DEVICE_PLUGIN_CONFIG,
    "scheduler/extender-config.yaml": SCHEDULER_EXTENDER_CONFIG,
}


def embedded() -> dict[tuple[str, str], str]:
    """(file, key) → text of every ConfigMap entry under deploy/."""
    out = {}
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if "helm" in path.relative_to(DEPLOY).parts:  # templates: tests/e2e/test_helm_chart.py
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
                for key, text in (doc.get("data") or {}).items():
                    out[(str(path.relative_to(DEPLOY)), key)] = text
    return out


def test_every_embedded_config_has_a_kind() -> None:
    assert set(embedded()) == set(EMBEDDED)


def test_every_config_file_is_listed() -> None:
    found = {
        str(p.relative_to(DEPLOY))
        for p in DEPLOY.rglob("*")
        if p.is_file()
        and ("config" in p.name and "kube-scheduler" not in p.name)
        and "helm" not in p.relative_to(DEPLOY).parts  # the chart: tests/e2e/test_helm_chart.py
    }
    assert found == set(FILES)


@pytest.mark.parametrize("where", sorted(EMBEDDED), ids=lambda w: f"{w[0]}:{w[1]}")
def test_embedded_config_loads(where: tuple[str, str], tmp_path: Path) -> None:
    path = tmp_path / where[1]
    path.write_text(embedded()[where])
    load(path, EMBEDDED[where])  # raises ConfigError naming the key on anything wrong


@pytest.mark.parametrize("name", sorted(FILES))
def test_config_file_loads(name: str) -> None:
    load(DEPLOY / name, FILES[name])


def test_the_extender_example_is_the_defaults() -> None:
    """It says so in its first line."""
    path = DEPLOY / "scheduler" / "extender-config.yaml"
    assert load(path, SCHEDULER_EXTENDER_CONFIG) == ExtenderSettings()


def test_kustomization_is_the_default_install() -> None:
    """The agent (plugin embedded), never the standalone plugin beside it: both would register
    rdmaplane.io/hca with the kubelet."""
    doc = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    resources = doc["resources"]
    assert all((DEPLOY / r).is_file() for r in resources), resources
    assert "agent/daemonset.yaml" in resources and "crds/noderesourcetopology.yaml" in resources
    assert not any(r.startswith("device-plugin/") for r in resources)
    kinds = {d["kind"] for r in resources for d in yaml.safe_load_all((DEPLOY / r).read_text())}
    assert {"DaemonSet", "Deployment", "CustomResourceDefinition", "ClusterRole"} <= kinds


def test_dra_kustomization_installs_the_driver_and_not_the_plugin() -> None:
    """Every file it names exists; the DRA DaemonSet and never the agent's (it would offer the
    same HCAs through the device plugin); the two DaemonSets keep off each other's nodes."""
    doc = yaml.safe_load((DEPLOY / "dra" / "kustomization.yaml").read_text())
    resources = [str((DEPLOY / "dra" / r).resolve().relative_to(DEPLOY)) for r in doc["resources"]]
    assert all((DEPLOY / r).is_file() for r in resources), resources
    assert "dra/daemonset.yaml" in resources and "agent/daemonset.yaml" not in resources
    ids = [
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
        for r in resources
        for d in yaml.safe_load_all((DEPLOY / r).read_text())
    ]
    assert len(ids) == len(set(ids)), "kustomize refuses an object defined twice"
    dra, agent = (_pod_spec(f"{d}/daemonset.yaml") for d in ("dra", "agent"))
    assert dra["nodeSelector"]["rdmaplane.io/kubelet-plugin"] == "dra"
    terms = agent["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (expression,) = terms["nodeSelectorTerms"][0]["matchExpressions"]
    assert expression == {
        "key": "rdmaplane.io/kubelet-plugin",
        "operator": "NotIn",
        "values": ["dra"],
    }


def _pod_spec(path: str) -> dict[str, Any]:
    docs = yaml.safe_load_all((DEPLOY / path).read_text())
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    return cast(dict[str, Any], daemonset["spec"]["template"]["spec"])


def test_every_claim_template_pairs_gpu_k_with_nic_k() -> None:
    """deploy/dra/claim-templates.yaml: x<N> templates hold N GPU and N NIC requests of the two
    DeviceClasses and one constraint per pair (one constraint over all of them would ask for a
    single root), by the attribute their name says."""
    docs = list(yaml.safe_load_all((DEPLOY / "dra" / "claim-templates.yaml").read_text()))
    assert {d["metadata"]["name"] for d in docs} >= {"gpu-nic-pcie-x4", "gpu-nic-numa-x4"}
    for doc in docs:
        name = doc["metadata"]["name"]
        kind, size = name.split("-")[2], int(name.rsplit("-x", 1)[1])
        devices = doc["spec"]["spec"]["devices"]
        classes = {r["name"]: r["exactly"]["deviceClassName"] for r in devices["requests"]}
        assert classes == {
            **{f"gpu-{k}": "gpu.nvidia.com" for k in range(size)},
            **{f"nic-{k}": "rdma.rdmaplane.io" for k in range(size)},
        }, name
        attribute = {"pcie": "pcieRoot", "numa": "numaNode"}[kind]
        assert devices["constraints"] == [
            {
                "requests": [f"gpu-{k}", f"nic-{k}"],
                "matchAttribute": f"resource.kubernetes.io/{attribute}",
            }
            for k in range(size)
        ], name


def test_the_device_plugin_probes_the_socket_its_config_serves(tmp_path: Path) -> None:
    """The standalone DaemonSet's probes name the socket of its config's pool, as the plugin
    names it (rdmaplane.services.deviceplugin.grpc.socket_name)."""
    from rdmaplane.services.deviceplugin.grpc import socket_name

    path = tmp_path / "config.yaml"
    path.write_text(embedded()[("device-plugin/daemonset.yaml", "config.yaml")])
    (pool,) = load(path, DEVICE_PLUGIN_CONFIG).pools
    docs = yaml.safe_load_all((DEPLOY / "device-plugin" / "daemonset.yaml").read_text())
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    socket = f"/var/lib/kubelet/device-plugins/{socket_name(pool.resource_name)}"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == ["test", "-S", socket]
