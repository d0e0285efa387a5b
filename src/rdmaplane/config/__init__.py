"""rdmaplane's configuration files: one versioned kind per component, all in this package.

    apiVersion: rdmaplane.io/v1alpha1
    kind: AgentConfig | DevicePluginConfig | SchedulerExtenderConfig | WebhookConfig |
          RdmaDeviceConfig

`load(path, AgentConfig)` reads and validates a file (`ConfigError`: one line naming the file
and the key); `render_defaults(kind)` is the documented default file of a kind. See `base` for
the rules and for how to add a section or a kind.

Each kind's module is imported when one of its names is first used (`base.KIND_MODULES`), so
a command builds the validators of the kinds it reads and no others: `rdmaplane device-plugin`
starts without the agent's and the extender's models and what they import. `KINDS` holds every
kind (all are imported for it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rdmaplane.config.base import (
    API_VERSION,
    KIND_MODULES,
    ConfigError,
    Kind,
    Section,
    all_kinds,
    load,
    parse,
    render_defaults,
)

if TYPE_CHECKING:
    from rdmaplane.config.agent import AgentConfig, HealthConfig, PublishConfig
    from rdmaplane.config.base import KINDS
    from rdmaplane.config.deviceplugin import DevicePluginConfig, PoolConfig
    from rdmaplane.config.dra import DraConfig, RdmaDeviceConfig
    from rdmaplane.config.extender import SchedulerExtenderConfig
    from rdmaplane.config.webhook import WebhookConfig

# The names of this package that are not kinds, by the module defining them.
_SECTIONS = {
    "HealthConfig": "rdmaplane.config.agent",
    "PublishConfig": "rdmaplane.config.agent",
    "PoolConfig": "rdmaplane.config.deviceplugin",
    "DraConfig": "rdmaplane.config.dra",
}

__all__ = [
    "API_VERSION",
    "KINDS",
    "AgentConfig",
    "ConfigError",
    "DevicePluginConfig",
    "DraConfig",
    "HealthConfig",
    "Kind",
    "PoolConfig",
    "PublishConfig",
    "RdmaDeviceConfig",
    "SchedulerExtenderConfig",
    "Section",
    "WebhookConfig",
    "load",
    "parse",
    "render_defaults",
]


def __getattr__(name: str) -> Any:
    if name == "KINDS":
        return all_kinds()
    module = KIND_MODULES.get(name) or _SECTIONS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
