"""Kubelet device plugin for RDMA NICs (see docs/device-plugin.md).

It runs on `settings.PluginSettings` (read from a DevicePluginConfig file by
`rdmaplane.adapters.config`);
`resources` turns a topology into devices and allocations, `server` speaks the kubelet's gRPC
APIs for one pool, `plugin` ties the pools together, `serve` is the standalone plugin's process.

The package itself imports nothing: the config package imports `settings` from here, and must
not load gRPC with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rdmaplane.services.deviceplugin.plugin import RdmaDevicePlugin, run_standalone

__all__ = ["RdmaDevicePlugin", "run_standalone"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rdmaplane.services.deviceplugin import plugin

        return getattr(plugin, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
