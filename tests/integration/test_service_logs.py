"""One log format across the long-running commands (device plugin, extender; the agent's own
test runs it with JSON too): every line one JSON object with ts/level/logger/msg, uvicorn's
included; `-v` brings rdmaplane's DEBUG lines and no library internals. And the plugin's
folder rule (the same as the agent's): the kubelet's root must exist, the plugin's own folders
are created and the creation logged."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from rdmaplane.adapters import logs
from rdmaplane.cli import app
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.settings.deviceplugin import CdiSettings, PluginSettings
from rdmaplane.services.deviceplugin import RdmaDevicePlugin
from tests.scheduler_helpers import unreachable_kubeconfig

HEAD = "apiVersion: rdmaplane.io/v1alpha1\nkind: DevicePluginConfig\n"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    names = ("", "rdmaplane", "uvicorn", "uvicorn.error", "uvicorn.access")
    saved = [(lg, lg.handlers[:], lg.level, lg.propagate) for lg in map(logging.getLogger, names)]
    yield
    for lg, handlers, level, propagate in saved:
        lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate


def test_json_lines_carry_extra_fields(restore_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("json", "INFO", stream)
    logging.getLogger("rdmaplane.test").warning(
        "retrying in %g s", 4, extra={"attempt": 3, "node": "n1"}
    )
    line = json.loads(stream.getvalue())
    assert line["msg"] == "retrying in 4 s"
    assert (line["level"], line["logger"], line["attempt"], line["node"]) == (
        "warning",
        "rdmaplane.test",
        3,
        "n1",
    )
    assert line["ts"].endswith("+00:00")


def test_text_lines_append_extra_fields(restore_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("text", "INFO", stream)
    logging.getLogger("rdmaplane.test").warning("retrying", extra={"attempt": 3})
    assert stream.getvalue().rstrip().endswith(" WARNING rdmaplane.test: retrying attempt=3")


def test_debug_is_ours_only(restore_logging: None) -> None:
    """-v: rdmaplane's DEBUG lines; gRPC's, httpx's and asyncio's stay at WARNING; uvicorn says
    where it listens, in our format even where its own logging config had been applied."""
    logging.getLogger("uvicorn").addHandler(logging.StreamHandler(io.StringIO()))
    logging.getLogger("uvicorn").propagate = False
    stream = io.StringIO()
    logs.configure("json", "DEBUG", stream)
    logging.getLogger("rdmaplane.services.deviceplugin").debug("ours")
    for name in ("grpc._cython.cygrpc", "httpx", "httpcore.connection", "asyncio", "hpack"):
        logging.getLogger(name).debug("internals")
        logging.getLogger(name).info("internals")
    logging.getLogger("uvicorn.error").info("Uvicorn running")
    logging.getLogger("grpc").warning("a real problem")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(r["logger"], r["msg"]) for r in lines] == [
        ("rdmaplane.services.deviceplugin", "ours"),
        ("uvicorn.error", "Uvicorn running"),
        ("grpc", "a real problem"),
    ]


def read_json_lines(
    proc: subprocess.Popen[str], until: str, lines: list[dict[str, object]]
) -> None:
    """Parse the process's stderr line by line (each must be JSON) until a message contains
    `until`; the test's timeout is the process exiting, or 60 s."""
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while not any(until in str(r["msg"]) for r in lines):
        assert time.monotonic() < deadline, f"no {until!r} in {lines}"
        line = proc.stderr.readline()
        assert line, f"exited with {proc.wait()}: {lines}"
        lines.append(json.loads(line))


def stop(proc: subprocess.Popen[str], lines: list[dict[str, object]], *codes: int) -> None:
    """SIGTERM; the exit code must be one of `codes` (default 0), every line JSON."""
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=30)[1]
    lines += [json.loads(line) for line in rest.splitlines() if line.strip()]
    assert proc.returncode in (codes or (0,)), lines


def test_device_plugin_logs_its_pools_in_json(sample_trees: dict[str, Path]) -> None:
    with tempfile.TemporaryDirectory(prefix="dpl-") as short:  # unix socket paths are short
        kubelet = Path(short)
        config = kubelet / "dp.yaml"
        config.write_text(
            HEAD + "pools:\n- resourceName: rdmaplane.io/hca\n"
            "- resourceName: example.com/nothing\n  selectors: {vendors: ['dead']}\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "rdmaplane", "device-plugin", "--config", str(config),
             "--sysfs-root", str(sample_trees["hgx-h100-roce"]), "--kubelet-dir", str(kubelet),
             "--log-format", "json", "-v"],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        lines: list[dict[str, object]] = []
        try:
            read_json_lines(proc, "example.com/nothing: serving on", lines)
        finally:
            stop(proc, lines)
        assert (kubelet / "device-plugins").is_dir()
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in lines)
    assert {str(r["logger"]).split(".")[0] for r in lines} == {"rdmaplane"}, lines
    said = {(r["level"], r["msg"]) for r in lines}
    assert ("info", f"rdmaplane.io/hca: created {kubelet / 'device-plugins'}") in said
    assert (
        "info",
        "rdmaplane.io/hca: 9 HCAs (exclusive): mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, "
        "mlx5_6, mlx5_7, mlx5_bond_0",
    ) in said
    assert (
        "warning",
        'example.com/nothing: no HCA port matches the selectors {"vendors": ["dead"]}; '
        "the pool offers no device",
    ) in said


def test_extender_logs_uvicorn_in_the_same_format(tmp_path: Path) -> None:
    kubeconfig = unreachable_kubeconfig(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rdmaplane", "scheduler-extender", "--host", "127.0.0.1",
         "--port", str(port), "--kubeconfig", str(kubeconfig), "--log-format", "json", "-v"],
        stderr=subprocess.PIPE, text=True, env=dict(os.environ, NO_COLOR="1"),
    )  # fmt: skip
    lines: list[dict[str, object]] = []
    try:
        read_json_lines(proc, "Uvicorn running on", lines)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200
        read_json_lines(proc, "GET /healthz", lines)
        read_json_lines(proc, "watch: ConnectError", lines)
    finally:  # uvicorn shuts down gracefully, then re-raises the signal it caught
        stop(proc, lines, 0, -signal.SIGTERM)
    loggers = {str(r["logger"]) for r in lines}
    assert {"uvicorn.error", "uvicorn.access", "rdmaplane.services.scheduler.watch"} <= loggers
    assert all(name.split(".")[0] in ("rdmaplane", "uvicorn") for name in loggers), loggers


def test_standalone_plugin_refuses_a_missing_kubelet_dir(
    sample_trees: dict[str, Path], tmp_path: Path
) -> None:
    config = tmp_path / "dp.yaml"
    config.write_text(HEAD)
    missing = tmp_path / "kubelet"
    result = CliRunner().invoke(
        app,
        ["device-plugin", "--config", str(config), "--sysfs-root",
         str(sample_trees["workstation"]), "--kubelet-dir", str(missing)],
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.output == f"error: --kubelet-dir {missing}: not a directory\n"
    assert not missing.exists()


def test_a_missing_cdi_folder_is_created_and_said(
    sample_nodes: dict[str, NodeTopology], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec_dir = tmp_path / "run" / "cdi"
    cfg = PluginSettings(cdi=CdiSettings(enabled=True, spec_dir=str(spec_dir)))
    caplog.set_level(logging.INFO, logger="rdmaplane")
    RdmaDevicePlugin(cfg, kubelet_dir=tmp_path).update(sample_nodes["hgx-h100-roce"])
    assert (spec_dir / "rdmaplane.io-hca.json").is_file()
    assert f"created the CDI spec folder {spec_dir}" in caplog.messages
