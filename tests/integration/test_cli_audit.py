"""`rdmaplane audit` as a user runs it: samples, node documents and the NRTs `rdmaplane nrt`
writes (what the agents publish), the outliers and the exit code."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rdmaplane.adapters.discovery.samples import read_sample
from rdmaplane.cli import app
from rdmaplane.core.serialize import to_document

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_a_healthy_fleet_has_no_outliers() -> None:
    code, out, _ = run("audit", "--sample", "hgx-h100-roce", "--sample", "hgx-h100-roce")
    assert code == 0 and "no outliers among 2 node(s)" in out


def test_downtrained_links_and_an_older_firmware_are_outliers(tmp_path: Path) -> None:
    """A node document whose first HCA runs an older firmware, beside two samples: the
    firmware outlier and the degraded sample's two short links, exit 1; the JSON says the
    same."""
    hgx = to_document(read_sample("hgx-h100-roce"))
    hgx["hostname"] = "behind"
    hgx["hcas"][0]["fw_ver"] = "28.36.1010"
    (tmp_path / "behind.json").write_text(json.dumps(hgx))
    args = ("audit", str(tmp_path / "behind.json"), "--sample", "hgx-h100-roce")
    code, out, _ = run(*args, "--sample", "degraded", "-o", "json")
    assert code == 1
    doc = json.loads(out)
    assert [(o["node"], o["device"], o["what"]) for o in doc["outliers"]] == [
        ("behind", hgx["hcas"][0]["name"], "firmware"),
        ("gpu-degraded-7", "GPU2", "pcie"),
        ("gpu-degraded-7", "mlx5_0", "pcie"),
    ]
    code, out, _ = run(*args, "--sample", "degraded")
    assert code == 1 and "3 outlier(s) among 3 node(s)" in out


def test_the_published_nrts_are_read_as_the_nodes_are(tmp_path: Path) -> None:
    """The NRT `rdmaplane nrt` prints carries the firmware and the short links: the audit of
    NRTs finds what the audit of the nodes found."""
    files = []
    for sample in ("degraded", "hgx-h100-roce"):
        code, out, _ = run("nrt", "--sample", sample, "-o", "json")
        assert code == 0
        files.append(tmp_path / f"{sample}.json")
        files[-1].write_text(out)
    code, out, _ = run("audit", "--nrt", *map(str, files), "-o", "json")
    assert code == 1
    found = {(o["device"], o["what"], o["why"]) for o in json.loads(out)["outliers"]}
    code, out, _ = run("audit", "--sample", "degraded", "--sample", "hgx-h100-roce", "-o", "json")
    assert found == {(o["device"], o["what"], o["why"]) for o in json.loads(out)["outliers"]}


def test_no_nodes_is_bad_input() -> None:
    code, _, err = run("audit")
    assert code == 2 and "error: give node documents" in err
