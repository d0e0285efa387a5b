"""`rdmaplane explain-placement`: a pod and NRT/node files in, a per-node table or JSON out."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from rdmaplane import nrt
from rdmaplane.cli import app
from rdmaplane.scheduler.layouts import layout
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
    assert out["request"]["total"] == [2, 2, 0]
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
