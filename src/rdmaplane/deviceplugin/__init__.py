"""Kubelet device plugin for RDMA NICs (see docs/device-plugin.md).

`config` reads the config file, `resources` turns a topology into devices and allocations,
`server` speaks the kubelet's gRPC APIs for one pool, `plugin` ties the pools together.
"""

from rdmaplane.deviceplugin.config import ConfigError, PluginConfig, load_config, parse_config
from rdmaplane.deviceplugin.plugin import RdmaDevicePlugin, run_standalone

__all__ = [
    "ConfigError",
    "PluginConfig",
    "RdmaDevicePlugin",
    "load_config",
    "parse_config",
    "run_standalone",
]
