"""`rdmaplane inspect`, `samples` and `snapshot create` through the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from rdmaplane.adapters.discovery import read_node, samples
from rdmaplane.cli import app
from rdmaplane.cli.inspect import dot_text, matrix_text
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.selectors import natural_key
from rdmaplane.core.topology import device_label
from rdmaplane.core.untrusted import printable

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


def graphviz(text: str, fmt: str) -> str:
    """`text` through Graphviz's own `dot` (the judge of valid DOT), which must not complain."""
    dot = shutil.which("dot")
    if dot is None:
        pytest.fail("Graphviz `dot` is not installed: `make test-fast` installs it")
    done = subprocess.run(
        [dot, f"-T{fmt}"], input=text, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    return done.stdout


def dot_graph(text: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The graph as Graphviz parsed it: its attributes, its nodes by name, its edges (with
    `tail` and `head` as node names)."""
    graph = json.loads(graphviz(text, "json0"))
    objects = graph.get("objects", [])
    by_id = {o["_gvid"]: o for o in objects}
    nodes = {o["name"]: o for o in objects if "nodes" not in o and "subgraphs" not in o}
    edges = [
        {**e, "tail": by_id[e["tail"]]["name"], "head": by_id[e["head"]]["name"]}
        for e in graph.get("edges", [])
    ]
    return graph, nodes, edges


@pytest.mark.parametrize("name", samples.names())
def test_dot_is_a_graph_graphviz_draws(name: str, sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes[name]
    text = dot_text(topo)
    assert "<svg" in graphviz(text, "svg")
    graph, nodes, edges = dot_graph(text)
    assert graph["label"] == topo.hostname
    wired = [h for h in topo.hcas if h.pci is not None]
    for d in [*topo.gpus, *wired]:
        label = nodes[device_label(d)]["label"]
        assert label.split("\\n")[0] == device_label(d)
    for h in wired:
        down = [p for p in h.ports if not p.is_up]
        attrs = nodes[h.name]
        assert (attrs.get("fillcolor") == "mistyrose") == bool(down), h.name
        for p in down:
            assert f"port {p.number} {p.state.name}/{p.phys_state.name}" in attrs["label"]
    root_edges = {(e["tail"], e["head"]) for e in edges if e.get("style") != "dashed"}
    for d in [*topo.gpus, *wired]:
        assert d.pci is not None
        assert ((d.pci.bridges or (d.pci.root,))[-1], device_label(d)) in root_edges


def test_dot_shows_down_ports_and_pairs(sample_nodes: dict[str, NodeTopology]) -> None:
    _, nodes, _ = dot_graph(dot_text(sample_nodes["degraded"]))
    assert nodes["mlx5_3"]["fillcolor"] == "mistyrose"
    assert "port 1 DOWN/DISABLED" in nodes["mlx5_3"]["label"]
    _, _, edges = dot_graph(dot_text(sample_nodes["dgx-a100"]))
    pairs = {(e["tail"], e["head"]): e["label"] for e in edges if e.get("style") == "dashed"}
    assert pairs[("GPU0", "mlx5_0")] == "PXB"


@pytest.mark.parametrize("hostname", ["node", "graph", 'a "quoted" \\ name', "x\x1b[31m", ""])
def test_dot_quotes_every_name(sample_nodes: dict[str, NodeTopology], hostname: str) -> None:
    """DOT keywords, quotes, backslashes and escape sequences in names from a snapshot."""
    topo = sample_nodes["workstation"]
    odd = replace(
        topo,
        hostname=hostname,
        hcas=tuple(replace(h, name=f'{h.name} "q" \\') for h in topo.hcas),
        gpus=tuple(replace(g, name='GPU "x" \\ edge') for g in topo.gpus),
    )
    text = dot_text(odd)
    assert "\x1b" not in text
    graph, nodes, _ = dot_graph(text)
    # attribute values keep DOT's label escapes: `\\` is drawn as one backslash
    assert graph["label"] == (printable(hostname) or "node").replace("\\", "\\\\")
    assert any(n.startswith('mlx5_0 "q"') for n in nodes)


def test_the_documented_dot_recipe(tmp_path: Path) -> None:
    code, out, _ = run("inspect", "--sample", "dgx-a100", "-o", "dot")
    assert code == 0 and "<svg" in graphviz(out, "svg")


def test_no_rdma_here_says_so_and_points_to_samples(tmp_path: Path, monkeypatch) -> None:
    import rdmaplane.cli.inspect as mod

    real = mod.load
    live = lambda *a: replace(real(str(tmp_path), None, None), source="/sys")  # noqa: E731
    monkeypatch.setattr(mod, "load", live)
    code, _, err = run("inspect")
    assert code == 1
    assert "no RDMA device found" in err and "--sample" in err


@pytest.fixture(scope="module")
def rdma_less(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The ways to hand over a node without RDMA devices: an empty tree, an empty snapshot, a
    tree with GPUs only."""
    base = tmp_path_factory.mktemp("rdma-less")
    (base / "empty").mkdir()
    with tarfile.open(base / "empty.tar.gz", "w:gz"):
        pass
    spec = samples.load("workstation").spec
    samples.build({**spec, "hcas": []}, base / "gpus-only")
    return {
        "empty tree": str(base / "empty"),
        "empty snapshot": str(base / "empty.tar.gz"),
        "GPUs only": str(base / "gpus-only"),
    }


@pytest.mark.parametrize("source", ["empty tree", "empty snapshot", "GPUs only"])
@pytest.mark.parametrize(
    "command",
    [
        ["inspect"],
        ["inspect", "-o", "json"],
        ["inspect", "-o", "dot"],
        ["gid", "explain"],
        ["env"],
        ["nrt"],
    ],
    ids=" ".join,
)
def test_a_node_without_rdma_fails_the_same_way_everywhere(
    rdma_less: dict[str, str], source: str, command: list[str]
) -> None:
    path = rdma_less[source]
    flag = "--snapshot" if path.endswith(".tar.gz") else "--sysfs-root"
    code, _, err = run(*command, flag, path)
    name = "snapshot " + path if flag == "--snapshot" else path + "/class/infiniband"
    assert (code, err) == (1, f"error: no RDMA device in {name}\n")


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


def test_snapshot_to_stdout_reads_back(sample_trees: dict[str, Path], tmp_path: Path) -> None:
    tree = str(sample_trees["hgx-h200-ib"])
    r = runner.invoke(app, ["snapshot", "create", "-o", "-", "--sysfs-root", tree])
    assert r.exit_code == 0 and r.stderr.startswith("wrote stdout:")
    archive = tmp_path / "n.tar.gz"
    archive.write_bytes(r.stdout_bytes)
    code, out, _ = run("inspect", "--snapshot", str(archive), "-o", "json")
    assert code == 0 and json.loads(out)["hostname"] == "hgx-h200-ib-042"
    assert list(tmp_path.iterdir()) == [archive] and not (Path.cwd() / "-").exists()


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (".", "is a directory; give a file name"),
        ("no/such/dir/x.tgz", "directory no/such/dir does not exist"),
    ],
)
def test_snapshot_targets_that_cannot_take_a_file(
    sample_trees: dict[str, Path], tmp_path: Path, monkeypatch, target: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(
        "snapshot", "create", "-o", target, "--sysfs-root", str(sample_trees["workstation"])
    )
    assert code == 2 and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_nothing_to_capture_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = tmp_path / "n.tar.gz"
    code, _, err = run(
        "snapshot", "create", "-o", str(out), "--sysfs-root", str(tmp_path / "empty")
    )
    assert code == 1 and err.startswith("error: nothing to capture: no RDMA device in ")
    assert not out.exists()


def test_materialize_lays_out_the_sample(
    tmp_path: Path, sample_nodes: dict[str, NodeTopology]
) -> None:
    dest = tmp_path / "hgx"
    code, out, _ = run("samples", "materialize", "hgx-h100-roce", str(dest))
    assert code == 0 and f"--sysfs-root {dest}" in out
    again = read_node(str(dest))
    assert replace(again, source=None) == replace(sample_nodes["hgx-h100-roce"], source=None)
    (tmp_path / "empty").mkdir()
    assert run("samples", "materialize", "workstation", str(tmp_path / "empty"))[0] == 0


@pytest.mark.parametrize(
    ("name", "dest", "message"),
    [
        ("hgx-h100-roce", "full", "not empty"),
        ("hgx-h100-roce", "file", "exists and is not a directory"),
        ("hgx-h100-roce", "missing/x", "missing/x: its directory"),
        ("../../etc", "new", "no sample named '../../etc'"),
    ],
)
def test_materialize_refuses(tmp_path: Path, name: str, dest: str, message: str) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("x")
    (tmp_path / "file").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    code, _, err = run("samples", "materialize", name, str(tmp_path / dest))
    assert code == 2 and message in err and err.count("\n") == 1
    assert sorted(tmp_path.rglob("*")) == before


def test_natural_nic_order_in_every_view() -> None:
    code, out, _ = run("inspect", "--sample", "hgx-h200-ib", "-o", "json")
    names = [h["name"] for h in json.loads(out)["hcas"]]
    assert code == 0 and names == sorted(names, key=natural_key) and "mlx5_10" in names
    _, table, _ = run("inspect", "--sample", "hgx-h200-ib")
    hca_table = table[table.index("\nRDMA devices") :]
    assert hca_table.index("mlx5_2 ") < hca_table.index("mlx5_10 ")
    _, matrix, _ = run("inspect", "--sample", "hgx-h200-ib", "-o", "matrix")
    legend = [line.split(": ")[1] for line in matrix.splitlines() if line.startswith("  NIC")]
    assert legend == names


@pytest.mark.parametrize(
    "name", ["[bold]x[/]", "[/]", "a\x1b[2Jb", "x" * 300, "line\nbreak"], ids=repr
)
def test_errors_are_one_plain_line_whatever_the_name(name: str) -> None:
    """Markup brackets, escape sequences, long and multi-line names in an error message."""
    code, _, err = run("gid", "audit", f"/nonexistent/{name}.json")
    assert code == 2 and err.count("\n") == 1 and "\x1b" not in err
    assert err.startswith("error: /nonexistent/") and ": cannot read: " in err


@pytest.mark.parametrize(
    "args",
    [
        ["samples", "-o", "xml"],
        ["inspect", "--bogus"],
        ["inspect", "-o"],
        ["gid", "audit", "-o", "x"],
    ],
    ids=" ".join,
)
def test_usage_errors_are_one_line_naming_the_flag(args: list[str]) -> None:
    code, out, err = run(*args)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("error: ") and args[-1] in err and "--help)" in err


def test_shell_completion(tmp_path: Path) -> None:
    """Through the installed entry point, as a shell runs it."""
    exe = shutil.which("rdmaplane", path=str(Path(sys.executable).parent))
    assert exe is not None
    # typer's own switch: take the shell from the flag, not from the parent process (make's sh)
    env = {**os.environ, "HOME": str(tmp_path), "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    shown = subprocess.run(
        [exe, "--show-completion", "bash"], capture_output=True, text=True, env=env, timeout=120
    )
    assert shown.returncode == 0 and "_RDMAPLANE_COMPLETE" in shown.stdout, shown.stderr
    words = "rdmaplane inspect --sample hgx"
    env |= {"_RDMAPLANE_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": "3"}
    done = subprocess.run([exe], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["hgx-h100-roce", "hgx-h200-ib"]


def test_equally_near_nics_go_to_distinct_gpus_in_the_table_and_the_picture() -> None:
    code, out, _ = run("inspect", "--sample", "dgx-a100")
    gpu_rows = {line.split()[1]: line for line in out.splitlines() if "│ GPU" in line}
    assert code == 0 and "mlx5_0 (PXB)" in gpu_rows["GPU0"] and "mlx5_1 (PXB)" in gpu_rows["GPU1"]
    code, dot, _ = run("inspect", "--sample", "dgx-a100", "-o", "dot")
    assert '"GPU0" -> "mlx5_0" [style=dashed' in dot and '"GPU1" -> "mlx5_1" [style=dashed' in dot
