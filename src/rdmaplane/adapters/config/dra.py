"""`RdmaDeviceConfig`: the opaque configuration users put into ResourceClaims for the DRA
driver (docs/dra.md), read into `rdmaplane.core.settings.dra.DeviceConfig`. The driver's own
settings are the agent's (`AgentConfig.dra`)."""

from __future__ import annotations

from typing import Final

from rdmaplane.adapters.config.base import Kind
from rdmaplane.core.settings.dra import DeviceConfig

RDMA_DEVICE_CONFIG: Final = Kind(
    "RdmaDeviceConfig",
    DeviceConfig,
    docs="docs/dra.md",
    read_by="the DRA driver, from a ResourceClaim's opaque config",
)
