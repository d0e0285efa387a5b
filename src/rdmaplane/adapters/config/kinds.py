"""Every config kind, by name: what `rdmaplane config defaults|validate` and the docs test go
through, and what a file of the wrong kind is told reads it. Importing it imports every
component's settings; a command reading one kind imports only that kind's module."""

from __future__ import annotations

from typing import Any, Final

from rdmaplane.adapters.config.agent import AGENT_CONFIG
from rdmaplane.adapters.config.base import Kind
from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG
from rdmaplane.adapters.config.dra import RDMA_DEVICE_CONFIG
from rdmaplane.adapters.config.extender import SCHEDULER_EXTENDER_CONFIG
from rdmaplane.adapters.config.webhook import WEBHOOK_CONFIG

KINDS: Final[dict[str, Kind[Any]]] = {
    k.name: k
    for k in (
        AGENT_CONFIG,
        DEVICE_PLUGIN_CONFIG,
        SCHEDULER_EXTENDER_CONFIG,
        WEBHOOK_CONFIG,
        RDMA_DEVICE_CONFIG,
    )
}
