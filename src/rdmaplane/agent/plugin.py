"""The embedded device plugin, as the agent sees it: fed topologies, asked what it offers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rdmaplane.agent.inventory import Offered
from rdmaplane.config import DevicePluginConfig
from rdmaplane.deviceplugin.plugin import RdmaDevicePlugin
from rdmaplane.model import NodeTopology


class EmbeddedPlugin:
    """`RdmaDevicePlugin` serving the kubelet from inside the agent; no discovery of its own."""

    def __init__(self, config: DevicePluginConfig, *, kubelet_dir: Path, dev_root: Path) -> None:
        self.plugin = RdmaDevicePlugin(config, kubelet_dir=kubelet_dir, dev_root=str(dev_root))

    @property
    def resources(self) -> list[str]:
        return [p.resource_name for p in self.plugin.config.pools]

    def update(self, topo: NodeTopology, faults: Mapping[str, str]) -> None:
        self.plugin.update(topo, faults)

    async def start(self) -> None:
        await self.plugin.start()

    async def stop(self) -> None:
        await self.plugin.stop()

    def offered(self) -> list[Offered]:
        """Every device the kubelet has been told about (gone ones stay, marked unhealthy)."""
        return [
            Offered(server.manager.pool.resource_name, d.id, d.hcas, server.manager.shared)
            for server in self.plugin.servers
            for d in server.manager.devices
        ]
