"""Machine output comes back exactly as given (issue 40): `inject -o yaml` and `-o json` read
back equal to each other, every value the webhook does not own is the input's, and `-o patch`
applied to the input gives the same objects — for generated manifests (long strings without
spaces, long quoted JSON, non-ASCII text, block scalars, every workload kind, several
namespaces), at terminal widths 40, 80 and piped. Also: objects keyed by kind, namespace and
name; `-` as standard input; kinds rdmaplane does not read warned about by kind."""

from __future__ import annotations

import copy
import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import jsonpointer
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rdmaplane.cli import app, common
from rdmaplane.core.workloads import UNREAD_WORKLOADS, pod_templates
from tests.workload_manifests import MANIFESTS, manifest

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]

_NO_SPACE = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=120, max_size=700
)
_UNICODE = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), min_codepoint=0x20),
    min_size=1,
    max_size=200,
)
_JSON = st.dictionaries(
    st.text(min_size=1, max_size=20),
    st.one_of(st.text(max_size=80), st.integers(), st.booleans(), st.none()),
    max_size=12,
).map(lambda d: json.dumps(d, ensure_ascii=False))
_BLOCK = st.lists(
    st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=90),
    min_size=2,
    max_size=8,
).map(lambda lines: "\n".join(lines) + "\n")
_VALUE = st.one_of(_NO_SPACE, _UNICODE, _JSON, _BLOCK, st.text(max_size=40))


@st.composite
def manifests(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Objects of every workload kind (some twice, in different namespaces), each container
    with generated env values and each object with generated annotations."""
    kinds = draw(st.lists(st.sampled_from(sorted(MANIFESTS)), min_size=1, max_size=5))
    objects = []
    seen: set[tuple[str, str, str]] = set()
    for kind in kinds:
        obj = manifest(kind)
        ns = draw(st.sampled_from(["team-a", "team-b", "ünï-ns-is-not-a-label-but-a-string"]))
        name = obj["metadata"]["name"]
        if (kind, ns, name) in seen:
            continue
        seen.add((kind, ns, name))
        obj["metadata"]["namespace"] = ns
        obj["metadata"]["annotations"] = {
            "kubectl.kubernetes.io/last-applied-configuration": draw(_JSON) + "\n",
            "example.com/note": draw(_VALUE),
        }
        for t in pod_templates(obj, "generated"):
            for c in t.template["spec"]["containers"]:
                c["env"] = [
                    {"name": f"V{i}", "value": draw(_VALUE)} for i in range(draw(st.integers(1, 3)))
                ]
                c["args"] = ["--kv-transfer-config", draw(_JSON)]
        objects.append(obj)
    return objects


def _inject(path: Path, output: str, columns: str | None) -> Any:
    common._consoles.clear()  # the consoles read COLUMNS when made
    env = {"COLUMNS": columns} if columns else {"COLUMNS": ""}
    result = runner.invoke(app, ["inject", str(path), "-o", output], env=env)
    assert result.exit_code == 0, result.output
    return result


def _items(doc: Any) -> list[Any]:
    return doc["items"] if doc.get("kind") == "List" and "items" in doc else [doc]


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{obj['kind']}/{meta['namespace']}/{meta['name']}"


def _given_values(obj: dict[str, Any]) -> list[tuple[list[Any], Any]]:
    """(path, value) of every value the generator put in: the webhook never owns them."""
    out: list[tuple[list[Any], Any]] = [
        (["metadata", "annotations"], obj["metadata"]["annotations"])
    ]
    for t in pod_templates(obj, "given"):
        for i, c in enumerate(t.template["spec"]["containers"]):
            base = [*t.path, "spec", "containers", i]
            out.append(([*base, "args"], c["args"]))
            out += [([*base, "env", j], e) for j, e in enumerate(c["env"])]
    return out


def _at(obj: Any, path: list[Any]) -> Any:
    for token in path:
        obj = obj[token]
    return obj


@settings(
    max_examples=25,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # shrinking these takes minutes
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(objects=manifests(), columns=st.sampled_from(["40", "80", None]))
def test_outputs_read_back_as_given(
    tmp_path: Path, objects: list[dict[str, Any]], columns: str | None
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all(objects, allow_unicode=True, sort_keys=False))
    # what the file holds is the reference (PyYAML's own emitter, writing the input, does not
    # give back every line separator it is handed)
    objects = list(yaml.safe_load_all(path.read_text()))
    as_json = _items(json.loads(_inject(path, "json", columns).stdout))
    as_yaml = list(yaml.safe_load_all(_inject(path, "yaml", columns).stdout))
    assert as_yaml == as_json
    assert len(as_json) == len(objects)
    for given_obj, out in zip(objects, as_json, strict=True):
        for where, value in _given_values(given_obj):
            got = _at(out, where)
            if where[-1] == "annotations":
                assert {k: got[k] for k in value} == value
            elif isinstance(where[-1], int):
                assert got == value
            else:
                assert got[: len(value)] == value
    patches = json.loads(_inject(path, "patch", columns).stdout)
    if len(objects) == 1:
        patches = {_key(objects[0]): patches}
    assert set(patches) == {_key(o) for o in objects}
    for given_obj, out in zip(objects, as_json, strict=True):
        patch = patches[_key(given_obj)]
        per_template = {"": patch} if isinstance(patch, list) else patch
        patched = copy.deepcopy(given_obj)
        for pointer, ops in per_template.items():
            if pointer:
                sub = jsonpointer.resolve_pointer(patched, pointer)
                jsonpatch.apply_patch(sub, ops, in_place=True)
            else:
                patched = jsonpatch.apply_patch(patched, ops)
        assert patched == out


def _two_trainers(tmp_path: Path) -> Path:
    pod = manifest("Pod")
    pod["metadata"]["name"] = "trainer"
    docs = []
    for ns, gpus in (("team-a", "8"), ("team-b", "4")):
        one = copy.deepcopy(pod)
        one["metadata"]["namespace"] = ns
        one["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = gpus
        docs.append(one)
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_patches_are_keyed_by_kind_namespace_and_name(tmp_path: Path) -> None:
    result = runner.invoke(app, ["inject", str(_two_trainers(tmp_path)), "-o", "patch"])
    assert result.exit_code == 0, result.output
    patches = json.loads(result.stdout)
    assert list(patches) == ["Pod/team-a/trainer", "Pod/team-b/trainer"]
    hca = "/spec/containers/0/resources/limits/rdmaplane.io~1hca"
    hcas = [op["value"] for p in patches.values() for op in p if op["path"] == hca]
    assert hcas == ["8", "4"]


def _run(args: list[str], stdin: bytes | None = None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rdmaplane", *args],
        input=stdin,
        capture_output=True,
        env={**os.environ, **env},
        check=False,
    )


def test_standard_input_for_inject_and_explain_placement(tmp_path: Path) -> None:
    text = _two_trainers(tmp_path).read_bytes()
    done = _run(["inject", "-", "-o", "patch"], text)
    assert done.returncode == 0, done.stderr
    assert list(json.loads(done.stdout)) == ["Pod/team-a/trainer", "Pod/team-b/trainer"]
    nrt = tmp_path / "nrt.yaml"
    nrt.write_bytes(_run(["nrt", "--sample", "hgx-h100-roce"]).stdout)
    done = _run(["explain-placement", "-", "--nrt", str(nrt), "-o", "json"], text)
    assert done.returncode == 0, done.stderr
    assert [e["pod"] for e in json.loads(done.stdout)] == [
        "Pod/team-a/trainer",
        "Pod/team-b/trainer",
    ]


def test_yaml_at_a_40_column_terminal_is_the_value(tmp_path: Path) -> None:
    """Through a pseudo-terminal (stdout a tty, 40 columns): the YAML is still the values."""
    pod = manifest("Pod")
    url = "https://storage.example.com/b/o?X-Amz-Signature=" + "a" * 400
    block = "line one\n  indented ü 学\nline three\n"
    pod["spec"]["containers"][0]["env"] = [
        {"name": "URL", "value": url},
        {"name": "SCRIPT", "value": block},
    ]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(pod))
    leader, follower = pty.openpty()
    done = subprocess.run(
        [sys.executable, "-m", "rdmaplane", "inject", str(path)],
        stdout=follower,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "40"},
        check=False,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    assert done.returncode == 0, done.stderr
    env = yaml.safe_load(text)["spec"]["containers"][0]["env"]
    assert env[0]["value"] == url and env[1]["value"] == block
    assert "SCRIPT\n      value: |" in text  # a block stays a block
    assert "ü 学" in text  # non-ASCII text as it is


@pytest.mark.parametrize("command", ["inject", "explain-placement"])
def test_gpu_kinds_it_does_not_read_are_named(tmp_path: Path, command: str) -> None:
    ray = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc", "namespace": "team-a"},
        "spec": {
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "h"}]}}},
            "workerGroupSpecs": [
                {
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "w", "resources": {"limits": {"nvidia.com/gpu": 8}}}
                            ]
                        }
                    }
                }
            ],
        },
    }
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "llm"},
        "spec": {"predictor": {"model": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}}},
    }
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all([manifest("Pod"), ray, isvc]))
    nrt = tmp_path / "nrt.yaml"
    nrt.write_bytes(_run(["nrt", "--sample", "hgx-h100-roce"]).stdout)
    extra = ["--nrt", str(nrt)] if command == "explain-placement" else []
    result = runner.invoke(app, [command, str(path), *extra])
    assert result.exit_code == 0, result.output
    assert "RayCluster/team-a/rc: asks GPUs" in result.stderr
    assert "serving.kserve.io/InferenceService" in result.stderr
    alone = tmp_path / "ray.yaml"
    alone.write_text(yaml.safe_dump(ray))
    result = runner.invoke(app, [command, str(alone), *extra])
    assert result.exit_code == 2
    assert "ray.io/RayCluster: its pods are built by its operator" in result.stderr


def test_the_table_of_unread_kinds_names_no_kind_it_reads() -> None:
    from rdmaplane.core.workloads import WORKLOADS

    assert not set(UNREAD_WORKLOADS) & set(WORKLOADS)
