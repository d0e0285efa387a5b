"""`rdmaplane agent` as a user runs it: usage errors, and a real process serving until SIGTERM."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from rdmaplane.cli import app

runner = CliRunner()


HEAD = "apiVersion: rdmaplane.io/v1alpha1\nkind: AgentConfig\n"


def test_bad_config_key_is_one_line_and_exit_2(tmp_path: Path):
    config = tmp_path / "agent.yaml"
    config.write_text(HEAD + "nodeName: n\npoll_every: 5\n")
    result = runner.invoke(app, ["agent", "--config", str(config)])
    assert result.exit_code == 2
    assert result.output == f"error: {config}: poll_every: unknown key\n"


def test_bad_config_value_names_the_key(tmp_path: Path):
    config = tmp_path / "agent.yaml"
    config.write_text(HEAD + "nodeName: n\nmetricsAddress: not an ip\n")
    result = runner.invoke(app, ["agent", "--config", str(config)])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {config}: metricsAddress: 'not an ip' is not an IP")
    assert len(result.output.splitlines()) == 1


def test_missing_node_name_and_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    result = runner.invoke(app, ["agent", "--no-publish"])
    assert result.exit_code == 2 and "nodeName: required" in result.output
    result = runner.invoke(
        app, ["agent", "--node-name", "n", "--sysfs-root", str(tmp_path / "none")]
    )
    assert result.exit_code == 2
    assert result.output == f"error: --sysfs-root {tmp_path / 'none'}: not a directory\n"


def test_bad_device_plugin_config(sample_trees: dict[str, Path], tmp_path: Path):
    plugin = tmp_path / "plugin.yaml"
    plugin.write_text("apiVersion: rdmaplane.io/v1alpha1\nkind: DevicePluginConfig\n")
    plugin.write_text(plugin.read_text() + "pools: [{mode: sometimes}]\n")
    args = ["agent", "--node-name", "n", "--sysfs-root", str(sample_trees["workstation"]),
            "--no-publish", "--device-plugin-config", str(plugin)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and f"{plugin}: pools[0].mode: Input should be" in result.output
    # read with the plugin off too: its pools name the GID index of the node label
    result = runner.invoke(app, [*args, "--no-device-plugin"])
    assert result.exit_code == 2 and f"{plugin}: pools[0].mode" in result.output


def test_the_kubelet_folder_must_exist(sample_trees: dict[str, Path], tmp_path: Path):
    """As for the standalone plugin: a wrong --kubelet-dir is said at once, never created."""
    args = ["agent", "--node-name", "n", "--sysfs-root", str(sample_trees["workstation"]),
            "--no-publish", "--metrics-port", "0"]  # fmt: skip
    for missing in (tmp_path / "nowhere", tmp_path / "a-file"):
        if missing.name == "a-file":
            missing.write_text("not a folder\n")
        result = runner.invoke(app, [*args, "--kubelet-dir", str(missing)])
        assert result.exit_code == 2
        assert result.output == f"error: --kubelet-dir {missing}: not a directory\n"
        assert not (tmp_path / "nowhere").exists()


def test_unusable_plugin_folder_is_one_line_and_exit_1(
    sample_trees: dict[str, Path], tmp_path: Path
):
    (tmp_path / "device-plugins").write_text("a file where the plugin folder should be\n")
    result = runner.invoke(
        app,
        ["agent", "--node-name", "n", "--sysfs-root", str(sample_trees["workstation"]),
         "--kubelet-dir", str(tmp_path), "--no-publish", "--metrics-port", "0"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    last = result.output.splitlines()[-1]  # after the startup log lines: one line, no traceback
    assert last.startswith("error: ") and "File exists" in last
    assert "Traceback" not in result.output and "Logging error" not in result.output


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rpa-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_serves_until_sigterm(sample_trees: dict[str, Path], short_dir: Path):
    env = dict(os.environ, NODE_NAME="hgx-h100-017")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rdmaplane", "agent", "--sysfs-root",
         str(sample_trees["hgx-h100-roce"]), "--kubelet-dir", str(short_dir),
         "--no-publish", "--metrics-port", "0", "--log-format", "json", "-v"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines = []
        while not any("serving /metrics" in line for line in lines):
            line = proc.stderr.readline()
            assert line, f"agent exited: {''.join(lines)}"
            lines.append(line)
        port = int(re.search(r":(\d+)\"?$", json.loads(lines[-1])["msg"]).group(1))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert "rdmaplane_port_up" in httpx.get(f"{url}/metrics").text
        assert (short_dir / "device-plugins").is_dir()  # the embedded plugin serves there
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=20)[1]
    assert proc.returncode == 0
    records = [json.loads(line) for line in (lines + out.splitlines()) if line.strip()]
    assert any(r["msg"] == "shutting down" for r in records)
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
    # -v: rdmaplane's debug lines, no gRPC or asyncio internals
    assert {r["logger"].split(".")[0] for r in records} == {"rdmaplane"}
    assert any(r["msg"].startswith("rdmaplane.io/hca: 9 HCAs (exclusive)") for r in records)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("{fatal_after: 5}", "fault.fatal_after: unknown key"),
        ("{fatalAfter: soon}", "fault.fatalAfter: 'soon' is not a duration"),
        ("{action: delete}", "fault.action: Input should be 'observe', 'notify' or 'evict'"),
        ("{graceSeconds: -1}", "fault.graceSeconds: Input should be greater than or equal to 0"),
        ("{taintEffect: Evict}", "fault.taintEffect: Input should be 'NoExecute'"),
        ("{fatalThresholds: {link_down: 0}}", "(did you mean link_downed?)"),
        ("[evict]", "fault: Input should be a valid dictionary"),
    ],
)
def test_malformed_fault_config_is_one_line_and_exit_2(tmp_path: Path, fault: str, message: str):
    config = tmp_path / "agent.yaml"
    config.write_text(HEAD + f"nodeName: n\nfault: {fault}\n")
    result = runner.invoke(app, ["agent", "--config", str(config)])
    assert result.exit_code == 2
    said = " ".join(result.output.split())  # the console wraps long lines at its width
    assert said.startswith(f"error: {config}: ") and message in said, result.output
    assert "Traceback" not in result.output
