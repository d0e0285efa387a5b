"""Kubelet device plugin for RDMA NICs (see docs/device-plugin.md).

Its config is `rdmaplane.config.DevicePluginConfig`; `resources` turns a topology into devices
and allocations, `server` speaks the kubelet's gRPC APIs for one pool, `plugin` ties the pools
together.
"""

from rdmaplane.deviceplugin.plugin import RdmaDevicePlugin, run_standalone

__all__ = ["RdmaDevicePlugin", "run_standalone"]
