"""rdmaplane's configuration files: one versioned kind per component, all in this package.

    apiVersion: rdmaplane.io/v1alpha1
    kind: AgentConfig | DevicePluginConfig | SchedulerExtenderConfig | WebhookConfig |
          RdmaDeviceConfig

`load(path, AgentConfig)` reads and validates a file (`ConfigError`: one line naming the file
and the key); `render_defaults(kind)` is the documented default file of a kind. See `base` for
the rules and for how to add a section or a kind.
"""

from rdmaplane.config.agent import AgentConfig, HealthConfig, PublishConfig
from rdmaplane.config.base import (
    API_VERSION,
    KINDS,
    ConfigError,
    Kind,
    Section,
    load,
    parse,
    render_defaults,
)
from rdmaplane.config.deviceplugin import DevicePluginConfig, PoolConfig
from rdmaplane.config.dra import DraConfig, RdmaDeviceConfig
from rdmaplane.config.extender import SchedulerExtenderConfig
from rdmaplane.config.webhook import WebhookConfig

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
