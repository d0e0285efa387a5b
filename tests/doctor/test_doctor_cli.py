"""`rdmaplane doctor` through the real CLI: exit codes, tables, JSON, the report and the Job."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from rdmaplane import __version__
from rdmaplane.cli import app
from rdmaplane.services.doctor import report
from rdmaplane.services.doctor.policy import pairing

FIXTURES = Path(__file__).parent / "fixtures"
runner = CliRunner()


def run(*args: str, input: str | None = None):
    r = runner.invoke(app, list(args), input=input)
    return r.exit_code, r.stdout, r.stderr


def pod(tmp_path: Path, sys_root: Path, uverbs: list[str]) -> Path:
    (tmp_path / "sys").symlink_to(sys_root)
    (tmp_path / "dev/infiniband").mkdir(parents=True)
    for u in [*uverbs, "rdma_cm"]:
        (tmp_path / "dev/infiniband" / u).touch()
    (tmp_path / "dev/shm").mkdir()
    return tmp_path


def test_checks_json_and_exit_code(tmp_path, sample_trees):
    root = pod(tmp_path, sample_trees["hgx-h100-roce"], [])
    code, out, _ = run("doctor", "--root", str(root), "-o", "json")
    doc = json.loads(out)
    assert code == 1 and doc["status"] == "FAIL" and doc["kind"] == "checks"
    devices = next(f for f in doc["findings"] if f["name"] == "rdma-devices")
    assert devices["status"] == "FAIL" and "uverbsN" in devices["detail"]


def test_checks_table(tmp_path, sample_trees):
    root = pod(tmp_path, sample_trees["hgx-h100-roce"], ["uverbs0"])
    code, out, _ = run("doctor", "--root", str(root))
    assert "rdma-devices" in out and "mlx5_0(uverbs0)" in out
    assert code in (0, 1)  # memlock/IPC_LOCK/libs depend on the machine running the test


def test_bad_root_and_output_are_usage_errors(tmp_path):
    assert run("doctor", "--root", str(tmp_path / "nope"))[0] == 2
    assert run("doctor", "nccl-log", "-", "-o", "xml", input="x")[0] == 2
    code, _, err = run("doctor", "nccl-tests", str(tmp_path / "missing.txt"))
    assert code == 2 and "cannot read" in err


NCCL_TESTS = FIXTURES / "nccl_tests"
NCCL_LOGS = FIXTURES / "nccl"


def test_nccl_tests_against_the_nodes_nic_aggregate(tmp_path, sample_trees):
    (tmp_path / "sys").symlink_to(sample_trees["hgx-h200-ib"])
    text = (NCCL_TESTS / "v2.17.1_all_reduce_2node_mpirun.txt").read_text()
    code, out, _ = run(
        "doctor", "nccl-tests", "-", "--root", str(tmp_path), "-o", "json", input=text
    )
    doc = json.loads(out)
    assert code == 0
    assert doc["nic_aggregate_gbps"] == 3200.0  # 8 compute NICs × 400G, storage NICs left out
    assert doc["peak_busbw_gbs"] == pytest.approx(467.48)
    assert doc["avg_busbw_gbs"] == pytest.approx(160.284)
    assert doc["hosts"] == ["gpu-node-a07", "gpu-node-a12"]
    busbw = next(f for f in doc["findings"] if f["name"] == "busbw")
    assert "the 8 HCA(s) at most PXB from a GPU at" in busbw["detail"]


def test_line_rate_that_makes_the_reading_impossible_fails():
    """`--line-rate 800` for 8×400G nodes: 467 GB/s would be 467 % of it, more than any
    algorithm can move between two nodes — the reading is flagged, not passed."""
    path = str(NCCL_TESTS / "v2.17.1_all_reduce_2node_mpirun.txt")
    code, out, _ = run("doctor", "nccl-tests", path, "--line-rate", "800", "-o", "json")
    busbw = next(f for f in json.loads(out)["findings"] if f["name"] == "busbw")
    assert code == 1 and busbw["status"] == "FAIL"
    assert busbw["detail"].startswith("impossible reading: peak busbw 467.5 GB/s at 8 GiB = 467%")
    assert "average over all 11 sizes 160.3 GB/s" in busbw["detail"]


def test_a_malformed_nccl_ib_hca_is_said(tmp_path, sample_trees, monkeypatch):
    (tmp_path / "sys").symlink_to(sample_trees["hgx-h200-ib"])
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_0:one")
    path = str(NCCL_TESTS / "v2.17.1_all_reduce_2node_mpirun.txt")
    code, out, _ = run("doctor", "nccl-tests", path, "--root", str(tmp_path), "-o", "json")
    note = next(f for f in json.loads(out)["findings"] if f["name"] == "nccl-ib-hca")
    assert code == 0 and note["status"] == "WARN"
    assert "malformed" in note["detail"] and "judged against the 8 HCA(s)" in note["detail"]


def test_nccl_tests_below_eighty_percent_fails():
    text = (NCCL_TESTS / "v2.17.1_all_gather_wrong_oob.txt").read_text()
    code, out, _ = run("doctor", "nccl-tests", "-", "--line-rate", "800", "-o", "json", input=text)
    doc = json.loads(out)
    assert code == 1
    findings = {f["name"]: f for f in doc["findings"]}
    assert findings["correctness"]["status"] == "FAIL"
    assert (
        findings["busbw"]["status"] == "FAIL"
        and "22% of the 800 Gb/s" in findings["busbw"]["detail"]
    )


def test_nccl_tests_one_node_is_skipped_not_passed():
    code, out, _ = run(
        "doctor",
        "nccl-tests",
        str(NCCL_TESTS / "v2.11.0_all_reduce_error_srun.txt"),
        "--line-rate",
        "800",
        "-o",
        "json",
    )
    doc = json.loads(out)
    busbw = next(f for f in doc["findings"] if f["name"] == "busbw")
    assert code == 0 and busbw["status"] == "SKIP" and "one node" in busbw["detail"]
    assert doc["status"] == "PASS"


def test_nccl_tests_failed_run_exits_one():
    path = str(NCCL_TESTS / "v2.19.6_all_reduce_network_failure.txt")
    code, out, _ = run("doctor", "nccl-tests", path, "--line-rate", "3200")
    assert code == 1 and "run-failed" in out and "completion-error-12" in out


def test_nccl_log_table_names_the_evidence_line():
    code, out, _ = run(
        "doctor", "nccl-log", str(NCCL_LOGS / "v2.19.3_modify_qp_timeout_mixed_gid.txt")
    )
    assert code == 1
    assert "modify-qp-timeout" in out and "line 20:" in out
    assert "NCCL_IB_GID_INDEX" in out


@pytest.mark.parametrize("path", sorted(NCCL_LOGS.glob("*.txt")), ids=lambda p: p.stem)
def test_nccl_log_exit_code_is_one_exactly_when_something_fails(path):
    code, out, _ = run("doctor", "nccl-log", str(path), "-o", "json")
    doc = json.loads(out)
    failed = any(f["status"] == "FAIL" for f in doc["findings"])
    assert code == (1 if failed else 0) and doc["status"] == ("FAIL" if failed else doc["status"])


def test_nccl_log_json_carries_versions_and_evidence():
    code, out, _ = run(
        "doctor", "nccl-log", str(NCCL_LOGS / "v2.22.3_version_skew_gid_change.txt"), "-o", "json"
    )
    doc = json.loads(out)
    assert code == 0 and doc["nccl_versions"] == ["2.21.5+cuda12.4", "2.22.3+cuda12.5"]
    assert [e["name"] for e in doc["evidence"]] == ["gid-changed"]


def test_junk_is_a_clear_parse_error():
    code, _, err = run("doctor", "nccl-log", "-", input="garbage\n")
    assert code == 2 and "could not parse NCCL log" in err and "line 1" in err
    code, _, err = run("doctor", "nccl-log", "-", input="\x00garbage\n")
    assert code == 2 and "standard input: contains NUL bytes" in err


def test_report_merges_pod_logs(tmp_path):
    ok = {
        "schema": "rdmaplane.io/doctor/v1",
        "kind": "checks",
        "status": "PASS",
        "node": "n1",
        "findings": [{"name": "rdma-devices", "status": "PASS", "detail": "ok"}],
    }
    bad = {
        "schema": "rdmaplane.io/doctor/v1",
        "kind": "perf",
        "status": "FAIL",
        "node": "n2",
        "findings": [{"name": "bw mlx5_0", "status": "FAIL", "detail": "40% of 400"}],
    }
    log1 = tmp_path / "pod1.log"
    log1.write_text(json.dumps(ok, indent=2) + "\nsome stderr line\n" + json.dumps(bad, indent=2))
    log2 = tmp_path / "pod2.log"
    log2.write_text(json.dumps(ok))
    code, out, _ = run("doctor", "report", str(log1), str(log2), "-o", "json")
    doc = json.loads(out)
    assert code == 1 and doc["status"] == "FAIL" and doc["nodes"] == ["n1", "n2"]
    assert [e["kind"] for e in doc["entries"]] == ["checks", "perf", "checks"]
    assert doc["entries"][1]["failed"] == ["bw mlx5_0: 40% of 400"]
    empty = tmp_path / "empty.log"
    empty.write_text("Error from server: pod not found\n")
    code, _, err = run("doctor", "report", str(empty))
    assert code == 2 and "empty.log: no rdmaplane doctor" in err


@given(st.text())
def test_report_documents_never_crash(text):
    assert isinstance(report.documents(text), list)


@given(st.lists(st.text(alphabet="abcdefgh-0123", min_size=1, max_size=6), min_size=2, max_size=40))
def test_pairs_cover_every_node_without_overlap_in_a_round(nodes):
    if len(set(nodes)) < 2:
        with pytest.raises(ValueError):
            pairing.cover_pairs(nodes)
        return
    pairs = pairing.cover_pairs(nodes)
    covered = {n for p in pairs for n in (p.server, p.client)}
    assert covered == set(nodes)
    assert all(p.server != p.client for p in pairs)
    for rnd in {p.round for p in pairs}:
        members = [n for p in pairs if p.round == rnd for n in (p.server, p.client)]
        assert len(members) == len(set(members))
    assert len(pairs) == (len(set(nodes)) + 1) // 2


def test_job_manifests(tmp_path):
    code, out, err = run("doctor", "job", "gpu-3", "gpu-1", "gpu-2", "--image", "img:1")
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    assert docs[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "rdmaplane-doctor",
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"},
        },
    }
    assert docs[1]["kind"] == "Service" and docs[1]["spec"]["clusterIP"] == "None"
    jobs = docs[2:]
    assert len(jobs) == 4
    nodes = {j["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"] for j in jobs}
    assert nodes == {"gpu-1", "gpu-2", "gpu-3"}
    for j in jobs:
        spec = j["spec"]["template"]["spec"]
        c = spec["containers"][0]
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert c["securityContext"]["privileged"] is False
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert c["resources"]["limits"]["rdmaplane.io/hca"] == "1"
        assert c["resources"]["limits"]["memory"] == "3Gi"
        assert "rdmaplane doctor -o json" in c["command"][2]
        round_ = 1 if j["metadata"]["name"].startswith("rdmaplane-doctor-pair-1") else 0
        assert j["spec"]["activeDeadlineSeconds"] == 600 + 90 * round_
    client = next(j for j in jobs if j["metadata"]["name"].endswith("pair-0-client"))
    assert (
        "--client pair-0-server.rdmaplane-doctor.rdmaplane-doctor.svc"
        in client["spec"]["template"]["spec"]["containers"][0]["command"][2]
    )
    server = next(j for j in jobs if j["metadata"]["name"].endswith("pair-0-server"))
    assert server["spec"]["template"]["spec"]["hostname"] == "pair-0-server"
    assert "round 1: gpu-3 (server)" in err
    assert run("doctor", "job", "only-one")[0] == 2


def test_job_prints_what_the_shipped_example_holds() -> None:
    """`doctor job ... | kubectl apply -f -` gives the objects of deploy/doctor's example, which
    says it was generated by it (issue 40); --no-namespace leaves the Namespace out."""
    example = Path(__file__).resolve().parents[2] / "deploy" / "doctor" / "example-3-nodes.yaml"
    said = example.read_text().splitlines()[0].removeprefix("# Generated by: rdmaplane ")
    code, out, _ = run(*said.split())
    assert code == 0
    shipped = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(example.read_text())]
    assert [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out)] == shipped
    code, out, _ = run(*said.split(), "--no-namespace")
    assert code == 0 and "Namespace" not in [d["kind"] for d in yaml.safe_load_all(out)]


def test_job_pods_request_the_pool_named() -> None:
    """A renamed exclusive pool (or a shared one, slots then) instead of rdmaplane.io/hca."""
    args = ("doctor", "job", "gpu-1", "gpu-2", "--hcas", "2", "--resource", "example.com/ib")
    code, out, _ = run(*args)
    jobs = [d for d in yaml.safe_load_all(out) if d["kind"] == "Job"]
    assert code == 0 and len(jobs) == 2
    for j in jobs:
        res = j["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert res["limits"]["example.com/ib"] == res["requests"]["example.com/ib"] == "2"
        assert "rdmaplane.io/hca" not in res["limits"]
    code, _, err = run("doctor", "job", "gpu-1", "gpu-2", "--resource", "hca")
    assert code == 2 and "--resource 'hca'" in err


def test_job_default_image_is_this_release() -> None:
    code, out, _ = run("doctor", "job", "gpu-1", "gpu-2")
    assert code == 0
    images = {
        d["spec"]["template"]["spec"]["containers"][0]["image"]
        for d in yaml.safe_load_all(out)
        if d["kind"] == "Job"
    }
    assert images == {f"ghcr.io/rdmaplane/rdmaplane:{__version__}"}


@pytest.mark.parametrize(
    ("checks", "perf", "expected"), [(0, 0, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1), (0, 2, 2)]
)
def test_job_pod_exits_with_the_worse_verdict(
    tmp_path: Path, checks: int, perf: int, expected: int
) -> None:
    """The Job's own shell line, run by sh with a stand-in `rdmaplane` that exits as told: both
    outputs are printed, and the pod's status is the worse of the two (so the Job fails)."""
    pairs = pairing.cover_pairs(["a", "b"])
    job = pairing.manifests(pairs, image="img:1")[1]
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    stand_in = tmp_path / "rdmaplane"
    stand_in.write_text(
        '#!/bin/sh\necho "ran $*"\n[ "$2" = perf ] && exit "$PERF"; exit "$CHECKS"\n'
    )
    stand_in.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "CHECKS": str(checks), "PERF": str(perf)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == expected
    assert done.stdout.splitlines() == [
        "ran doctor -o json",
        "ran doctor perf --server --duration 5 -o json",
    ]


def test_the_groups_options_reach_each_command(tmp_path, sample_trees):
    """`doctor -o json nccl-log FILE` prints JSON; `doctor --root DIR nccl-tests FILE` reads
    the NICs below DIR, as the same options after the command do."""
    log = str(NCCL_LOGS / "v2.22.3_version_skew_gid_change.txt")
    before, after = (
        run("doctor", "-o", "json", "nccl-log", log),
        run("doctor", "nccl-log", log, "-o", "json"),
    )
    assert before[0] == after[0] == 0 and json.loads(before[1]) == json.loads(after[1])
    (tmp_path / "sys").symlink_to(sample_trees["hgx-h200-ib"])
    tests_output = str(NCCL_TESTS / "v2.17.1_all_reduce_2node_mpirun.txt")
    code, out, _ = run("doctor", "--root", str(tmp_path), "-o", "json", "nccl-tests", tests_output)
    assert code == 0 and json.loads(out)["nic_aggregate_gbps"] == 3200.0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["doctor", "--root", "/", "nccl-log", "-"], "doctor nccl-log: --root means nothing here"),
        (["doctor", "--root", "/", "report", "-"], "doctor report: --root means nothing here"),
        (["doctor", "-o", "json", "job", "a", "b"], "doctor job: -o means nothing here"),
        (
            ["doctor", "-o", "json", "nccl-log", "-", "-o", "table"],
            "-o given to doctor and to nccl-log; give it once",
        ),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else "",
)
def test_a_group_option_a_command_cannot_use_is_refused(args, said):
    code, out, err = run(*args, input="")
    assert code == 2 and out == "" and said in err and err.count("\n") == 1


def test_doctor_job_and_the_webhook_run_the_same_image():
    from rdmaplane.core.settings.webhook import Doctor

    code, out, _ = run("doctor", "job", "gpu-1", "gpu-2")
    images = {
        c["image"]
        for doc in yaml.safe_load_all(out)
        if doc["kind"] == "Job"
        for c in doc["spec"]["template"]["spec"]["containers"]
    }
    assert code == 0 and images == {Doctor().image}
