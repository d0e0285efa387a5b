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
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
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


def test_claim_templates_keep_the_shapes_the_allocator_answers_without_a_search() -> None:
    """deploy/dra/claim-templates.yaml (tests/dra_allocator judges them with upstream's
    allocator): `gpu-nic-pcie-x<N>` holds N interleaved pairs of a GPU and a NIC request, a
    pcieRoot constraint each, N at most 2; every other template asks each class once (a count or
    All), or pins each NIC it pairs by a selector; the NICs taken by count or All are the
    compute NICs, by one selector."""
    docs = list(yaml.safe_load_all((DEPLOY / "dra" / "claim-templates.yaml").read_text()))
    names = [d["metadata"]["name"] for d in docs]
    assert names == [
        "gpu-nic-pcie-x1",
        "gpu-nic-pcie-x2",
        "gpu-nic-numa-x4",
        "gpu-nic-node-x8",
        "gpu-nic-node",
        "gpu-nic-rails-x4",
    ]
    compute = set()
    for doc in docs:
        name = doc["metadata"]["name"]
        devices = doc["spec"]["spec"]["devices"]
        requests = devices["requests"]
        if name.startswith("gpu-nic-pcie-x"):
            size = int(name.rsplit("-x", 1)[1])
            assert size <= 2, name
            assert [(r["name"], r["exactly"]) for r in requests] == [
                pair
                for k in range(size)
                for pair in (
                    (f"gpu-{k}", {"deviceClassName": "gpu.nvidia.com"}),
                    (f"nic-{k}", {"deviceClassName": "rdma.rdmaplane.io"}),
                )
            ], name
            assert devices["constraints"] == [
                {"requests": [f"gpu-{k}", f"nic-{k}"], "matchAttribute": PCIE_ROOT}
                for k in range(size)
            ], name
            continue
        whole = [r["exactly"] for r in requests if "exactly" in r]
        if len(whole) == len(requests) == 2:  # one request per class
            assert {r["deviceClassName"] for r in whole} == {"gpu.nvidia.com", "rdma.rdmaplane.io"}
            for r in whole:
                assert r.get("allocationMode") == "All" or r["count"] > 1, name
                if r["deviceClassName"] == "rdma.rdmaplane.io":
                    ((selector,),) = [r["selectors"]]
                    compute.add(selector["cel"]["expression"])
            assert len(devices.get("constraints", [])) <= 1, name
        else:  # pairs whose NICs are each pinned by a selector (rails), in every alternative
            for r in requests:
                if "exactly" in r:
                    assert r["exactly"] == {"deviceClassName": "gpu.nvidia.com"}, name
                else:
                    assert all(sub["selectors"] for sub in r["firstAvailable"]), name
    assert len(compute) == 1, compute


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
