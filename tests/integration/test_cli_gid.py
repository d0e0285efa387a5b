"""`rdmaplane env`, `rdmaplane gid explain` and `rdmaplane gid audit` as a user runs them."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rdmaplane.adapters.discovery import samples, snapshot
from rdmaplane.adapters.discovery.sysfs import read_node
from rdmaplane.cli import app
from rdmaplane.cli.gid import EnvFormat, render_env
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.serialize import to_document

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def bash_env(script: str, names: list[str]) -> dict[str, str]:
    """Source `script` in a real bash and read the variables back."""
    probe = "".join(f'printf "%s\\0" "${n}";' for n in names)
    out = subprocess.run(
        ["bash", "-c", f"{script}\n{probe}"], capture_output=True, check=True, text=True
    ).stdout
    return dict(zip(names, out.split("\0")[:-1], strict=True))


# ----------------------------------------------------------------- env


def test_env_json_is_one_flat_object_and_byte_stable() -> None:
    code, out, _ = run("env", "--sample", "hgx-h100-roce", "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["NCCL_IB_GID_INDEX"] == "3" and doc["NCCL_SOCKET_IFNAME"] == "=eno1"
    assert all(isinstance(v, str) for v in doc.values())
    assert run("env", "--sample", "hgx-h100-roce", "-o", "json")[1] == out


def test_env_shell_output_evaluates_to_the_same_values() -> None:
    code, out, _ = run("env", "--sample", "degraded", "--hca", "mlx5_0", "--hca", "mlx5_4")
    assert code == 0
    assert all(line.startswith("export ") for line in out.splitlines())
    doc = json.loads(
        run("env", "--sample", "degraded", "--hca", "mlx5_0", "--hca", "mlx5_4", "-o", "json")[1]
    )
    assert bash_env(out, list(doc)) == doc
    assert doc["NCCL_IB_ADDR_FAMILY"] == "AF_INET" and "NCCL_IB_GID_INDEX" not in doc


def test_shell_quoting_survives_awkward_values() -> None:
    values = {"A": 'it\'s $HOME; `x` \\ "q"', "B": "^docker,lo", "C": ""}
    script = render_env(values, EnvFormat.shell)
    assert bash_env(script, list(values)) == values


def test_env_dotenv() -> None:
    code, out, _ = run("env", "--sample", "hgx-h200-ib", "-o", "dotenv", "--socket-ifname", "")
    assert code == 0
    ucx = "mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1,mlx5_10:1,mlx5_11:1"
    hcas = ucx.replace(":1", "")
    assert out == (
        f"NCCL_IB_HCA=={ucx}\nUCX_NET_DEVICES={ucx}\nRDMAPLANE_HCAS={hcas}\nMC_GID_INDEX=0\n"
    )
    assert render_env({"X": "a b"}, EnvFormat.dotenv) == 'X="a b"\n'


def test_env_options_reach_the_plan() -> None:
    args = ["env", "--sample", "degraded", "--hca", "mlx5_0", "--hca", "mlx5_4", "-o", "json"]
    code, out, _ = run(*args, "--addr-range", "10.99.0.0/16", "--ib-tc", "106", "--ib-sl", "3")
    doc = json.loads(out)
    assert code == 0
    assert (doc["NCCL_IB_ADDR_RANGE"], doc["NCCL_IB_TC"], doc["NCCL_IB_SL"]) == (
        "10.99.0.0/16",
        "106",
        "3",
    )


def test_env_plan_error_exits_1_with_the_reason() -> None:
    code, out, err = run(
        "env", "--sample", "degraded", "--hca", "mlx5_[04]", "--nccl-version", "2.18"
    )
    assert code == 1 and out == ""
    assert "NCCL 2.18 needs one NCCL_IB_GID_INDEX" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hca", "mlx5_99"], "--hca mlx5_99: no such HCA"),
        (["--family", "5"], "error: --family: 5 is not 4 (IPv4) or 6 (IPv6)"),
        (["--addr-range", "fd00::/8"], "error: --addr-range: 'fd00::/8' is IPv6"),
        (["--roce-version", "3"], "error: --roce-version: 3 is not 1 or 2"),
        (["--ib-sl", "16"], "error: --ib-sl: 16 is not in 0–15"),
        (["--ib-tc", "256"], "error: --ib-tc: 256 is not in 0–255"),
        (["--nccl-version", "new"], "error: --nccl-version: 'new' is not a version"),
        (["--socket-ifname", " "], "error: --socket-ifname: empty"),
        (["--snapshot", "/nonexistent.tar.gz"], "give only one of"),
    ],
)
def test_env_usage_errors_exit_2(args: list[str], message: str) -> None:
    """Each error names the flag the user typed, never the plan's field name."""
    code, _, err = run("env", "--sample", "degraded", *args)
    assert code == 2 and message in " ".join(err.split())
    assert not any(field in err for field in ("ib_", "nccl_version", "policy", "settings"))


def test_infiniband_and_roce_together_is_no_environment() -> None:
    """The doctor's verdict on such a pod (nccl-env FAIL) and its NCCL log rule's."""
    code, out, err = run("env", "--sample", "hgx-h200-ib", "--hca", "mlx5_0", "--hca", "mlx5_1")
    assert code == 1 and out == "" and "InfiniBand and RoCE ports together" in err


# ----------------------------------------------------------------- explain


def test_explain_marks_the_chosen_rows_and_says_why() -> None:
    code, out, _ = run("gid", "explain", "--sample", "degraded")
    assert code == 0
    chosen = [line.split()[1:4] for line in out.splitlines() if line.startswith("→")]
    assert chosen == [["mlx5_0", "1", "5"], ["mlx5_4", "1", "7"], ["mlx5_bond_0", "1", "3"]]
    assert "skipped: types: Invalid argument" in out
    assert "mlx5_3:1         index -   only link-local GIDs" in out
    assert "excluded: port is DOWN/DISABLED, not up" in out
    assert "compute ports mlx5_bond_0:1: uniform GID index 3" in out


def test_explain_json() -> None:
    code, out, _ = run("gid", "explain", "--sample", "hgx-h100-roce", "-o", "json")
    doc = json.loads(out)
    assert code == 0 and doc["uniform_index"] == 3
    assert doc["compute"] == [f"mlx5_{i}:1" for i in range(8)]
    bond = next(p for p in doc["ports"] if p["hca"] == "mlx5_bond_0")
    assert not bond["compute"] and bond["index"] == 3
    assert [g["index"] for g in bond["gids"] if g["chosen"]] == [3]


def test_explain_not_uniform_with_hca_patterns() -> None:
    code, out, _ = run("gid", "explain", "--sample", "degraded", "--hca", "mlx5_[04]")
    assert code == 0
    assert "compute ports mlx5_0:1, mlx5_4:1: not uniform (mlx5_0:1 → 5, mlx5_4:1 → 7)" in out


# ----------------------------------------------------------------- audit


def _document(tmp_path: Path, name: str, hostname: str, ipv6_first: str | None = None) -> str:
    spec = copy.deepcopy(samples.load(name).spec)
    spec["hostname"] = hostname
    for h in spec["hcas"]:
        if h["name"] == ipv6_first:
            h["ports"][0]["addresses"] = ["fd00:99::1", *h["ports"][0]["addresses"]]
    root = tmp_path / hostname
    samples.build(spec, root)
    path = tmp_path / f"{hostname}.json"
    path.write_text(json.dumps(to_document(read_node(str(root)))))
    return str(path)


def test_audit_uniform_over_files_snapshots_and_samples(
    tmp_path: Path, sample_nodes: dict[str, NodeTopology]
) -> None:
    doc = tmp_path / "a.json"
    doc.write_text(json.dumps(to_document(sample_nodes["hgx-h100-roce"])))
    snap = tmp_path / "ws.tar.gz"
    with samples.materialised("workstation") as root:
        snapshot.create(str(snap), root=str(root))
    code, out, _ = run("gid", "audit", str(doc), "--snapshot", str(snap), "--sample", "hgx-h200-ib")
    assert code == 0
    assert "cluster-wide GID index 3" in out
    assert "InfiniBand only" in out


def test_audit_names_deviations_and_exits_1(tmp_path: Path) -> None:
    good = _document(tmp_path, "pcie-l40s-split", "l40s-1")
    odd = _document(tmp_path, "pcie-l40s-split", "l40s-2", ipv6_first="mlx5_1")
    code, out, _ = run("gid", "audit", good, odd, good)
    assert code == 1
    why = "l40s-2 mlx5_1:1: index 5, cluster uses 3 (GID 5: RoCE v2, 10.30.1.5 on ens21f0np0)"
    assert f"deviates: {why}" in out
    code, out, _ = run("gid", "audit", good, odd, "-o", "json")
    doc = json.loads(out)
    assert code == 1 and doc["uniform"] is False and doc["majority_index"] == 3
    assert [(d["node"], d["port"], d["index"]) for d in doc["deviations"]] == [
        ("l40s-2", "mlx5_1:1", 5)
    ]


def test_audit_bad_inputs_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": "something/else"}))
    for args, message in [
        ([str(bad)], "bad.json: not valid YAML/JSON"),
        (
            [str(wrong)],
            "wrong.json: schema: expected 'rdmaplane.io/node-topology/v1' (a node document, "
            "`rdmaplane inspect -o json`), got 'something/else'",
        ),
        ([str(tmp_path / "missing.json")], "missing.json: cannot read: No such file"),
        (["--sample", "nope"], "no sample named 'nope'"),
        ([], "give node documents"),
    ]:
        code, _, err = run("gid", "audit", *args)
        assert code == 2 and message in " ".join(err.split()), (args, err)


def test_audit_reads_what_inspect_writes(tmp_path: Path, sample_trees: dict[str, Path]) -> None:
    files = []
    for name in ("hgx-h100-roce", "pcie-l40s-split"):
        code, out, _ = run("inspect", "--sysfs-root", str(sample_trees[name]), "-o", "json")
        assert code == 0
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(out)
    code, out, _ = run("gid", "audit", *map(str, files), "-o", "json")
    doc = json.loads(out)
    assert code == 0 and doc["cluster_index"] == 3
    assert [n["node"] for n in doc["nodes"]] == ["hgx-h100-017", "l40s-node-9"]


def test_absurd_values_in_a_node_document_are_warnings_naming_the_file(tmp_path: Path) -> None:
    """A port's rate of -400 Gb/s, a NUMA node no kernel numbers: each a warning naming the
    file (and the key), the value left out; never a NUMA zone of their own."""
    code, out, _ = run("inspect", "--sample", "hgx-h100-roce", "-o", "json")
    doc = json.loads(out)
    doc["hcas"][0]["ports"][0]["rate_gbps"] = -400
    doc["hcas"][1]["pci_device"]["numa"] = 99999999999999999999999999
    doc["numa_nodes"].append({"id": 5000, "cpus": "", "distances": []})
    path = tmp_path / "node.json"
    path.write_text(json.dumps(doc))
    code, _, err = run("gid", "audit", str(path))
    assert code == 0
    assert f"warning: {path}: hcas[0].ports[0].rate_gbps: -400.0 is no line rate" in err
    assert f"warning: {path}: hcas[1].pci_device.numa: 99999999999999999999999999 is no NUMA" in err
    assert f"warning: {path}: numa_nodes[2].id: 5000 is no NUMA node" in err
    from rdmaplane.core.serialize import from_document

    topo = from_document(doc, where=str(path))
    assert [n.id for n in topo.numa_nodes] == [0, 1] and topo.hcas[1].numa is None
    assert topo.hcas[0].ports[0].rate_gbps is None


def test_every_command_that_reads_a_node_says_its_warnings_on_stderr(
    tmp_path: Path, sample_trees: dict[str, Path]
) -> None:
    import shutil

    tree = tmp_path / "sys"
    shutil.copytree(sample_trees["hgx-h100-roce"], tree, symlinks=True)
    (tree / "class/infiniband/selfdir").symlink_to("../infiniband")
    said = "warning: class/infiniband/selfdir: not an RDMA device"
    for args in (
        ["inspect"], ["inspect", "-o", "json"], ["inspect", "-o", "yaml"],
        ["inspect", "-o", "matrix"], ["inspect", "-o", "dot"], ["env"], ["gid", "explain"],
        ["gid", "explain", "-o", "json"], ["nrt"],
    ):  # fmt: skip
        code, out, err = run(*args, "--sysfs-root", str(tree))
        assert code == 0 and said in err and said not in out, args
