"""`RdmaDeviceConfig`: the opaque configuration users put into ResourceClaims for the DRA
driver (docs/dra.md), read into `rdmaplane.dra.settings.DeviceConfig`. The driver's own
settings are the agent's (`AgentConfig.dra`)."""

from __future__ import annotations

from typing import Final

from rdmaplane.config.base import Kind
from rdmaplane.dra.settings import DeviceConfig

RDMA_DEVICE_CONFIG: Final = Kind(
    "RdmaDeviceConfig",
    DeviceConfig,
    docs="docs/dra.md",
    read_by="the DRA driver, from a ResourceClaim's opaque config",
)
