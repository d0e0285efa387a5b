"""`rdmaplane inject` (what the webhook does to a pod or a workload, offline) and the
`rdmaplane webhook` command's inputs: one-line errors, exit 2 for bad input, 1 for a refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from rdmaplane.cli import app
from tests.webhook_pods import HCA, gpu_pod

runner = CliRunner()


def run(*args: str) -> Any:
    return runner.invoke(app, list(args))


def write(tmp_path: Path, obj: Any, name: str = "obj.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(obj))
    return str(path)


def test_pod_as_admitted(tmp_path: Path) -> None:
    result = run("inject", write(tmp_path, gpu_pod("p", "4")))
    assert result.exit_code == 0, result.output
    pod = yaml.safe_load(result.stdout)
    assert pod["spec"]["containers"][0]["resources"]["limits"][HCA] == "4"


def test_every_template_of_a_workload(tmp_path: Path) -> None:
    template = {k: v for k, v in gpu_pod("w").items() if k in ("metadata", "spec")}
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "train"},
        "spec": {
            "replicatedJobs": [
                {"name": n, "template": {"spec": {"template": template}}}
                for n in ("leader", "workers")
            ]
        },
    }
    result = run("inject", write(tmp_path, jobset), "-o", "patch")
    assert result.exit_code == 0, result.output
    patches = json.loads(result.stdout)
    assert sorted(patches) == [f"/spec/replicatedJobs/{i}/template/spec/template" for i in (0, 1)]
    out = yaml.safe_load(run("inject", write(tmp_path, jobset)).stdout)
    for job in out["spec"]["replicatedJobs"]:
        limits = job["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits[HCA] == "8"


def test_warnings_go_to_stderr(tmp_path: Path) -> None:
    pod = gpu_pod("p", securityContext={"privileged": True})
    result = run("inject", write(tmp_path, pod), "-o", "json")
    assert result.exit_code == 0
    assert "warning: Pod/default/p: container train is privileged" in result.stderr
    json.loads(result.stdout)


def test_refused_pod_is_exit_1(tmp_path: Path) -> None:
    pod = gpu_pod("p", annotations={"rdmaplane.io/rdma": "fast"})
    result = run("inject", write(tmp_path, pod))
    assert result.exit_code == 1
    assert "refused: annotation rdmaplane.io/rdma: 'fast' is not one of" in result.stderr


def test_bad_inputs_are_one_line_exit_2(tmp_path: Path) -> None:
    pod = write(tmp_path, gpu_pod("p"))
    bad_config = write(
        tmp_path,
        {"apiVersion": "rdmaplane.io/v1alpha1", "kind": "WebhookConfig", "hcasPerGPU": 2},
        "bad.yaml",
    )
    cases = [
        (("inject", str(tmp_path / "missing.yaml")), "missing.yaml: cannot read"),
        (("inject", pod, "-o", "table"), "'table' is not one of 'yaml', 'json', 'patch'"),
        (
            ("inject", write(tmp_path, {"kind": "ConfigMap", "data": {}}, "cm.yaml")),
            "no Pod or workload with a pod template in it (ConfigMap)",
        ),
        (
            ("inject", write(tmp_path, [1, 2], "list.yaml")),
            "no Pod or workload with a pod template in it (int)",
        ),
        (
            ("inject", pod, "--config", bad_config),
            "bad.yaml: hcasPerGPU: unknown key (did you mean hcasPerGpu?)",
        ),
        (("webhook", "--config", bad_config), "bad.yaml: hcasPerGPU"),
        (("webhook", "--kubeconfig", str(tmp_path / "nope")), "nope does not exist"),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_inject_does_what_the_webhook_does_on_the_dra_path(tmp_path: Path) -> None:
    """The same policy as the webhook: a pod selecting the DRA label gets the claim of its GPU
    count in place of its GPUs; a pod with claims gets IPC_LOCK and no HCA; a pool named by
    namespace in the config follows `--namespace`."""
    headed = gpu_pod("p", "8")
    headed["spec"]["nodeSelector"] = {"rdmaplane.io/kubelet-plugin": "dra"}
    result = run("inject", write(tmp_path, headed))
    assert result.exit_code == 0, result.output
    pod = yaml.safe_load(result.stdout)
    (claim,) = pod["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == "gpu-nic-node-x8"
    c = pod["spec"]["containers"][0]
    assert c["resources"]["claims"] == [{"name": claim["name"]}]
    assert not {HCA, "nvidia.com/gpu"} & set(c["resources"]["limits"])

    claimed = gpu_pod("q", "8")
    claimed["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimTemplateName": "t"}]
    claimed["spec"]["containers"][0]["resources"]["claims"] = [{"name": "g"}]
    pod = yaml.safe_load(run("inject", write(tmp_path, claimed, "claimed.yaml")).stdout)
    c = pod["spec"]["containers"][0]
    assert HCA not in c["resources"]["limits"]
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]

    config = {
        "apiVersion": "rdmaplane.io/v1alpha1",
        "kind": "WebhookConfig",
        "dra": {"pools": [{"name": "team", "nodeSelector": {}, "namespaces": ["team-dra"]}]},
    }
    cfg = write(tmp_path, config, "config.yaml")
    plain = write(tmp_path, gpu_pod("r", "4"), "plain.yaml")
    there = yaml.safe_load(run("inject", plain, "--config", cfg, "--namespace", "team-dra").stdout)
    assert there["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "gpu-nic-numa-x4"
    elsewhere = yaml.safe_load(run("inject", plain, "--config", cfg, "--namespace", "a").stdout)
    assert "resourceClaims" not in elsewhere["spec"]
