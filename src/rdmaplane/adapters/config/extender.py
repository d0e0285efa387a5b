"""`SchedulerExtenderConfig`: how the extender scores (`rdmaplane scheduler-extender --config`,
`rdmaplane explain-placement --config`; docs/scheduler-extender.md), read into
`rdmaplane.core.settings.scheduler.ExtenderSettings`."""

from __future__ import annotations

from typing import Final

from rdmaplane.adapters.config.base import Kind
from rdmaplane.core.settings.scheduler import ExtenderSettings

SCHEDULER_EXTENDER_CONFIG: Final = Kind(
    "SchedulerExtenderConfig",
    ExtenderSettings,
    docs="docs/scheduler-extender.md",
    read_by="rdmaplane scheduler-extender --config and rdmaplane explain-placement --config",
)
