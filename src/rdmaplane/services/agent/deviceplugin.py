"""The embedded device plugin, as the agent sees it: fed topologies, asked what it offers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from rdmaplane.adapters.supervisor import Supervisor
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.services.agent.policy.inventory import Offered, offered_devices
from rdmaplane.services.deviceplugin.plugin import RdmaDevicePlugin


class EmbeddedPlugin:
    """`RdmaDevicePlugin` serving the kubelet from inside the agent; no discovery of its own."""

    def __init__(self, settings: PluginSettings, *, kubelet_dir: Path, dev_root: Path) -> None:
        self.plugin = RdmaDevicePlugin(settings, kubelet_dir=kubelet_dir, dev_root=str(dev_root))

    @property
    def resources(self) -> list[str]:
        return [p.resource_name for p in self.plugin.config.pools]

    def update(
        self, topo: NodeTopology, faults: Mapping[str, str], rails: Mapping[str, int]
    ) -> None:
        self.plugin.update(topo, faults, rails)

    def recheck(self) -> None:
        self.plugin.recheck()

    async def start(self, supervisor: Supervisor | None = None) -> None:
        """Serve; the registration tasks run under `supervisor` (the agent's), else the
        plugin's own."""
        await self.plugin.start(supervisor)

    async def stop(self) -> None:
        await self.plugin.stop()

    def offered(self) -> list[Offered]:
        """Every device the kubelet has been told about (gone ones stay, marked unhealthy)."""
        return offered_devices(server.manager for server in self.plugin.servers)

    def collect(self) -> Iterator[Metric]:
        """What the kubelet is told, by health and reason (a prometheus collector)."""
        devices = GaugeMetricFamily(
            "rdmaplane_device_plugin_devices",
            "Devices advertised to the kubelet, by health and why unhealthy",
            labels=["resource", "health", "reason"],
        )
        unusable = GaugeMetricFamily(
            "rdmaplane_device_plugin_unusable_devices",
            "1 for each device the plugin cannot hand out, with the reason",
            labels=["resource", "device", "hcas", "reason"],
        )
        for server in self.plugin.servers:
            resource = server.resource_name
            counts: Counter[tuple[str, str]] = Counter()
            for d in server.manager.devices:
                reason = d.problem.reason if d.problem else ""
                counts["Healthy" if d.healthy else "Unhealthy", reason] += 1
                if not d.healthy and not server.manager.shared:
                    unusable.add_metric([resource, d.id, ",".join(d.hcas), reason], 1)
            for (health, reason), n in sorted(counts.items()):
                devices.add_metric([resource, health, reason], n)
        yield devices
        yield unusable
