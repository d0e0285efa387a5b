"""`DevicePluginConfig`: the device plugin's pools (`rdmaplane device-plugin --config`, the
agent's `devicePluginConfig`; docs/device-plugin.md), read into
`rdmaplane.core.settings.deviceplugin.PluginSettings`.

A file without apiVersion/kind but with a top-level `configList` is read as the shared RDMA
device plugin's config (k8s-rdma-shared-dev-plugin), unchanged: each entry becomes a shared pool
`<resourcePrefix>/<resourceName>` with `rdmaHcaMax` slots.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final

from rdmaplane.adapters.config.base import API_VERSION, ConfigError, Kind, validate
from rdmaplane.core.settings import key_of
from rdmaplane.core.settings.deviceplugin import PluginSettings


# The shared RDMA device plugin's format: a file's schema only, never settings of ours.
@dataclass(frozen=True, slots=True)
class _LegacySelectors:
    vendors: tuple[str, ...] = ()
    device_ids: tuple[str, ...] = field(default=(), metadata={"alias": "deviceIDs"})
    drivers: tuple[str, ...] = ()
    if_names: tuple[str, ...] = ()
    link_types: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _LegacyEntry:
    resource_name: str
    rdma_hca_max: int = field(metadata={"ge": 1})
    resource_prefix: str = "rdma"
    selectors: _LegacySelectors = field(default_factory=_LegacySelectors)
    devices: tuple[str, ...] = ()  # the old plugin's shorthand for selectors.ifNames


@dataclass(frozen=True, slots=True)
class _LegacyConfig:
    config_list: tuple[_LegacyEntry, ...] = field(metadata={"min_length": 1})
    periodic_update_interval: float = 60.0


def read_shared_plugin_config(doc: Mapping[str, object], source: str) -> dict[str, object]:
    """The shared RDMA device plugin's `configList` file, in the versioned shape (validated
    as a DevicePluginConfig next)."""
    if "configList" not in doc:
        said = DEVICE_PLUGIN_CONFIG.lacks_version(source)
        raise ConfigError(f"{said}, or give the shared RDMA plugin's configList")
    legacy = validate(_LegacyConfig, doc, f"{source}: ")
    pools: list[dict[str, Any]] = []
    for e in legacy.config_list:
        # the same keys as our selectors'
        selectors = {key_of(f): list(getattr(e.selectors, f.name)) for f in fields(e.selectors)}
        selectors["ifNames"] += e.devices
        pools.append(
            {
                "resourceName": f"{e.resource_prefix}/{e.resource_name}",
                "mode": "shared",
                "slots": e.rdma_hca_max,
                "selectors": selectors,
            }
        )
    out: dict[str, object] = {"apiVersion": API_VERSION, "kind": "DevicePluginConfig"}
    out["pools"] = pools
    if legacy.periodic_update_interval > 0:  # 0 turned periodic updates off there
        out["healthPollInterval"] = legacy.periodic_update_interval
    return out


DEVICE_PLUGIN_CONFIG: Final = Kind(
    "DevicePluginConfig",
    PluginSettings,
    docs="docs/device-plugin.md",
    read_by="rdmaplane device-plugin --config, or the agent's devicePluginConfig",
    older_format=read_shared_plugin_config,
)
