"""Manifests as people keep them through `inject` and `explain-placement`: every kind of the
workload table, several documents in one file, a `kind: List`, objects that are not workloads
passed through, and the webhook's own rules for which pods it is called for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rdmaplane.cli import app
from rdmaplane.core import nrt
from tests.layouts import layout
from tests.workload_manifests import MANIFESTS, manifest

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
HCA = "rdmaplane.io/hca"


def _nrts(tmp_path: Path) -> Path:
    path = tmp_path / "nrts.yaml"
    path.write_text(yaml.safe_dump_all([nrt.to_object(layout("hgx-h100-roce", "hgx-1"))]))
    return path


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_inject_fills_every_pod_template_of_each_kind(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(MANIFESTS[kind][0])
    result = runner.invoke(app, ["inject", str(path), "-o", "json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    patches = json.loads(runner.invoke(app, ["inject", str(path), "-o", "patch"]).stdout)
    pointers = MANIFESTS[kind][1]
    assert (list(patches) if pointers != [""] else [""]) == pointers
    for pointer in pointers:
        node = out
        for token in filter(None, pointer.split("/")):
            node = node[int(token)] if isinstance(node, list) else node[token]
        limits = node["spec"]["containers"][0]["resources"]["limits"]
        assert limits[HCA] == "8"
    original = manifest(kind)
    original_keys = set(original) | set(original.get("spec", {}))
    assert original_keys <= set(out) | set(out.get("spec", {}))  # nothing taken away


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_explain_placement_explains_every_pod_template(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(MANIFESTS[kind][0])
    result = runner.invoke(
        app, ["explain-placement", str(path), "--nrt", str(_nrts(tmp_path)), "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    explained = out if isinstance(out, list) else [out]
    assert [e["pod"].partition(" ")[2] for e in explained] == MANIFESTS[kind][1]
    for e in explained:
        assert e["request"]["total"] == {nrt.GPU: 8, HCA: 8} and e["nodes"][0]["fits"]


def test_the_projects_own_example_a_service_then_a_job(tmp_path: Path) -> None:
    example = REPO / "examples" / "indexed-job.yaml"
    result = runner.invoke(app, ["inject", str(example)])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    originals = list(yaml.safe_load_all(example.read_text()))
    assert [d["kind"] for d in docs] == ["Service", "Job"] and docs[0] == originals[0]
    trainer = docs[1]["spec"]["template"]["spec"]["containers"][0]
    assert trainer["resources"]["limits"][HCA] == "8"
    as_json = json.loads(runner.invoke(app, ["inject", str(example), "-o", "json"]).stdout)
    assert as_json["kind"] == "List" and as_json["items"] == docs
    explained = runner.invoke(
        app, ["explain-placement", str(example), "--nrt", str(_nrts(tmp_path)), "-o", "json"]
    )
    assert explained.exit_code == 0, explained.output
    out = json.loads(explained.stdout)
    assert out["pod"] == "Job/rdma-train /spec/template"
    assert out["request"]["total"] == {nrt.GPU: 8, nrt.HCA: 8}


def test_a_list_comes_back_a_list(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    items = [
        manifest("batch/Job"),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
    ]
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    result = runner.invoke(app, ["inject", str(path)])
    assert result.exit_code == 0, result.output
    (doc,) = yaml.safe_load_all(result.stdout)
    assert doc["kind"] == "List" and doc["items"][1] == items[1]
    assert (
        HCA in doc["items"][0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    )
    patches = json.loads(runner.invoke(app, ["inject", str(path), "-o", "patch"]).stdout)
    assert set(patches) == {"/spec/template"}  # one workload: its templates' patches


def test_yaml_anchors_shared_by_two_templates(tmp_path: Path) -> None:
    """examples/volcano-job.yaml shares one pod between its tasks (&pod, *pod): each task's
    template is filled once, and the other objects' keys stay."""
    result = runner.invoke(
        app, ["inject", str(REPO / "examples" / "volcano-job.yaml"), "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    tasks = json.loads(result.stdout)["spec"]["tasks"]
    for task in tasks:
        (trainer,) = [c for c in task["template"]["spec"]["containers"] if c["name"] == "trainer"]
        assert trainer["securityContext"]["capabilities"]["add"].count("IPC_LOCK") == 1


@pytest.mark.parametrize(
    ("args", "edit", "why"),
    [
        (
            ["--namespace", "kube-system"],
            None,
            "namespace kube-system is exempt (namespaceSelector)",
        ),
        (["--namespace", "rdmaplane"], None, "namespace rdmaplane is exempt"),
        ([], "requests", "its nvidia.com/gpu is in requests only"),
        ([], "off", "it is annotated rdmaplane.io/rdma: off"),
        (["--not-opted-in"], None, "namespace default has no rdmaplane.io/inject=enabled label"),
    ],
)
def test_a_pod_the_webhook_is_not_called_for_is_left_as_it_is(
    tmp_path: Path, args: list[str], edit: str | None, why: str
) -> None:
    pod = manifest("Pod")
    container = pod["spec"]["containers"][0]
    if edit == "requests":
        container["resources"] = {"requests": {"nvidia.com/gpu": "8"}}
    if edit == "off":
        pod["metadata"]["annotations"] = {"rdmaplane.io/rdma": "off"}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    result = runner.invoke(app, ["inject", str(path), "-o", "json", *args])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == pod
    ns = args[1] if args[:1] == ["--namespace"] else "default"
    assert f"warning: Pod/{ns}/p: the webhook is not called: {why}" in result.stderr


def test_an_annotated_pod_in_a_namespace_not_opted_in_is_sent(tmp_path: Path) -> None:
    pod = manifest("Pod")
    pod["metadata"]["annotations"] = {"rdmaplane.io/rdma": "shared"}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    result = runner.invoke(app, ["inject", str(path), "-o", "json", "--not-opted-in"])
    limits = json.loads(result.stdout)["spec"]["containers"][0]["resources"]["limits"]
    assert result.exit_code == 0 and limits["rdmaplane.io/hca-shared"] == "1"


def test_a_container_naming_fewer_hcas_than_it_is_given_is_warned(tmp_path: Path) -> None:
    pod = manifest("Pod")
    pod["spec"]["containers"][0]["env"] = [{"name": "NCCL_IB_HCA", "value": "mlx5_0,mlx5_1"}]
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    result = runner.invoke(app, ["inject", str(path), "-o", "json"])
    assert result.exit_code == 0
    env = json.loads(result.stdout)["spec"]["containers"][0]["env"]
    assert {"name": "NCCL_IB_HCA", "value": "mlx5_0,mlx5_1"} in env  # kept: the user's value
    assert (
        "sets NCCL_IB_HCA=mlx5_0,mlx5_1 (2 HCA(s)) and is given 8 rdmaplane.io/hca" in result.stderr
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n",
            "no Pod or workload with a pod template in it (Service/s)",
        ),
        ("", "no Pod or workload with a pod template in it (nothing)"),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {}\n",
            "Deployment: /spec/template: missing",
        ),
    ],
)
def test_a_file_without_a_pod_template_is_exit_2(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    for args in (
        ["inject", str(path)],
        ["explain-placement", str(path), "--nrt", str(_nrts(tmp_path))],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and said in result.stderr, (args, result.output)
        assert result.stderr.count("\n") == 1 and "None" not in result.stderr


def test_several_files_after_one_nrt_flag(tmp_path: Path) -> None:
    """The README's `explain-placement POD --nrt FILE...`: each file after the flag is read."""
    files = []
    for name in ("hgx-1", "hgx-2"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(nrt.to_object(layout("hgx-h100-roce", name))))
        files.append(str(path))
    pod = tmp_path / "pod.yaml"
    pod.write_text(MANIFESTS["Pod"][0])
    result = runner.invoke(app, ["explain-placement", str(pod), "--nrt", *files, "-o", "json"])
    assert result.exit_code == 0, result.output
    assert sorted(r["node"] for r in json.loads(result.stdout)["nodes"]) == ["hgx-1", "hgx-2"]


def test_an_object_without_a_kind_is_named_without_none(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("metadata: {name: x}\n")
    result = runner.invoke(app, ["inject", str(path)])
    assert result.exit_code == 2 and "an object without a kind" in result.stderr
    assert "None" not in result.stderr


def test_explain_placement_explains_pods_as_the_webhook_admits_them(tmp_path: Path) -> None:
    """A GPU-only pod asks the NICs the webhook adds (issue 40); --no-webhook: as written; a
    GPU in requests only is said, as `inject` says it."""
    path = tmp_path / "pod.yaml"
    path.write_text(MANIFESTS["Pod"][0])
    args = ["explain-placement", str(path), "--nrt", str(_nrts(tmp_path)), "-o", "json"]
    admitted = runner.invoke(app, args)
    assert admitted.exit_code == 0, admitted.output
    assert json.loads(admitted.stdout)["request"]["total"] == {nrt.GPU: 8, HCA: 8}
    assert "explained as the webhook admits it" in admitted.stderr
    as_written = runner.invoke(app, [*args, "--no-webhook"])
    assert json.loads(as_written.stdout)["request"]["total"] == {nrt.GPU: 8}
    pod = manifest("Pod")
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "8"}}
    path.write_text(yaml.safe_dump(pod))
    result = runner.invoke(app, args)
    assert "its nvidia.com/gpu is in requests only" in result.stderr


def test_inject_says_what_the_extender_refuses(tmp_path: Path) -> None:
    pod = manifest("Pod")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "eight"}}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    result = runner.invoke(app, ["inject", str(path)])
    assert "the scheduler extender refuses this pod" in result.stderr
    assert "'eight'" in result.stderr
