"""`rdmaplane explain-placement` answers what the extender answers kube-scheduler: the same
files through the CLI and, over real HTTP, through /filter then /prioritize (with the nodes
that passed, as kube-scheduler calls it), every field equal. The case that set them apart: a
job's next 8-GPU pod whose peer is bound under leaf-a, where the job-aware fabric term lifts
leaf-a's nodes above the rest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from typer.testing import CliRunner

from rdmaplane.adapters.config import parse
from rdmaplane.adapters.config.extender import SCHEDULER_EXTENDER_CONFIG
from rdmaplane.cli import app
from rdmaplane.core import nrt
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.root import create_app
from tests.layouts import layout
from tests.scheduler_helpers import node, pod, serve

LEAF = "fabric.topograph.run/tier-0"
SPINE = "fabric.topograph.run/tier-1"
# leaf-a: a-1 (the peer's), a-2; leaf-b: b-1, b-2 (each an 8-GPU node); c-1: no NRT
PLACES = {"a-1": "leaf-a", "a-2": "leaf-a", "b-1": "leaf-b", "b-2": "leaf-b", "c-1": "leaf-b"}


def _job_pod(name: str, node_name: str = "") -> dict[str, Any]:
    obj = pod(name, 8, 8, node=node_name, ns="team")
    obj["metadata"]["labels"] = {"batch.kubernetes.io/job-name": "train"}
    obj["metadata"]["annotations"] = {"rdmaplane.io/group-size": "3"}
    return obj


def _files(tmp_path: Path) -> dict[str, Path]:
    topologies = [layout("hgx-h100-roce", n, policy="best-effort") for n in PLACES if n != "c-1"]
    nodes = []
    for name, leaf in PLACES.items():
        n = node(name)
        n["metadata"]["labels"] = {LEAF: leaf, SPINE: "spine-1"}
        nodes.append(n)
    out = {
        "nrt": yaml.safe_dump_all([nrt.to_object(t) for t in topologies]),
        "nodes": yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}),
        "pods": yaml.safe_dump(_job_pod("train-0", "a-1")),
        "pod": yaml.safe_dump(_job_pod("train-1")),
    }
    paths = {}
    for key, text in out.items():
        paths[key] = tmp_path / f"{key}.yaml"
        paths[key].write_text(text)
    return paths


def _call(url: str, verb: str, body: object) -> Any:
    reply = httpx.post(f"{url}/{verb}", content=orjson.dumps(body))
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize("weights", [None, {"weight": 1.0, "nodeLocal": 0.2}])
def test_explain_placement_is_filter_then_prioritize(
    tmp_path: Path, weights: dict[str, float] | None
) -> None:
    files = _files(tmp_path)
    config = {"apiVersion": "rdmaplane.io/v1alpha1", "kind": "SchedulerExtenderConfig"}
    if weights:
        config["fabric"] = weights
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(
        app,
        [
            "explain-placement", str(files["pod"]), "--nrt", str(files["nrt"]),
            "--nodes", str(files["nodes"]), "--pods", str(files["pods"]),
            "--config", str(config_file), "-o", "json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    explained = json.loads(result.stdout)
    rows = {r["node"]: r for r in explained["nodes"]}

    cfg = parse(config, SCHEDULER_EXTENDER_CONFIG, "config.yaml")
    cache = ClusterCache.configured(cfg)
    cache.replace("nrt", list(yaml.safe_load_all(files["nrt"].read_text())))
    cache.replace("node", yaml.safe_load(files["nodes"].read_text())["items"])
    cache.replace("pod", [yaml.safe_load(files["pods"].read_text())])
    candidate = yaml.safe_load(files["pod"].read_text())
    names = sorted(PLACES)
    with serve(create_app(cache, cfg)) as url:
        filtered = _call(url, "filter", {"Pod": candidate, "NodeNames": names})
        scores = _call(url, "prioritize", {"Pod": candidate, "NodeNames": filtered["NodeNames"]})
        debug = _call(url, "debug/explain", {"Pod": candidate, "NodeNames": names})

    assert sorted(filtered["NodeNames"]) == sorted(n for n, r in rows.items() if r["fits"])
    failed = {**filtered["FailedNodes"], **filtered["FailedAndUnresolvableNodes"]}
    assert failed == {n: f"rdmaplane: {r['detail']}" for n, r in rows.items() if not r["fits"]}
    assert set(filtered["FailedAndUnresolvableNodes"]) == {
        n for n, r in rows.items() if r["unresolvable"]
    }
    assert {s["Host"]: s["Score"] for s in scores} == {
        n: r["score"] for n, r in rows.items() if r["fits"]
    }
    assert debug == {k: v for k, v in explained.items() if k != "pod"}  # the same answer
    # the fabric term is in it: the peer's leaf scores above the other leaf
    assert explained["job"]["boundPeers"] == 1 and explained["job"]["peerNodes"] == ["a-1"]
    assert rows["a-2"]["score"] > rows["b-1"]["score"] == rows["b-2"]["score"]
    assert rows["a-2"]["fabricTerm"] == 1.0 and rows["b-1"]["fabricTerm"] < 1.0


def test_a_job_manifest_is_explained_as_its_pods_will_be(tmp_path: Path) -> None:
    """A Job's template gets the label its controller puts on its pods, so the bound peer
    counts for it as for the real pod."""
    files = _files(tmp_path)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "team"},
        "spec": {"template": {"metadata": {"annotations": {"rdmaplane.io/group-size": "3"}},
                              "spec": _job_pod("x")["spec"]}},
    }  # fmt: skip
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job))
    args = [
        "--nrt",
        str(files["nrt"]),
        "--nodes",
        str(files["nodes"]),
        "--pods",
        str(files["pods"]),
    ]
    as_pod = CliRunner().invoke(app, ["explain-placement", str(files["pod"]), *args, "-o", "json"])
    as_job = CliRunner().invoke(app, ["explain-placement", str(manifest), *args, "-o", "json"])
    assert as_pod.exit_code == as_job.exit_code == 0
    pod_rows, job_rows = json.loads(as_pod.stdout), json.loads(as_job.stdout)
    assert job_rows["pod"] == "Job/team/train /spec/template"
    assert job_rows["nodes"] == pod_rows["nodes"] and job_rows["job"] == pod_rows["job"]
