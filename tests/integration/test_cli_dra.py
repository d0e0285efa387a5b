"""`rdmaplane dra-driver` and the agent's `dra` section as a user meets them: one process offers
the HCAs one way, the driver needs the API server, every refusal is one line (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rdmaplane.cli import app

runner = CliRunner()
HEAD = "apiVersion: rdmaplane.io/v1alpha1\nkind: AgentConfig\nnodeName: n\n"


@pytest.mark.parametrize(
    ("args", "body", "message"),
    [
        (
            ["agent"],
            "dra: {enabled: true}\n",
            "dra.enabled: the device plugin is on too; one process must not offer the same HCAs "
            "through both: set devicePluginEnabled: false (rdmaplane dra-driver does)",
        ),
        (
            ["agent"],
            "devicePluginEnabled: false\ndra: {enabled: true}\npublish: {enabled: false}\n",
            "dra.enabled: the DRA driver reads claims from and publishes ResourceSlices to the "
            "API server; publish.enabled must be true",
        ),
        (
            ["dra-driver"],
            "publish: {enabled: false}\n",
            "dra.enabled: the DRA driver needs the API server (no --no-publish)",
        ),
        (
            ["dra-driver"],
            "dra: {driverName: RDMA_Driver}\n",
            "dra.driverName: 'RDMA_Driver' is not a DRA driver name (a DNS subdomain of at "
            "most 63 characters, e.g. rdma.rdmaplane.io)",
        ),
        (["dra-driver"], "dra: {taints: {fatal: Evict}}\n", "dra.taints.fatal: Input should be"),
    ],
)
def test_refusals_are_one_line_naming_the_key(
    args: list[str], body: str, message: str, tmp_path: Path
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(HEAD + body)
    result = runner.invoke(app, [*args, "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {config}: {message}"), result.output
    assert len(result.output.splitlines()) == 1


def test_agent_with_no_publish_cannot_be_the_dra_driver(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(HEAD + "devicePluginEnabled: false\ndra: {enabled: true}\n")
    result = runner.invoke(app, ["agent", "--config", str(config), "--no-publish"])
    assert result.exit_code == 2
    assert result.output == (
        f"error: {config}: dra.enabled: the DRA driver needs the API server (no --no-publish)\n"
    )


def test_the_driver_turns_the_device_plugin_off_whatever_the_file_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file written for the agent (plugin on) serves as the driver's: the command decides."""
    seen = []
    monkeypatch.setattr("rdmaplane.cli.dra.serve", lambda cfg, *_: seen.append(cfg))
    config = tmp_path / "agent.yaml"
    config.write_text(HEAD + "devicePluginEnabled: true\n")
    result = runner.invoke(app, ["dra-driver", "--config", str(config)])
    assert result.exit_code == 0, result.output
    (cfg,) = seen
    assert cfg.dra.enabled and not cfg.device_plugin_enabled
    assert cfg.dra_plugin_dir == Path("/var/lib/kubelet/plugins/rdma.rdmaplane.io")
