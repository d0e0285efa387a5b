"""The smaller things a new user meets in the first hour (issue 40, point 6), each as the user
meets it."""

from __future__ import annotations

import tarfile
from pathlib import Path

import yaml
from typer.testing import CliRunner

from rdmaplane.adapters.discovery import samples
from rdmaplane.cli import app
from tests.workload_manifests import manifest

runner = CliRunner()


def _nrt(tmp_path: Path, sample: str) -> Path:
    path = tmp_path / f"{sample}.yaml"
    result = runner.invoke(app, ["nrt", "--sample", sample])
    assert result.exit_code == 0, result.output
    path.write_text(result.stdout)
    return path


def test_a_tar_gz_that_is_no_snapshot_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello\n")
    archive = tmp_path / "logs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "notes.txt", arcname="notes.txt")
    result = runner.invoke(app, ["inspect", "--snapshot", str(archive)])
    assert result.exit_code == 2, result.output
    assert "not a readable snapshot" in result.stderr
    assert "node " not in result.stdout  # no made-up node header


def test_snapshot_create_takes_the_three_sources(tmp_path: Path) -> None:
    first, second = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    result = runner.invoke(app, ["snapshot", "create", "-o", str(first), "--sample", "dgx-a100"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        app, ["snapshot", "create", "-o", str(second), "--snapshot", str(first), "--redact"]
    )
    assert result.exit_code == 0, result.output
    shown = runner.invoke(app, ["inspect", "--snapshot", str(second), "-o", "json"])
    assert shown.exit_code == 0, shown.output
    assert len(yaml.safe_load(shown.stdout)["hcas"]) == len(samples.read_sample("dgx-a100").hcas)
    both = runner.invoke(
        app, ["snapshot", "create", "-o", str(second), "--sample", "dgx-a100", "--snapshot", "x"]
    )
    assert both.exit_code == 2 and "only one of" in both.stderr


def test_doctor_root_at_a_sysfs_tree_says_what_root_is(tmp_path: Path) -> None:
    samples.materialise("hgx-h100-roce", tmp_path / "tree")
    result = runner.invoke(app, ["doctor", "--root", str(tmp_path / "tree")])
    assert result.exit_code == 2
    assert "a sysfs tree" in result.stderr and "--root is the root above sys/" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["doctor", "--root", str(empty), "-o", "json"])
    assert f"no RDMA device in {empty}/sys/class/infiniband" in result.stdout


def test_doctor_skips_the_gpu_nic_pairs_it_cannot_see(tmp_path: Path) -> None:
    samples.materialise("hgx-h100-roce", tmp_path / "sys")
    result = runner.invoke(app, ["doctor", "--root", str(tmp_path), "-o", "json"])
    (pairs,) = [f for f in yaml.safe_load(result.stdout)["findings"] if f["name"] == "gpu-nic"]
    assert pairs["status"] == "SKIP", pairs


def test_explain_placement_nrt_before_the_file(tmp_path: Path) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump(manifest("Pod")))
    nrts = [_nrt(tmp_path, "hgx-h100-roce"), _nrt(tmp_path, "dgx-a100")]
    after = runner.invoke(app, ["explain-placement", str(pod), "--nrt", *map(str, nrts)])
    before = runner.invoke(app, ["explain-placement", "--nrt", *map(str, nrts), str(pod)])
    assert before.exit_code == after.exit_code == 0, before.output
    assert before.stdout == after.stdout
    assert "hgx-h100-017" in before.stdout and "dgx-a100" in before.stdout


def test_fabric_show_job_without_pods_says_it_needs_them(tmp_path: Path) -> None:
    nrt = _nrt(tmp_path, "hgx-h100-roce")
    result = runner.invoke(app, ["fabric", "show", "--nrt", str(nrt), "--job", "train"])
    assert result.exit_code == 2
    assert "--job train: give the bound pods with --pods FILE" in result.stderr


def test_config_validate_looks_inside_dra_objects(tmp_path: Path) -> None:
    params = {"apiVersion": "rdmaplane.io/v1alpha1", "kind": "RdmaDeviceConfig"}
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "nics"},
        "spec": {
            "spec": {
                "devices": {
                    "config": [
                        {
                            "opaque": {
                                "driver": "rdma.rdmaplane.io",
                                "parameters": {**params, "nccl": {"trafficClass": 1066}},
                            }
                        }
                    ]
                }
            }
        },
    }
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "rdma.rdmaplane.io"},
        "spec": {"config": [{"opaque": {"driver": "rdma.rdmaplane.io", "parameters": params}}]},
    }
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump_all([template, device_class]))
    result = runner.invoke(app, ["config", "validate", str(path)])
    assert result.exit_code == 2
    assert "ResourceClaimTemplate nics config[0].opaque.parameters: nccl.trafficClass" in (
        result.stderr
    )
    assert "DeviceClass rdma.rdmaplane.io config[0].opaque.parameters: a valid" in result.stdout


def test_gid_audit_warnings_name_their_node(tmp_path: Path) -> None:
    doc = tmp_path / "degraded.json"
    doc.write_text(runner.invoke(app, ["inspect", "--sample", "degraded", "-o", "json"]).stdout)
    result = runner.invoke(app, ["gid", "audit", str(doc), "--sample", "degraded"])
    warnings = [ln for ln in result.stderr.splitlines() if ln.startswith("warning:")]
    assert warnings and all(
        ln.startswith((f"warning: {doc}: ", "warning: sample:degraded: ")) for ln in warnings
    ), warnings


def test_usage_errors_name_types_in_the_users_words() -> None:
    result = runner.invoke(app, ["doctor", "job", "a", "b", "--hcas", "x"])
    assert result.exit_code == 2
    assert "'x' is not a whole number" in result.stderr and "valid int" not in result.stderr
    node = {"schema": None}
    assert "got null" in _node_document_error(node)


def _node_document_error(doc: object) -> str:
    import json
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    result = runner.invoke(app, ["gid", "audit", f.name])
    Path(f.name).unlink()
    assert result.exit_code == 2
    assert "schema is None" not in result.stderr
    return result.stderr


def test_env_on_vfs_with_link_local_gids_names_the_hca_flag() -> None:
    result = runner.invoke(app, ["env", "--sample", "sriov-exclusive"])
    assert result.exit_code == 1
    assert "only link-local GIDs" in result.stderr
    assert "choose the ports with --hca: --hca mlx5_0 --hca mlx5_1" in result.stderr
    chosen = runner.invoke(app, ["env", "--sample", "sriov-exclusive", "--hca", "mlx5_0"])
    assert chosen.exit_code == 0 and "NCCL_IB_GID_INDEX='3'" in chosen.stdout
