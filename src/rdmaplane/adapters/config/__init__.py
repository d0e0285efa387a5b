"""rdmaplane's configuration files: one versioned kind per component, read straight into that
component's frozen settings dataclasses (each setting is defined once, there).

    apiVersion: rdmaplane.io/v1alpha1
    kind: AgentConfig | DevicePluginConfig | SchedulerExtenderConfig | WebhookConfig |
          RdmaDeviceConfig

`load(path, AGENT_CONFIG)` reads and validates a file (`ConfigError`: one line naming the file
and the key) into `AgentSettings`; `render_defaults(kind)` is the documented default file of a
kind. Each kind is a `Kind` in its own module (`config.agent.AGENT_CONFIG`, ...), so a command
imports the settings of the kinds it reads and no others; `config.kinds.KINDS` holds them all.
This package imports the components' settings modules and the core they use, never a service.
"""

from __future__ import annotations

from rdmaplane.adapters.config.base import (
    API_VERSION,
    ConfigError,
    Kind,
    load,
    parse,
    render_defaults,
)

__all__ = ["API_VERSION", "ConfigError", "Kind", "load", "parse", "render_defaults"]
