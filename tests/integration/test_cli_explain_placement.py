"""`rdmaplane explain-placement`: a pod and NRT/node files in, a per-node table or JSON out."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rdmaplane.cli import app
from rdmaplane.core import nrt
from tests.layouts import layout
from tests.scheduler_helpers import node, pod

runner = CliRunner()


def _files(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    topologies = [
        layout("hgx-h100-roce", "hgx", policy="single-numa-node"),
        layout("pcie-l40s-split", "l40s", policy="best-effort"),
    ]
    nrts = tmp_path / "nrts.yaml"
    nrts.write_text(yaml.safe_dump_all([nrt.to_object(t) for t in topologies]))
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        yaml.safe_dump({"kind": "List", "items": [node("hgx"), node("l40s"), node("cpu-1")]})
    )
    bound = tmp_path / "bound.yaml"
    bound.write_text(yaml.safe_dump(pod("running", 4, 4, node="hgx")))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(pod("job", 2, 2)))
    return nrts, nodes, bound, job


def test_json_explains_every_node(tmp_path: Path) -> None:
    nrts, nodes, bound, job = _files(tmp_path)
    args = [
        "explain-placement",
        str(job),
        "--nrt",
        str(nrts),
        "--nodes",
        str(nodes),
        "--pods",
        str(bound),
    ]
    result = runner.invoke(app, [*args, "-o", "json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    rows = {r["node"]: r for r in out["nodes"]}
    assert out["request"]["total"] == {nrt.GPU: 2, nrt.HCA: 2}
    assert rows["hgx"]["fits"] and rows["hgx"]["alignment"] == "pcie"
    assert rows["hgx"]["unaccountedPods"] == ["default/running"]
    assert "node-1" in rows["hgx"]["detail"]  # node-0 is taken by the bound pod
    assert rows["l40s"]["alignment"] == "pcie" and rows["l40s"]["policy"] == "best-effort/container"
    assert not rows["cpu-1"]["fits"] and rows["cpu-1"]["unresolvable"]
    assert [r["node"] for r in out["nodes"]][-1] == "cpu-1"


def test_table_and_exit_codes(tmp_path: Path) -> None:
    nrts, nodes, _, job = _files(tmp_path)
    result = runner.invoke(
        app, ["explain-placement", str(job), "--nrt", str(nrts), "--nodes", str(nodes)]
    )
    assert result.exit_code == 0
    assert "no NodeResourceTopology published for this node" in result.output
    huge = tmp_path / "huge.yaml"
    huge.write_text(yaml.safe_dump(pod("huge", 8, 8)))
    result = runner.invoke(app, ["explain-placement", str(huge), "--nrt", str(nrts)])
    assert result.exit_code == 1  # no node fits
    assert "single-numa-node: no NUMA zone can hold" in result.output


def test_usage_errors(tmp_path: Path) -> None:
    _, _, _, job = _files(tmp_path)
    assert runner.invoke(app, ["explain-placement", str(job)]).exit_code == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {"kind": "Pod", "spec": {"containers": [{"resources": {"limits": {nrt.GPU: "x"}}}]}}
        )
    )
    result = runner.invoke(app, ["explain-placement", str(bad), "--nrt", str(job)])
    assert result.exit_code == 2
    assert "Pod.spec.containers[0].resources.limits[nvidia.com/gpu]" in result.output
    config = tmp_path / "config.yaml"
    config.write_text(
        "apiVersion: rdmaplane.io/v1alpha1\nkind: SchedulerExtenderConfig\n"
        "weights: {alignment: -1}\n"
    )
    result = runner.invoke(
        app, ["explain-placement", str(job), "--nrt", str(job), "--config", str(config)]
    )
    assert result.exit_code == 2 and "weights.alignment" in result.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            {"kind": "NodeResourceTopology", "metadata": "x"},
            "document 1: metadata.name: expected a non-empty string",
        ),
        (
            {"kind": "Node", "metadata": {"name": "n"}},
            "document 1: kind is 'Node', expected NodeResourceTopology",
        ),
        (
            {"kind": "List", "items": [{"metadata": {"name": 7}}]},
            "document 1, items[0]: metadata.name: expected a non-empty string",
        ),
        ([1, 2], "document 1, items[0]: expected a NodeResourceTopology object, got a number"),
        ({"metadata": {"name": "n"}, "status": "x"}, "document 1: status: expected an object"),
    ],
    ids=["metadata-string", "wrong-kind", "name-number", "list", "status-string"],
)
def test_objects_that_are_not_what_the_flag_wants(
    tmp_path: Path, content: object, message: str
) -> None:
    _, _, _, job = _files(tmp_path)
    given = tmp_path / "given.yaml"
    given.write_text(yaml.safe_dump(content))
    r = runner.invoke(app, ["explain-placement", str(job), "--nrt", str(given)])
    assert (r.exit_code, r.stderr) == (2, f"error: {given}: {message}\n")


def test_a_later_document_is_named(tmp_path: Path) -> None:
    nrts, _, _, job = _files(tmp_path)
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(nrts.read_text() + "---\nkind: NodeResourceTopology\nmetadata: x\n")
    r = runner.invoke(app, ["explain-placement", str(job), "--nrt", str(mixed)])
    assert r.exit_code == 2 and f"{mixed}: document 3: metadata.name" in r.stderr


def test_cluster_problems_are_one_line(tmp_path: Path) -> None:
    _, _, _, job = _files(tmp_path)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    closed = tmp_path / "closed.kubeconfig"
    closed.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    junk = tmp_path / "junk.kubeconfig"
    junk.write_text("clusters: 7\ncontexts: []\n")
    for kubeconfig, code, message in [
        (tmp_path / "missing", 2, "does not exist"),
        (junk, 2, f"{junk}: not a kubeconfig"),
        (closed, 1, f"cannot reach the API server of {closed}: "),
    ]:
        r = runner.invoke(app, ["explain-placement", str(job), "--kubeconfig", str(kubeconfig)])
        assert r.exit_code == code and message in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")


def test_names_from_files_reach_the_table_as_text(tmp_path: Path) -> None:
    _, _, _, job = _files(tmp_path)
    odd = nrt.to_object(layout("hgx-h100-roce", "hgx\x1b[2J[bold]", policy="none"))
    given = tmp_path / "odd.yaml"
    given.write_text(yaml.safe_dump(odd))
    r = runner.invoke(app, ["explain-placement", str(job), "--nrt", str(given)])
    assert r.exit_code == 0 and "hgx\\x1b[2J[bold]" in r.stdout and "\x1b" not in r.stdout
