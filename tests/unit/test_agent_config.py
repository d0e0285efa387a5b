"""The agent's configuration: errors name the key; the kubelet's Topology Manager settings."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from rdmaplane.agent import logs
from rdmaplane.agent.config import ConfigError, load, read_kubelet_topology_manager


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return path


def test_defaults_and_overrides(tmp_path: Path):
    cfg = load(write(tmp_path, "node_name: n1\npoll_interval_s: 2\n"), poll_interval_s=None)
    assert (cfg.node_name, cfg.poll_interval_s, cfg.allocation_interval_s) == ("n1", 2.0, 30.0)
    assert cfg.pod_resources_socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert cfg.kubelet_config_path == Path("/var/lib/kubelet/config.yaml")
    assert load(None, node_name="n2", metrics_port=1234).metrics_port == 1234
    assert cfg.health.thresholds["link_downed"] == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node_name: n\npoll_intervall_s: 3\n", "poll_intervall_s: Extra inputs are not permitted"),
        ("node_name: n\npoll_interval_s: -1\n", "poll_interval_s: Input should be greater than 0"),
        ("node_name: n\nhealth: {thresholds: {symbol_error: -5}}\n", "health.thresholds"),
        ("node_name: n\npublish: {backoff_max_s: soon}\n", "publish.backoff_max_s"),
        ("node_name: n\nlog_format: xml\n", "log_format"),
        ("poll_interval_s: 3\n", "node_name: required"),
        ("- a\n- b\n", "expected a mapping"),
        ("node_name: [\n", "not valid YAML"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, message: str):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value).startswith(str(path))
    assert message in str(err.value)


def test_missing_file(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read: No such file"):
        load(tmp_path / "nope.yaml", node_name="n")


def test_kubelet_topology_manager(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text("kind: KubeletConfiguration\ntopologyManagerPolicy: restricted\n")
    assert read_kubelet_topology_manager(path) == ("restricted", "container", None)
    path.write_text("topologyManagerPolicy: best-effort\ntopologyManagerScope: pod\n")
    assert read_kubelet_topology_manager(path) == ("best-effort", "pod", None)
    path.write_text("topologyManagerPolicy: strict\n")
    policy, scope, problem = read_kubelet_topology_manager(path)
    assert (policy, scope) == ("none", "container") and "'strict' unknown" in problem
    policy, _, problem = read_kubelet_topology_manager(tmp_path / "absent.yaml")
    assert policy == "none" and "not found" in problem


def test_json_logs_carry_extra_fields():
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    logs.configure("json", "INFO", stream)
    try:
        logging.getLogger("rdmaplane.test").warning(
            "retrying in %g s", 4, extra={"attempt": 3, "node": "n1"}
        )
    finally:
        root.handlers[:], root.level = handlers, level
    line = json.loads(stream.getvalue())
    assert line["msg"] == "retrying in 4 s"
    assert (line["level"], line["logger"], line["attempt"], line["node"]) == (
        "warning",
        "rdmaplane.test",
        3,
        "n1",
    )
    assert line["ts"].endswith("+00:00")
