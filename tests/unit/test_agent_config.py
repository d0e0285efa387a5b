"""The agent's configuration: errors name the key; the kubelet's Topology Manager settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmaplane.adapters.config import ConfigError, load
from rdmaplane.adapters.config.agent import AGENT_CONFIG
from rdmaplane.adapters.kubelet.kubeletconfig import read_kubelet_topology_manager
from rdmaplane.core.counters import KNOWN_COUNTERS
from rdmaplane.core.settings.agent import AgentSettings, HealthSettings

HEAD = "apiVersion: rdmaplane.io/v1alpha1\nkind: AgentConfig\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(HEAD + text)
    return path


def test_defaults_and_overrides(tmp_path: Path):
    cfg = load(
        write(tmp_path, "nodeName: n1\npollInterval: 2s\nrediscoverInterval: 90\n"),
        AGENT_CONFIG,
        poll_interval_s=None,
    )
    assert (cfg.node_name, cfg.poll_interval_s, cfg.allocation_interval_s) == ("n1", 2.0, 30.0)
    assert cfg.rediscover_interval_s == 90.0  # a plain number is seconds
    assert cfg.pod_resources_socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert cfg.kubelet_config_path == Path("/var/lib/kubelet/config.yaml")
    assert load(None, AGENT_CONFIG, node_name="n2", metrics_port=1234).metrics_port == 1234
    assert load(write(tmp_path, "metricsPort: 1\n"), AGENT_CONFIG, metrics_port=2).metrics_port == 2
    assert cfg.health.thresholds["link_downed"] == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pollIntervalSecond: 3\n", "pollIntervalSecond: unknown key (did you mean pollInterval"),
        (
            "poll_interval_s: 3\n",
            "poll_interval_s: unknown key (did you mean pollInterval?)",
        ),
        ("pollInterval: -1\n", "pollInterval: Input should be greater than 0"),
        ("health: {thresholds: {symbol_error: -5}}\n", "health.thresholds"),
        (
            "health: {thresholds: {symbol_eror: 5}}\n",
            "health.thresholds: 'symbol_eror' is not a port counter the kernel exposes "
            "(did you mean symbol_error?)",
        ),
        ("publish: {backoffMax: soon}\n", "publish.backoffMax"),
        ("logFormat: xml\n", "logFormat"),
        ("metricsAddress: not an ip\n", "metricsAddress: 'not an ip' is not an IP address"),
        ("metricsAddress: example.com\n", "metricsAddress: 'example.com' is not an IP address"),
        (
            "dra: {sharing: {defaultGbps: 30, stepGbps: 25}}\n",
            "dra.sharing.defaultGbps: 30 is not a multiple of stepGbps 25",
        ),
        ("dra: {sharing: {stepGbps: 0}}\n", "dra.sharing.stepGbps: Input should be greater"),
        (
            "dra: {health: {resend: 30s, timeout: 30s}}\n",
            "dra.health.resend: 30s must be shorter than timeout (30s)",
        ),
        ("dra: {bindingConditions: maybe}\n", "dra.bindingConditions"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, message: str):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path, AGENT_CONFIG)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "127.0.0.1", "fe80::1"])
def test_metrics_address_is_an_ip(address: str):
    assert AgentSettings(metrics_address=address).metrics_address == address


def test_every_known_counter_can_have_a_threshold():
    assert AgentSettings(health=HealthSettings(thresholds=dict.fromkeys(KNOWN_COUNTERS, 1)))


def test_missing_file(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read: No such file"):
        load(tmp_path / "nope.yaml", AGENT_CONFIG, node_name="n")


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
    path.write_bytes(b"\xff\xfe junk")
    policy, _, problem = read_kubelet_topology_manager(path)
    assert policy == "none" and "not UTF-8 text" in problem
