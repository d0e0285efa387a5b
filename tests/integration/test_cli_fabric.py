"""`rdmaplane fabric show` and `fabric export` from a fabric file, from Node/NRT files, with a
job's pods marked; the Graphviz picture parsed by a real DOT parser (pydot); bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydot
import pytest
import yaml
from typer.testing import CliRunner

from rdmaplane.cli import app
from rdmaplane.core import fabric as fab
from rdmaplane.core import nrt
from tests.fabrics import leaf_spine, rail_optimised
from tests.layouts import hgx_uplinks, layout
from tests.scheduler_helpers import pod

runner = CliRunner()
# pydot 4 calls pyparsing's old camelCase names, which pyparsing 3.3 marks deprecated
pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated - use:DeprecationWarning")


def run(*args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def write(path: Path, doc: Any) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_show_a_fabric_file_as_json(tmp_path: Path) -> None:
    code, out, _ = run(
        "fabric",
        "show",
        "--fabric-file",
        write(tmp_path / "f.yaml", leaf_spine(4, 16)),
        "-o",
        "json",
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == "rdmaplane.io/fabric/v1" and doc["tiers"] == 3
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert len(nodes) == 64 and nodes["gpu-017"]["tiers"] == ["leaf-1", "spine-0", "core"]


def test_show_table_marks_a_job(tmp_path: Path) -> None:
    fabric = write(tmp_path / "f.yaml", leaf_spine(2, 4))
    bound = [pod(f"train-{i}", 8, 8, node=f"gpu-00{i}", ns="ml") for i in (1, 5)]
    for p in bound:
        p["metadata"]["labels"] = {"batch.kubernetes.io/job-name": "train"}
    pods = write(tmp_path / "pods.yaml", {"apiVersion": "v1", "kind": "List", "items": bound})
    code, out, _ = run("fabric", "show", "--fabric-file", fabric, "--pods", pods, "--job", "train")
    assert code == 0
    assert "8 nodes under 2 tier-0 switches, 3 tiers" in out
    row = next(line for line in out.splitlines() if "gpu-005" in line)
    assert "leaf-1" in row and "ml/train-5" in row


def test_dot_is_valid_graphviz_with_rails_and_the_job(tmp_path: Path) -> None:
    fabric = write(tmp_path / "f.yaml", rail_optimised(2, 2, 8))
    one = pod("ring-0", 8, 8, node="gpu-002", ns="ml")
    one["metadata"]["labels"] = {"rdmaplane.io/group": "ring"}
    pods = write(tmp_path / "pods.yaml", [one])
    code, out, _ = run(
        "fabric", "show", "--fabric-file", fabric, "--pods", pods, "--job", "ring", "-o", "dot"
    )
    assert code == 0
    (graph,) = pydot.graph_from_dot_data(out)
    names = {n.get_name().strip('"') for n in graph.get_nodes()}
    assert {"n:gpu-000", "t0:su0", "t0:su1", "r:su0-rail7"} <= names
    edges = {(e.get_source().strip('"'), e.get_destination().strip('"')) for e in graph.get_edges()}
    assert ("r:su1-rail3", "n:gpu-002") in edges and ("t0:su1", "r:su1-rail3") in edges
    gold = [n for n in graph.get_nodes() if n.get("fillcolor") == '"gold"']
    assert [n.get_name() for n in gold] == ['"n:gpu-002"']


def test_names_that_need_quoting_stay_valid_dot(tmp_path: Path) -> None:
    doc = leaf_spine(1, 2)
    doc["switches"][2]["name"] = 'leaf "A" \\ 1'
    for link in doc["links"]:
        link["switch"] = 'leaf "A" \\ 1'
    code, out, _ = run(
        "fabric", "show", "--fabric-file", write(tmp_path / "f.yaml", doc), "-o", "dot"
    )
    assert code == 0
    (graph,) = pydot.graph_from_dot_data(out)
    assert len(graph.get_edges()) == 4


def test_locations_from_gke_labels_and_nrt_rails(tmp_path: Path) -> None:
    nodes = [
        {
            "metadata": {
                "name": f"a3-{i}",
                "labels": {
                    "cloud.google.com/gce-topology-block": "b1",
                    "cloud.google.com/gce-topology-subblock": f"sb{i // 2}",
                },
            }
        }
        for i in range(4)
    ]
    nrts = [
        nrt.to_object(
            layout("hgx", f"a3-{i}", uplinks=hgx_uplinks([f"sb{i // 2}-r{r}" for r in range(8)]))
        )
        for i in range(4)
    ]
    args = ["--nodes", write(tmp_path / "n.yaml", {"kind": "List", "items": nodes})]
    args += ["--nrt", write(tmp_path / "r.yaml", nrts)]
    code, out, _ = run("fabric", "show", *args, "-o", "json")
    assert code == 0
    got = {n["name"]: n for n in json.loads(out)["nodes"]}
    assert got["a3-3"]["tiers"] == ["sb1", "b1"]
    assert got["a3-3"]["rails"][7] == {"rail": 7, "switch": "sb1-r7"}
    code, out, _ = run("fabric", "export", "--kueue", *args, "--name", "gke")
    assert code == 0
    topology = yaml.safe_load(out)
    assert [lvl["nodeLabel"] for lvl in topology["spec"]["levels"]] == [
        "cloud.google.com/gce-topology-block",
        "cloud.google.com/gce-topology-subblock",
        "kubernetes.io/hostname",
    ]


def test_export_volcano_from_a_fabric_file(tmp_path: Path) -> None:
    fabric = write(tmp_path / "f.yaml", leaf_spine(4, 16))
    code, out, _ = run("fabric", "export", "--volcano", "--fabric-file", fabric)
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    assert len(docs) == 4 + 2 + 1 and {d["kind"] for d in docs} == {"HyperNode"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fabric", "export", "--kueue", "--volcano"], "give exactly one of --kueue and --volcano"),
        (["fabric", "show"], "give one source"),
        (["fabric", "show", "--fabric-file", "/nonexistent.yaml"], "/nonexistent.yaml"),
    ],
)
def test_usage_errors(args: list[str], message: str) -> None:
    code, _, err = run(*args)
    assert code == 2 and message in err


def test_a_bad_fabric_file_is_one_line_naming_it(tmp_path: Path) -> None:
    doc = leaf_spine(2, 2)
    doc["switches"][0]["parent"] = "spine-0"
    path = write(tmp_path / "loop.yaml", doc)
    code, _, err = run("fabric", "show", "--fabric-file", path)
    assert code == 2
    assert err.strip() == f"error: {path}: switches: loop core → spine-0 → core"


def test_kueue_needs_one_label_scheme(tmp_path: Path) -> None:
    nodes = [
        {"metadata": {"name": "a", "labels": {"fabric.topograph.run/tier-0": "l1"}}},
        {"metadata": {"name": "b", "labels": {"topology.k8s.aws/network-node-layer-3": "nn"}}},
    ]
    code, _, err = run("fabric", "export", "--kueue", "--nodes", write(tmp_path / "n.yaml", nodes))
    assert code == 2 and "--tier-label" in err
    code, out, _ = run(
        "fabric", "export", "--kueue", "--nodes", str(tmp_path / "n.yaml"),
        "--tier-label", "fabric.topograph.run/tier-0",
    )  # fmt: skip
    assert code == 0 and "fabric.topograph.run/tier-0" in out
    assert fab.DEFAULT_TIER_LABELS[0] == "fabric.topograph.run/tier-0"


def test_a_node_whose_nics_all_plug_into_one_leaf_hangs_from_that_leaf(tmp_path: Path) -> None:
    """Per-HCA links all into leaf-0: the node's rails hang from leaf-0's own box (each edge
    labelled with the rail), not from a second, unconnected box of the same name."""
    doc = leaf_spine(1, 2)
    doc["links"] = [
        {"node": n, "hca": f"mlx5_{r}", "switch": "leaf-0"} for n in doc["nodes"] for r in range(2)
    ]
    code, out, _ = run(
        "fabric", "show", "--fabric-file", write(tmp_path / "f.yaml", doc), "-o", "dot"
    )
    assert code == 0
    (graph,) = pydot.graph_from_dot_data(out)
    names = [n.get_name().strip('"') for n in graph.get_nodes()]
    names = [n for n in names if n not in ("node", "edge", "graph")]  # DOT's default statements
    edges = [(e.get_source().strip('"'), e.get_destination().strip('"')) for e in graph.get_edges()]
    boxes = [n for n in names if n.endswith(":leaf-0")]
    assert boxes == ["t0:leaf-0"], names  # once, as the tier-0 switch
    declared = set(names)
    assert all(a in declared and b in declared for a, b in edges), edges  # nothing implicit
    assert edges.count(("t0:leaf-0", "n:gpu-000")) == 2  # rail 0 and rail 1
    reachable, frontier = {"t2:core"}, ["t2:core"]
    while frontier:
        here = frontier.pop()
        for a, b in edges:
            if a == here and b not in reachable:
                reachable.add(b)
                frontier.append(b)
    assert reachable == declared  # every box and node hangs below the core


def test_show_and_export_read_one_fabric(tmp_path: Path) -> None:
    """A node whose labels contradict the others (its leaf under another spine) is warned
    about and left out of the tree: `show` lists the nodes `export` exports, no others."""
    keys = [f"fabric.topograph.run/tier-{i}" for i in range(2)]
    nodes = [
        {"metadata": {"name": name, "labels": dict(zip(keys, tiers, strict=True))}}
        for name, tiers in (
            ("n-1", ("leaf-a", "spine-1")),
            ("n-2", ("leaf-a", "spine-1")),
            ("n-3", ("leaf-b", "spine-1")),
            ("odd", ("leaf-a", "spine-2")),
        )
    ]
    args = ["--nodes", write(tmp_path / "n.yaml", {"kind": "List", "items": nodes})]
    code, out, err = run("fabric", "show", *args, "-o", "json")
    assert code == 0 and "odd: tier-0 leaf-a sits under spine-2 here but under spine-1" in err
    shown = {n["name"] for n in json.loads(out)["nodes"]}
    _, table, _ = run("fabric", "show", *args)
    assert "odd" not in table and "n-3" in table
    code, exported, _ = run("fabric", "export", "--volcano", *args)
    members = {
        m["selector"]["exactMatch"]["name"]
        for hn in yaml.safe_load_all(exported)
        for m in hn["spec"]["members"]
        if m["type"] == "Node"
    }
    assert code == 0 and shown == members == {"n-1", "n-2", "n-3"}
