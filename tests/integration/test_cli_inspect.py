"""`rdmaplane inspect`, `samples` and `snapshot create` through the real CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import typer
import yaml
from typer.testing import CliRunner

from rdmaplane.cli import app
from rdmaplane.cli.inspect import dot_text, matrix_text
from rdmaplane.model import NodeTopology

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_json_is_the_v1_document(sample_trees: dict[str, Path]) -> None:
    code, out, _ = run("inspect", "--sysfs-root", str(sample_trees["dgx-a100"]), "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == "rdmaplane.io/node-topology/v1"
    assert len(doc["numa_nodes"]) == 8 and doc["relations"]["GPU0"]["mlx5_0"] == "PXB"


def test_yaml_matches_json() -> None:
    code_j, out_j, _ = run("inspect", "--sample", "workstation", "-o", "json")
    code_y, out_y, _ = run("inspect", "--sample", "workstation", "-o", "yaml")
    assert code_j == code_y == 0
    j, y = json.loads(out_j), yaml.safe_load(out_y)
    j.pop("source"), y.pop("source")  # each run materialises its own temporary tree
    assert j == y


def test_table_summary() -> None:
    code, out, _ = run("inspect", "--sample", "hgx-h100-roce")
    assert code == 0
    assert "8 GPUs" in out and "mlx5_bond_0" in out and "mlx5_0 (PIX)" in out


def test_the_rdma_netns_mode_is_shown(sample_trees: dict[str, Path]) -> None:
    code, out, _ = run("inspect", "--sample", "sriov-exclusive")
    assert code == 0 and "RDMA netns: exclusive" in out.splitlines()[0]
    code, out, _ = run("inspect", "--sysfs-root", str(sample_trees["dgx-a100"]), "-o", "json")
    assert json.loads(out)["netns_mode"] == "shared"


def test_matrix_looks_like_nvidia_smi(sample_nodes: dict[str, NodeTopology]) -> None:
    text = matrix_text(sample_nodes["hgx-h100-roce"])
    lines = text.splitlines()
    header = lines[0].split()
    assert header[:9] == ["GPU0", "GPU1", "GPU2", "GPU3", "GPU4", "GPU5", "GPU6", "GPU7", "NIC0"]
    assert header[-4:] == ["CPU", "Affinity", "NUMA", "Affinity"]
    gpu0 = lines[1].split()
    assert gpu0[0] == "GPU0" and gpu0[1] == "X" and gpu0[9] == "PIX"  # NIC0 = mlx5_0
    assert gpu0[-2:] == ["0-55,112-167", "0"]
    assert "  NIC8: mlx5_bond_0" in lines and "NIC Legend:" in lines


def test_dot_is_a_well_formed_graph(sample_nodes: dict[str, NodeTopology]) -> None:
    text = dot_text(sample_nodes["dgx-a100"])
    assert text.startswith("digraph") and text.count("{") == text.count("}")
    declared = set(re.findall(r'^\s*"([^"]+)" \[', text, re.M))
    for a, b in re.findall(r'"([^"]+)" -> "([^"]+)"', text):
        assert a in declared | {m for m in re.findall(r'"(pci[0-9a-f:]+)"', text)}
        assert b in declared
    assert text.count("cluster_numa") == 5  # GPUs and NICs sit on NUMA nodes 1, 2, 3, 5, 7
    assert '"GPU0" -> "mlx5_0" [style=dashed' in text


def test_no_rdma_here_says_so_and_points_to_samples(tmp_path: Path, monkeypatch) -> None:
    import rdmaplane.cli.inspect as mod

    real = mod.load
    monkeypatch.setattr(mod, "load", lambda *a: real(str(tmp_path), None, None))
    code, _, err = run("inspect")
    assert code == 1
    assert "no RDMA device found" in err and "--sample" in err


def test_bad_sources_are_usage_errors(tmp_path: Path) -> None:
    code, _, err = run("inspect", "--sample", "nope")
    assert code == 2 and "no sample named 'nope'" in err
    code, _, err = run("inspect", "--sample", "degraded", "--sysfs-root", str(tmp_path))
    assert code == 2 and "only one" in err
    code, _, err = run("inspect", "--snapshot", str(tmp_path / "x.tgz"))
    assert code == 2 and "does not exist" in err


def test_samples_listing() -> None:
    code, out, _ = run("samples", "-o", "json")
    names = [s["name"] for s in json.loads(out)]
    assert code == 0 and len(names) >= 5 and "hgx-h100-roce" in names


def test_snapshot_create_then_inspect(sample_trees: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "n.tar.gz"
    code, text, _ = run(
        "snapshot",
        "create",
        "-o",
        str(out),
        "--sysfs-root",
        str(sample_trees["degraded"]),
        "--redact",
    )
    assert code == 0 and "(redacted)" in text
    code, text, _ = run("inspect", "--snapshot", str(out), "-o", "json")
    assert code == 0 and json.loads(text)["hostname"] == "redacted-node"


def _command_paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [path]
    for name, sub in getattr(command, "commands", {}).items():  # a group
        paths += _command_paths(sub, (*path, name))
    return paths


def test_every_help_page_renders_cleanly() -> None:
    """Every command's --help works and shows flags without type noise (typer 0.29 printed
    `<bool>` beside each flag)."""
    paths = _command_paths(typer.main.get_command(app))
    assert ("doctor", "perf") in paths and ("agent",) in paths
    for path in paths:
        code, out, _ = run(*path, "--help")
        assert code == 0 and "Usage:" in out, path
        assert "<bool>" not in out, path
