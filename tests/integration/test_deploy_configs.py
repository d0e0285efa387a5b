"""The rdmaplane configs that deploy/ ships inside ConfigMaps load with rdmaplane's own loaders,
as the containers will load them; the kustomization names the default install."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from rdmaplane.agent import config as agent_config
from rdmaplane.deviceplugin import config as plugin_config
from rdmaplane.scheduler import config as extender_config
from rdmaplane.webhook import config as webhook_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
LOADERS: dict[tuple[str, str], Callable[[Path], object]] = {
    # the DaemonSet sets $NODE_NAME from spec.nodeName
    ("agent/daemonset.yaml", "agent.yaml"): lambda p: agent_config.load(p, node_name="gpu-017"),
    ("agent/daemonset.yaml", "device-plugin.yaml"): plugin_config.load_config,
    ("device-plugin/daemonset.yaml", "config.yaml"): plugin_config.load_config,
    ("scheduler/extender.yaml", "config.yaml"): extender_config.load_config,
    ("webhook/deployment.yaml", "webhook.yaml"): webhook_config.load_config,
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


def test_every_embedded_config_has_a_loader() -> None:
    assert set(embedded()) == set(LOADERS)


@pytest.mark.parametrize("where", sorted(LOADERS), ids=lambda w: f"{w[0]}:{w[1]}")
def test_embedded_config_loads(where: tuple[str, str], tmp_path: Path) -> None:
    path = tmp_path / where[1]
    path.write_text(embedded()[where])
    LOADERS[where](path)  # raises ConfigError naming the key on anything wrong


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
