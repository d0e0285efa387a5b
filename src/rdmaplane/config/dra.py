"""The DRA driver's settings (`AgentConfig.dra`, read by `rdmaplane dra-driver`) and the opaque
configuration users put into ResourceClaims for it (`RdmaDeviceConfig`); docs/dra.md.

The driver is a mode of the node agent: the agent serves either the device plugin or the DRA
driver, never both, so one process owns each HCA's kubelet-facing side.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from rdmaplane.config.base import Kind, Section
from rdmaplane.config.deviceplugin import NcclConfig

DEFAULT_DRIVER = "rdma.rdmaplane.io"
# A DRA driver name is a DNS subdomain of at most 63 characters (ResourceSlice validation).
_DRIVER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

Effect = Literal["NoExecute", "NoSchedule", "None", "off"]


class DraTaintConfig(Section):
    """The taint a device gets in its ResourceSlice while its port has a fault (key
    `rdmaplane.io/rdma-unhealthy`, value the fault class). `off`: no taint for that class."""

    fatal: Effect = Field(
        default="NoExecute",
        description="port down, HCA gone, fatal counters: NoExecute evicts pods not tolerating it",
    )
    degraded: Effect = Field(default="off", description="error counters over the health thresholds")


class DraConfig(Section):
    """The DRA driver: ResourceSlices for this node, the kubelet plugin, CDI specs per claim."""

    enabled: bool = Field(
        default=False,
        description="serve DRA instead of the device plugin (needs devicePluginEnabled: false)",
    )
    driver_name: str = Field(
        default=DEFAULT_DRIVER, description="the DRA driver (DeviceClass selectors name it)"
    )
    plugin_dir: Path | None = Field(
        default=None,
        description="null: <kubeletDir>/plugins/<driverName> (socket, checkpoint)",
    )
    cdi_dir: Path = Field(
        default=Path("/var/run/cdi"), description="where per-claim CDI specs go (created)"
    )
    taints: DraTaintConfig = Field(
        default_factory=DraTaintConfig, description="device taints for faults"
    )

    @field_validator("driver_name")
    @classmethod
    def _dns_subdomain(cls, v: str) -> str:
        if len(v) > 63 or not _DRIVER_NAME.match(v):
            raise ValueError(
                f"{v!r} is not a DRA driver name (a DNS subdomain of at most 63 characters, "
                "e.g. rdma.rdmaplane.io)"
            )
        return v


class RdmaDeviceConfig(Kind):
    """Opaque configuration for the driver in a ResourceClaim or DeviceClass
    (`spec.devices.config[].opaque.parameters`, driver `rdma.rdmaplane.io`): overrides the
    pool's NCCL/UCX settings for the claim's RDMA devices."""

    docs = "docs/dra.md"
    read_by = "the DRA driver, from a ResourceClaim's opaque config"

    kind: Literal["RdmaDeviceConfig"] = "RdmaDeviceConfig"
    nccl: NcclConfig | None = Field(
        default=None, description="null: the settings of the pool each device belongs to"
    )
