"""The agent with its DRA driver (no device plugin, no API server) on a sample tree: the ports
the driver offers are in service from the first discovery on."""

from __future__ import annotations

from pathlib import Path

from rdmaplane.adapters.discovery import samples
from rdmaplane.core.settings.agent import AgentSettings
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.core.settings.dra import DraSettings
from rdmaplane.core.usability import PORT_DOWN
from rdmaplane.services.agent.root import Agent
from rdmaplane.services.dra.driver import DraDriver


async def test_a_port_the_dra_driver_offers_is_down_from_the_first_discovery(
    tmp_path: Path,
) -> None:
    """mlx5_3 of the degraded sample was never up: only an offer puts it in service, so the
    driver's devices must be known before the health rules first judge the node (not after,
    which left it out until the next rediscovery)."""
    samples.build(samples.load("degraded").spec, tmp_path / "sys")
    (tmp_path / "kubelet").mkdir()
    (tmp_path / "dev" / "infiniband").mkdir(parents=True)
    config = AgentSettings(
        node_name="degraded",
        sysfs_root=tmp_path / "sys",
        kubelet_dir=tmp_path / "kubelet",
        dev_root=tmp_path / "dev",
        device_plugin_enabled=False,
        dra=DraSettings(enabled=True, cdi_dir=tmp_path / "cdi"),
    )
    pools = PluginSettings().pools
    agent = Agent(config, pools=pools, dra=DraDriver(config, pools, None))
    await agent.discover("start")
    assert agent.dra is not None and "mlx5_3" in agent.dra.hcas()
    assert ("mlx5_3", 1) in (agent.node.health.in_service or ())
    assert [s.reason for s in agent.node.health.hcas["mlx5_3"].problems] == [PORT_DOWN]
