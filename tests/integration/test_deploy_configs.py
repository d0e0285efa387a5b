"""The rdmaplane configs that deploy/ ships, inside ConfigMaps or as files, load with rdmaplane's
own loader, as the containers will load them; the kustomization names the default install."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rdmaplane.config import (
    AgentConfig,
    DevicePluginConfig,
    Kind,
    SchedulerExtenderConfig,
    WebhookConfig,
    load,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
EMBEDDED: dict[tuple[str, str], type[Kind]] = {
    ("agent/daemonset.yaml", "agent.yaml"): AgentConfig,
    ("agent/daemonset.yaml", "device-plugin.yaml"): DevicePluginConfig,
    ("device-plugin/daemonset.yaml", "config.yaml"): DevicePluginConfig,
    ("scheduler/extender.yaml", "config.yaml"): SchedulerExtenderConfig,
    ("webhook/deployment.yaml", "webhook.yaml"): WebhookConfig,
}
FILES: dict[str, type[Kind]] = {
    "device-plugin/config-exclusive.yaml": DevicePluginConfig,
    "device-plugin/config-shared.yaml": DevicePluginConfig,
    "device-plugin/config-from-shared-rdma-plugin.json": DevicePluginConfig,
    "scheduler/extender-config.yaml": SchedulerExtenderConfig,
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
    assert load(path, SchedulerExtenderConfig) == SchedulerExtenderConfig()


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
