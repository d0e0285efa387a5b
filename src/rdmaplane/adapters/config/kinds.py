"""Every config kind, by name: what `rdmaplane config defaults|validate` and the docs test go
through, and what a file of the wrong kind is told reads it. `KIND_NAMES` costs nothing;
`kind(name)` imports that kind's module only (`config validate` of an AgentConfig does not
load the webhook's settings); `KINDS`, every kind, imports every component's settings."""

from __future__ import annotations

import importlib
from typing import Any, Final

from rdmaplane.adapters.config.base import Kind

# name → (module, attribute), in the order the docs list them
_WHERE: Final[dict[str, tuple[str, str]]] = {
    "AgentConfig": ("rdmaplane.adapters.config.agent", "AGENT_CONFIG"),
    "DevicePluginConfig": ("rdmaplane.adapters.config.deviceplugin", "DEVICE_PLUGIN_CONFIG"),
    "SchedulerExtenderConfig": ("rdmaplane.adapters.config.extender", "SCHEDULER_EXTENDER_CONFIG"),
    "WebhookConfig": ("rdmaplane.adapters.config.webhook", "WEBHOOK_CONFIG"),
    "RdmaDeviceConfig": ("rdmaplane.adapters.config.dra", "RDMA_DEVICE_CONFIG"),
}
KIND_NAMES: Final[tuple[str, ...]] = tuple(_WHERE)


def names() -> tuple[str, ...]:
    """Every kind's name (those registered in `KINDS`, once it is built, included)."""
    built = globals().get("KINDS")
    return tuple(built) if built is not None else KIND_NAMES


def kind(name: str) -> Kind[Any]:
    """The kind called `name` (a `KeyError` for a name not in `names()`)."""
    built = globals().get("KINDS")
    if built is not None and name in built:
        found: Kind[Any] = built[name]
        return found
    module, attribute = _WHERE[name]
    found = getattr(importlib.import_module(module), attribute)
    return found


def __getattr__(name: str) -> dict[str, Kind[Any]]:
    """`KINDS`: every kind by name, built once on first use (a new kind can be put in it)."""
    if name == "KINDS":
        built = {n: kind(n) for n in KIND_NAMES}
        globals()["KINDS"] = built
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
