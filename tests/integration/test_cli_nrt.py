"""`rdmaplane nrt`: what the agent publishes, and what explain-placement can read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rdmaplane.adapters.discovery import samples
from rdmaplane.cli import app
from rdmaplane.core import nrt
from rdmaplane.core.settings.agent import AgentSettings
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.services.agent.deviceplugin import EmbeddedPlugin
from rdmaplane.services.agent.root import Agent
from tests import resource_names as names
from tests.integration.kubelet_standin import device_nodes
from tests.scheduler_helpers import pod

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.parametrize("name", samples.names())
async def test_the_nrt_is_the_one_the_agent_publishes(
    name: str, sample_trees: dict[str, Path], tmp_path: Path
) -> None:
    """The agent itself, after its first discovery of the same tree (no pod, no API server),
    against the command; single-numa-node/pod to see the flags reach the object."""
    tree = sample_trees[name]
    config = AgentSettings(
        node_name="n1",
        sysfs_root=tree,
        kubelet_dir=tmp_path,
        topology_manager_policy="single-numa-node",
        topology_manager_scope="pod",
        metrics_port=0,
    )
    dev = device_nodes(tree, tmp_path / "dev")  # as on its node: the command assumes so too
    plugin = EmbeddedPlugin(PluginSettings(), kubelet_dir=tmp_path, dev_root=dev)
    agent = Agent(config, plugin=plugin)
    await agent.discover("start")
    published = agent.desired().nrt
    code, out, err = run(
        "nrt",
        "--sysfs-root",
        str(tree),
        "--node-name",
        "n1",
        "--topology-manager-policy",
        "single-numa-node",
        "--topology-manager-scope",
        "pod",
        "-o",
        "json",
    )
    assert code == 0, err
    assert json.loads(out) == published
    assert nrt.from_object(published).name == "n1"


def test_a_down_port_is_capacity_but_not_allocatable() -> None:
    code, out, _ = run("nrt", "--sample", "degraded", "-o", "json")
    numa = nrt.from_object(json.loads(out)).numa_zones()
    hcas = [r for z in numa for r in z.resources if r.name == nrt.HCA]
    assert code == 0 and sum(r.capacity for r in hcas) == sum(r.allocatable for r in hcas) + 1


def test_hcas_without_device_nodes_are_not_allocatable(tmp_path: Path) -> None:
    """--dev-root: the plugin's own check (no /dev/infiniband/uverbsN: Unhealthy) shows."""
    code, out, _ = run(
        "nrt", "--sample", "hgx-h100-roce", "--dev-root", str(tmp_path), "-o", "json"
    )
    numa = nrt.from_object(json.loads(out)).numa_zones()
    hcas = [r for z in numa for r in z.resources if r.name == nrt.HCA]
    assert code == 0 and sum(r.capacity for r in hcas) > 0
    assert sum(r.allocatable for r in hcas) == 0


def test_explain_placement_reads_what_nrt_writes(tmp_path: Path) -> None:
    topology = tmp_path / "hgx.yaml"
    # policy `none` promises no alignment, so the node says which policy its kubelet runs
    code, out, _ = run(
        "nrt", "--sample", "hgx-h100-roce", "--topology-manager-policy", "best-effort"
    )
    assert code == 0 and yaml.safe_load(out)["metadata"]["name"] == "hgx-h100-017"
    topology.write_text(out)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(pod("job", 2, 2)))
    r = runner.invoke(app, ["explain-placement", str(job), "--nrt", str(topology), "-o", "json"])
    rows = json.loads(r.stdout)["nodes"]
    assert r.exit_code == 0 and rows[0]["node"] == "hgx-h100-017"
    assert rows[0]["fits"] and rows[0]["alignment"] == "pcie"


def test_bad_inputs(tmp_path: Path) -> None:
    nameless = tmp_path / "sys"
    samples.build({**samples.load("workstation").spec, "hostname": None}, nameless)
    assert run("nrt", "--sysfs-root", str(nameless)) == (
        2,
        "",
        "error: --node-name: required (the node does not say its hostname)\n",
    )
    assert run("nrt", "--sysfs-root", str(nameless), "--node-name", "ws")[0] == 0
    bad = tmp_path / "plugin.yaml"
    bad.write_text(
        "apiVersion: rdmaplane.io/v1alpha1\nkind: DevicePluginConfig\npools: [{mode: sideways}]\n"
    )
    code, _, err = run("nrt", "--sample", "workstation", "--device-plugin-config", str(bad))
    assert code == 2 and err.startswith(f"error: {bad}: ") and "mode" in err
    code, _, err = run("nrt", "--sample", "workstation", "--topology-manager-policy", "best")
    assert code == 2 and "--topology-manager-policy" in err


def test_a_software_rdma_device_is_no_numa_local_hca(tmp_path: Path) -> None:
    """The workstation's rxe0 (soft-RoCE on the onboard NIC, no PCI function) is not offered:
    only mlx5_0, on socket 1, counts, and a GPU of socket 0 has no NUMA pair for its HCA."""
    result = runner.invoke(app, ["nrt", "--sample", "workstation"])
    assert result.exit_code == 0, result.output
    obj = yaml.safe_load(result.stdout)
    hcas = {
        z["name"]: int(r["capacity"])
        for z in obj["zones"]
        if z["type"] == "Node"
        for r in z.get("resources", [])
        if r["name"] == "rdmaplane.io/hca"
    }
    assert hcas == {"node-1": 1}
    nrt_file = tmp_path / "nrt.yaml"
    nrt_file.write_text(result.stdout)
    pod = tmp_path / "pod.yaml"
    pod.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: a\n"
        "    resources: {limits: {nvidia.com/gpu: 1, rdmaplane.io/hca: 1}}\n"
    )
    explained = runner.invoke(
        app, ["explain-placement", str(pod), "--nrt", str(nrt_file), "-o", "json"]
    )
    (row,) = json.loads(explained.stdout)["nodes"]
    assert "0/1 NUMA pairs" in row["detail"]


def test_renamed_pools_and_another_gpu_vendor_are_published(tmp_path: Path) -> None:
    """A renamed exclusive pool, the network operator's shared pool and another GPU vendor
    are counted as the default names are, and the NRT says which resource is which."""
    default = run(
        "nrt", "--sample", "hgx-h200-ib",
        "--device-plugin-config", str(names.plugin_config(tmp_path / "default.yaml")),
        "-o", "json",
    )  # fmt: skip
    renamed = run(
        "nrt", "--sample", "hgx-h200-ib",
        "--device-plugin-config", str(names.plugin_config(tmp_path / "renamed.yaml", names.NAMES)),
        "--gpu-resource", names.GPU,
        "-o", "json",
    )  # fmt: skip
    assert default[0] == renamed[0] == 0, renamed[2]
    obj = json.loads(renamed[1])
    published = nrt.from_object(obj)
    assert published.attribute(nrt.ATTR_RESOURCES) == (
        "amd.com/gpu=gpu,example.com/ib=exclusive,rdma/hca_shared_devices_a=shared"
    )
    assert published.vocabulary(names.VOCABULARY) == names.VOCABULARY
    assert [r.name for r in published.numa_zones()[0].resources] == [
        names.GPU, names.HCA, names.SHARED
    ]  # fmt: skip
    assert names.without_vocabulary(obj) == names.renamed(json.loads(default[1]))


def test_the_shared_rdma_plugins_pool_is_published(tmp_path: Path) -> None:
    """The shared RDMA device plugin's own file (the network operator's): its pool
    `rdma/hca_shared_devices_a` is in every NUMA zone its HCAs are in, slots as configured."""
    legacy = tmp_path / "config.json"
    legacy.write_text(
        json.dumps(
            {"configList": [{"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 63,
                             "selectors": {"vendors": ["15b3"]}}]}
        )
    )  # fmt: skip
    code, out, err = run(
        "nrt", "--sample", "hgx-h200-ib", "--device-plugin-config", str(legacy), "-o", "json"
    )
    assert code == 0, err
    published = nrt.from_object(json.loads(out))
    assert [z.available(names.SHARED) for z in published.numa_zones()] == [63, 63]
    assert published.vocabulary().shared == (names.SHARED, nrt.HCA_SHARED)  # its own first
    assert sum(z.shared_hcas for z in published.zones) > 0
